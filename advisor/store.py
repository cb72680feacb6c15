"""The advice store: probe runs (raw results kept for the newest, advisor.retention), fits, curves, observations and
their refits; :class:`Store`, the one object callers use, with links (advisor.links) and the probe job queue
(advisor.jobs) as parts of it.

Schema: advisor/migrations/ (one versioned SQL file per change). Every write that belongs
together (a probe run, its results, its fit and curve, and the job's final status) happens in
one transaction, so a crash leaves either all of it or none of it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from advisor.advice import CurvePoint
from advisor.curves import rebuild_outdated_curves, write_curve
from advisor.db import DEFAULT_POOL_SIZE, Database, Tx
from advisor.destinations import Destination
from advisor.freshness import evidence_at as newest_evidence_at
from advisor.idempotency import KeyedRequest
from advisor.jobs import ANSWERED_JOB, HELD_ATTEMPT, Job, JobQueue
from advisor.limits import MAX_SITE_LINKS
from advisor.links import Links, advised, same_control
from advisor.observations import RECORD_COLUMNS as OBSERVATION_COLUMNS, Observation
from probes.result import ProbeResult

Clock = Callable[[], float]
# A test hook (tests/advisor/test_commit_atomic.py), read when a Store is made: when set, record_run
# names each step of its transaction on stderr and then pauses there, for that many seconds, or, set
# to "stdin", until a line arrives on stdin; so a test can kill the process inside the transaction,
# at a known step or at random moments. No effect when unset or empty.
RECORD_RUN_PAUSE_ENV = "TAME_TEST_RECORD_RUN_PAUSE_S"
# An observation refits on at most this many observations (the newest since the newest probe run);
# retention (advisor/retention.py) always keeps at least these.
REFIT_OBSERVATIONS = 200
# Locks an observation's refit takes its link's turn from (Store.add_observation): links share one when they hash alike.
_REFIT_TURN_STRIPES = 64


@dataclass(frozen=True)
class FitRow:
    """A fit of a link (src, dest) as stored; read as the link's current one (the view current_fits), the fit on
    its newest probes."""

    id: int
    dest: str
    model: str
    params: dict[str, float]
    regime: str
    warnings: list[str]
    probe_streams: list[float]
    probes: list[dict[str, float]]
    observations_used: int
    idle_rtt_s: float | None
    n_max: int
    fitted_at: float
    probed_at: float
    record: dict[str, Any] | None = None  # the fit's own record (NULL for fits stored before)
    congestion_control: str | None = None  # the probes' control (NULL: not recorded, stored before)
    src: str = ""  # the site the probes ran from

    @property
    def evidence_at(self) -> float:
        """Unix seconds of the newest evidence behind the fit, which its freshness is judged by: the probes', or
        for a fit refitted on finished transfers the newest transfer's (a link with recent transfers needs no probe)."""
        return newest_evidence_at(self.probed_at, self.fitted_at, self.observations_used)

@dataclass(frozen=True)
class NewFit:
    """A fit to store: the record from advisor.fitcodec plus its curve (streams, throughput, impact, advisable)."""

    record: dict[str, Any]
    curve: Sequence[tuple[CurvePoint, bool]]
    probes: list[dict[str, float]]
    observations_used: int
    idle_rtt_s: float | None
    n_max: int
    probed_at: float
    congestion_control: str | None = None
    curve_version: int | None = None  # the advisor.tame.CURVE_VERSION the curve was computed under (None: not known)


@dataclass(frozen=True)
class _RefitWindow:
    """The observations an observation's refit reads: a link's standard ones under its control since its base run."""

    where: str  # SQL on observations
    params: tuple
    since: float  # observed_at from (Unix seconds)
    limit: int
    base_run: "BaseRun | None"
    or_unrecorded: bool  # the observation's control is the service's default (advisor.links.advised)

    @classmethod
    def of(cls, observation: Observation, base_run: "BaseRun | None", limit: int,
           or_unrecorded: bool) -> "_RefitWindow":
        where, params = same_control("congestion_control", observation.congestion_control)
        if base_run is not None and base_run.congestion_control is None and observation.congestion_control is not None:
            # The refit rests on a run that did not record its control (taken as this one's, the default):
            # the observations stored beside it did not record theirs either, and count too.
            where = f"({where} OR congestion_control IS NULL)"
        return cls(where, tuple(params), 0.0 if base_run is None else base_run.finished_at, limit, base_run,
                   or_unrecorded)

    def _select(self, columns: str) -> str:
        return (f"SELECT {columns} FROM observations WHERE destination_id = ? AND {self.where} AND observed_at >= ? "
                "AND tame_streams = 0 ORDER BY id DESC LIMIT ?")

    def ids(self, tx: Tx, destination_id: int) -> tuple[int, ...]:
        """The ids of the window's observations, newest first."""
        rows = tx.execute(self._select("id"), (destination_id, *self.params, self.since, self.limit)).fetchall()
        return tuple(r[0] for r in rows)

    def read(self, tx: Tx, destination_id: int, limit: int) -> tuple[tuple[int, ...], list[dict[str, Any]]]:
        """(ids, observations as ``refit`` takes them) of the newest ``limit`` in the window, newest first."""
        rows = tx.execute(self._select("id, streams, throughput_bps, duration_s, stream_bps, stream_retransmits"),
                          (destination_id, *self.params, self.since, limit)).fetchall()
        return tuple(r[0] for r in rows), [self._reported(*r[1:]) for r in rows]

    @staticmethod
    def _reported(streams, throughput_bps, duration_s, stream_bps: str | None,
                  stream_retransmits: str | None) -> dict[str, Any]:
        return {"streams": streams, "throughput_bps": throughput_bps, "duration_s": duration_s,
                "stream_bps": _from_json_list(stream_bps), "stream_retransmits": _from_json_list(stream_retransmits)}

    def reported(self, observation: Observation) -> dict[str, Any]:
        """``observation`` as :meth:`read` gives it back once stored."""
        record = observation.to_record()
        return self._reported(record["streams"], record["throughput_bps"], record["duration_s"],
                              record["stream_bps"], record["stream_retransmits"])


@dataclass(frozen=True)
class BaseRun:
    """A link's newest probe run with results under one control (or the run the advice under the default control
    rests on, advisor.links.advised): what an observation's refit rests on."""

    id: int
    probed_at: float  # Unix seconds when its probes ended (its fit's probed_at): the refit's probes are as old
    finished_at: float  # when the store took it: observations from then on came after it
    idle_rtt_s: float | None
    # [{streams, throughput_bps, rtt_mean_s, retransmits, duration_s, mss_bytes, stream_bps, stream_retransmits}];
    # the per-stream lists are tuples, empty where the run did not store them.
    points: list[dict[str, Any]]
    congestion_control: str | None = None  # the control the run recorded (None: none)


class ReusedProbeGone(Exception):
    """The probe a run was to re-use (Store.record_run's ``reused_probe_id``) is no longer stored: fit it without."""


@dataclass(frozen=True)
class StoredRun:
    """A probe run as :meth:`Store.record_run` stored it."""

    id: int
    probed_at: float  # when its probes ended
    fitted: bool  # a fit of it was stored
    # When its fit was kept as history, not made current: the probed_at of the link's current fit under the run's
    # control, newer than this run's probes (a run delivered late). None: its fit is current, or it has none.
    newer_probed_at: float | None = None
    congestion_control: str | None = None  # the control the run and its fit are kept under (None: not recorded)

    @property
    def current(self) -> bool:
        """Its fit is the link's current fit under its control (the advice, the views, /v1/paths)."""
        return self.fitted and self.newer_probed_at is None

    def history_note(self) -> str | None:
        """Why its fit is not current (None when it is, or there is none)."""
        if self.newer_probed_at is None:
            return None
        return (f"kept as history: the link's current advice under this control rests on probes "
                f"{self.newer_probed_at - self.probed_at:.0f} s newer than this run's, and stays")


_FIT_COLUMNS = ("id, dest, model, params_json, regime, warnings_json, probe_streams_json, probes_json, "
                "observations_used, idle_rtt_s, n_max, fitted_at, probed_at, record_json, congestion_control, src")


def _fit(row) -> FitRow:
    return FitRow(row[0], row[1], row[2], json.loads(row[3]), row[4], json.loads(row[5]), json.loads(row[6]),
                  json.loads(row[7]), row[8], row[9], row[10], row[11], row[12],
                  json.loads(row[13]) if row[13] else None, row[14], row[15])


# A link's newest probe run with results under a control ({link}: the link's WHERE on d, {control}: the control's on
# r): the one on the newest probes, so a run an agent held back is not newer for reaching the store later; the newest
# stored among equals. (id, probed_at, finished_at, idle_rtt_s).
def run_probed_at(run: str) -> str:
    """SQL for when the probes of probe run ``run`` (its alias) ended: probed_at, or finished_at for a run stored
    before runs kept it."""
    return f"coalesce({run}.probed_at, {run}.finished_at)"


def run_is_newer(newer: str, than: str) -> str:
    """SQL true when probe run ``newer`` (an alias) comes after run ``than`` in the order _NEWEST_RUN takes: newer
    probes, or the same probes stored later."""
    return (f"({run_probed_at(newer)} > {run_probed_at(than)} OR "
            f"({run_probed_at(newer)} = {run_probed_at(than)} AND {newer}.id > {than}.id))")


_NEWEST_RUN = (f"SELECT r.id, {run_probed_at('r')}, r.finished_at, r.idle_rtt_s FROM probe_runs r "
               "JOIN destinations d ON d.id = r.destination_id WHERE {link} AND {control} "
               "AND EXISTS (SELECT 1 FROM probe_results p WHERE p.probe_run_id = r.id) "
               f"ORDER BY {run_probed_at('r')} DESC, r.id DESC LIMIT 1")  # the order run_is_newer tests


def _newest_run(tx: Tx, link: str, link_params: Sequence[Any], control: str | None):
    """The row of :data:`_NEWEST_RUN` for the link ``link`` (SQL on ``d``) under ``control``, or None."""
    where, params = same_control("r.congestion_control", control)
    return tx.execute(_NEWEST_RUN.format(link=link, control=where), (*link_params, *params)).fetchone()


def _advised_run(tx: Tx, link: str, link_params: Sequence[Any], control: str | None, or_unrecorded: bool):
    """(the row of :data:`_NEWEST_RUN`, its control) the advice under ``control`` rests on, of the newest run under
    it and, with ``or_unrecorded`` (``control`` is the service's default), the newest that recorded none, as
    :func:`advisor.links.advised` takes fits; or None."""
    controls = (control, None) if or_unrecorded and control is not None else (control,)
    runs = [(held, row[1], (row, held)) for held in controls
            if (row := _newest_run(tx, link, link_params, held)) is not None]
    return advised(runs, control, control if or_unrecorded else None)


# A probe result's stored columns, in the order record_run writes them.
_PROBE_COLUMNS = ("streams, throughput_bps, sender_bps, retransmits, rtt_mean_s, duration_s, omit_s, "
                  "throughput_stderr_bps, started_at, raw, mss_bytes, stream_bps, stream_retransmits")
_PROBE_VALUES = ", ".join("?" * len(_PROBE_COLUMNS.split(", ")))
# What a fit reads back of a stored probe (_point).
_POINT_COLUMNS = "streams, throughput_bps, rtt_mean_s, retransmits, duration_s, mss_bytes, stream_bps, stream_retransmits"


def _point(row) -> dict[str, Any]:
    """A stored probe (a row of _POINT_COLUMNS) as a fit reads it: the per-stream lists as tuples."""
    names = ("streams", "throughput_bps", "rtt_mean_s", "retransmits", "duration_s", "mss_bytes")
    return {**dict(zip(names, row[:6])), "stream_bps": _from_json_list(row[6]),
            "stream_retransmits": _from_json_list(row[7])}


def _json_list(values: Sequence[float]) -> str | None:
    """A per-stream list as stored (a JSON array), or NULL when the driver gave none."""
    return json.dumps(list(values)) if values else None


def _from_json_list(text: str | None) -> tuple:
    """A stored per-stream list back as a tuple (empty for NULL)."""
    return tuple(json.loads(text)) if text else ()


def _step_pause(env=os.environ) -> Callable[[str], None]:
    """The record_run step hook RECORD_RUN_PAUSE_ENV asks for (a no-op when it is unset)."""
    text = env.get(RECORD_RUN_PAUSE_ENV)
    if not text:
        return lambda step: None
    seconds = None if text == "stdin" else float(text)

    def pause(step: str) -> None:
        sys.stderr.write(f"record_run step {step}\n")
        sys.stderr.flush()
        if seconds is None:
            sys.stdin.readline()
        else:
            time.sleep(seconds)

    return pause


class Store(Links, JobQueue):
    """All reads and writes of the advice store. ``clock`` gives Unix seconds. Links and their controls are
    :class:`advisor.links.Links`' part of it, the probe job queue :class:`advisor.jobs.JobQueue`'s."""

    def __init__(self, db: Database, clock: Clock = time.time):
        self.db = db
        self.clock = clock
        self._step = _step_pause()
        # An observation's refit is computed before its write transaction (add_observation): writers in this
        # process to one link take turns (a lock per link, striped), else each one's early refit is undone by the
        # one stored before it and computed again inside the write lock.
        self._refit_turns = [threading.Lock() for _ in range(_REFIT_TURN_STRIPES)]

    @classmethod
    def open(cls, url: str, clock: Clock = time.time, pool_size: int = DEFAULT_POOL_SIZE,
             create: bool = True) -> "Store":
        """The store at ``url``, migrated; ``create``: make a SQLite store that is not there (else StoreError)."""
        db = Database(url, pool_size, create=create)
        db.migrate()
        # Curves written by an older program than this one's stored_curve: the view must give this one's advice.
        rebuild_outdated_curves(db)
        return cls(db, clock)

    def close(self) -> None:
        self.db.close()

    # -- fits -----------------------------------------------------------------------------

    def _insert_fit(self, tx: Tx, destination_id: int, probe_run_id: int | None, fit: NewFit,
                    step: Callable[[str], None] = lambda step: None) -> int:
        rec = fit.record
        fit_id = tx.execute(
            "INSERT INTO fits (destination_id, probe_run_id, model, params_json, regime, warnings_json, "
            "probe_streams_json, probes_json, observations_used, idle_rtt_s, n_max, fitted_at, probed_at, "
            "record_json, congestion_control, curve_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "RETURNING id",
            (destination_id, probe_run_id, rec["model"], json.dumps(rec["params"]), rec["regime"],
             json.dumps(rec["warnings"]), json.dumps(rec["probe_streams"]), json.dumps(fit.probes),
             fit.observations_used, fit.idle_rtt_s, fit.n_max, self.clock(), fit.probed_at,
             json.dumps(rec["fit"]), fit.congestion_control, fit.curve_version),
        ).fetchone()[0]
        step("fit")
        write_curve(tx, fit_id, fit.curve, halfway=lambda: step("curve"))
        return fit_id

    def current_fit(self, dest_key: str, control: str | None = None, or_unrecorded: bool = False, *,
                    src: str) -> FitRow | None:
        """The link's current fit under ``control`` (None: the fits that did not record one): the one on the newest
        probes, the newest stored among equals; with ``or_unrecorded`` (``control`` is the service's default), the
        one :func:`advisor.links.advised` takes of that and the current one of those that did not record one."""
        where, params = same_control("congestion_control", control)
        if or_unrecorded and control is not None:
            where = f"({where} OR congestion_control IS NULL)"
        with self.db.transaction() as tx:
            rows = tx.execute(f"SELECT {_FIT_COLUMNS} FROM current_fits WHERE src = ? AND dest = ? AND {where}",
                              (src, dest_key, *params)).fetchall()
        fits = [_fit(row) for row in rows]
        return advised(((fit.congestion_control, fit.probed_at, fit) for fit in fits), control,
                       control if or_unrecorded else None)

    def current_fit_ids(self, dest_key: str, *, src: str) -> tuple[int, ...]:
        """The ids of the link's current fits under every control (a cheap check that nothing was
        written since: the advice under one control names what the others' fits would do). Not just the
        newest id: on PostgreSQL a fit may commit after one with a higher id."""
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT id FROM current_fits WHERE src = ? AND dest = ? ORDER BY id",
                              (src, dest_key)).fetchall()
        return tuple(row[0] for row in rows)

    def current_fits(self, dest_key: str | None = None, *, src: str | None = None) -> list[FitRow]:
        """The current fit (on the newest probes) of each (link, control): of the links from ``src`` when it is
        given, to ``dest_key`` when it is given."""
        conditions = [(column, value) for column, value in (("src", src), ("dest", dest_key)) if value is not None]
        where = ("WHERE " + " AND ".join(f"{column} = ?" for column, _ in conditions)) if conditions else ""
        with self.db.transaction() as tx:
            rows = tx.execute(f"SELECT {_FIT_COLUMNS} FROM current_fits {where} "
                              "ORDER BY src, dest, coalesce(congestion_control, ''), id",
                              [value for _, value in conditions]).fetchall()
        return [_fit(row) for row in rows]

    def curve(self, fit_id: int) -> list[tuple[CurvePoint, bool]]:
        with self.db.transaction() as tx:
            rows = tx.execute(
                "SELECT streams, throughput_bps, impact, impact_bound, advisable FROM curve_points "
                "WHERE fit_id = ? ORDER BY streams",
                (fit_id,),
            ).fetchall()
        return [(CurvePoint(r[0], r[1], r[2], r[3]), bool(r[4])) for r in rows]

    def record_run(self, dest: Destination, *, src: str, source: str, idle_rtt_s: float | None,
                   results: Sequence[ProbeResult], started_at: float, fit: NewFit | None,
                   job_id: str | None = None, job_error: str | None = None, address: str | None = None,
                   congestion_control: str | None = None, job_owner: str | None = None,
                   max_links: int = MAX_SITE_LINKS, request: KeyedRequest | None = None,
                   answer: Callable[[StoredRun], dict[str, Any]] | None = None,
                   probed_at: float | None = None, reused_probe_id: int | None = None) -> StoredRun:
        """Store a finished probe run from site ``src``, its results and fit, and close its job, in one transaction
        (a run that would be a new link past ``max_links``: TooManyLinks, nothing stored). With ``request`` (a
        client's Idempotency-Key) the key is claimed first (AlreadyTaken when an earlier request stored it: nothing
        stored) and ``answer(the stored run)`` kept with it.

        A link's current fit under a control is the one on the newest probes (the current_fits view): a run whose
        probes are older than the current fit's (delivered late, from an agent's spool) is stored, its fit kept as
        history, and its job closed as any other; :attr:`StoredRun.newer_probed_at` says so.

        ``reused_probe_id``: a probe of an earlier run this one re-uses (its job's, :meth:`choose_reuse`), stored again
        with the run, marked as re-used, and kept as the job's reuse_probe_id (None: the job re-used none); gone from
        the store by now: ReusedProbeGone, nothing stored. ``probed_at``: when the probes ended (None: now), kept with the run as its fit's is, so a refit on it later
        (:meth:`latest_run_points`) is dated by its probes, not by when the run reached the store (finished_at).
        ``address`` is the IP address the probes went to, when the service resolved it itself;
        ``congestion_control`` the control the probes' streams used (None: not known). With ``job_owner`` the job
        is closed only while that owner holds it as a probe of this link, or it is back in the queue (an agent's claim:
        a run whose lease went to another agent is stored, and the other agent's job stays open; :data:`ANSWERED_JOB`)."""
        step = self._step
        with self.db.transaction(write=True) as tx:
            step("begin")
            if request is not None:
                request.claim(tx, self.clock())
            destination_id = self.link_id(tx, src, dest, max_links)
            self.check_link_control(tx, destination_id, congestion_control, src, dest.key)
            step("destination")
            now = self.clock()
            run_id = tx.execute(
                "INSERT INTO probe_runs (destination_id, job_id, source, idle_rtt_s, started_at, finished_at, address, "
                "congestion_control, probed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (destination_id, job_id, source, idle_rtt_s, started_at, now, address, congestion_control,
                 now if probed_at is None else probed_at),
            ).fetchone()[0]
            for r in results:
                tx.execute(
                    f"INSERT INTO probe_results (probe_run_id, {_PROBE_COLUMNS}) VALUES (?, {_PROBE_VALUES})",
                    (run_id, r.streams, r.throughput_bps, r.sender_bps, r.retransmits, r.rtt_mean_s, r.duration_s,
                     r.omit_s, r.throughput_stderr_bps, r.started_at, r.raw, r.mss_bytes,
                     _json_list(r.stream_bps), _json_list(r.stream_retransmits)),
                )
                step("result")
            if reused_probe_id is not None:
                # A copy, so the run holds every probe its fit rests on, whatever retention does with the original.
                copied = tx.execute(f"INSERT INTO probe_results (probe_run_id, {_PROBE_COLUMNS}, reused_from) "
                                    f"SELECT ?, {_PROBE_COLUMNS}, id FROM probe_results WHERE id = ? RETURNING id",
                                    (run_id, reused_probe_id)).fetchone()
                if copied is None:  # gone since the fit read it (retention): nothing stored, the fit is made again
                    raise ReusedProbeGone(f"probe {reused_probe_id}, to be re-used, is no longer stored")
            newer = None
            if fit is not None:
                self._insert_fit(tx, destination_id, run_id, fit, step)
                where, params = same_control("congestion_control", fit.congestion_control)
                (newer,) = tx.execute(
                    f"SELECT max(probed_at) FROM fits WHERE destination_id = ? AND {where} AND probed_at > ?",
                    (destination_id, *params, fit.probed_at)).fetchone()
            stored = StoredRun(run_id, now if probed_at is None else probed_at, fit is not None, newer,
                               congestion_control)
            if job_id is not None:
                held, held_params = ("", ()) if job_owner is None else (
                    f" AND {ANSWERED_JOB}", (job_owner, src, dest.key))
                # A queued job answered late: its lapsed attempt's seconds are in spent_attempts, not counted again.
                tx.execute(
                    "UPDATE probe_jobs SET status = ?, finished_at = ?, progress = 1, error = ?, probe_run_id = ?, "
                    "started_at = CASE WHEN status = 'queued' THEN NULL ELSE started_at END, reuse_probe_id = ?, "
                    f"owner = NULL, lease_until = NULL WHERE id = ?{held}",
                    ("failed" if job_error else "done", self.clock(), job_error, run_id, reused_probe_id, job_id,
                     *held_params),
                )
            step("job")
            if request is not None:
                request.remember(tx, run_id, answer(stored))
        return stored

    def choose_reuse(self, job: Job, owner: str, control: str | None, within_s: float) -> int | None:
        """Settle whether running job ``job``, held by ``owner``, re-uses the adaptive probe of its link's last probing
        under ``control`` instead of measuring that level again: the link's newest run must be a job's that probed the
        same plan (its levels and probe duration) and measured one level more, all in it (it re-used none: so refreshes
        alternate between the whole plan and its fixed levels), and its probes ended at most ``within_s`` seconds ago
        (0: never re-use). Kept with the job (reuse_probe_id; cleared when there is none; nothing written when
        ``owner`` no longer holds it) and returned: that probe's id, or None."""
        with self.db.transaction(write=True) as tx:
            probe_id = None
            run = _newest_run(tx, "d.src = ? AND d.dest = ?", (job.src, job.dest), control) if within_s > 0 else None
            if run is not None and run[1] >= self.clock() - within_s:
                plan = tx.execute("SELECT j.levels_json, j.duration_s FROM probe_runs r "
                                  "JOIN probe_jobs j ON j.id = r.job_id WHERE r.id = ? AND j.status = 'done'",
                                  (run[0],)).fetchone()
                rows = tx.execute("SELECT id, streams, reused_from FROM probe_results WHERE probe_run_id = ?",
                                  (run[0],)).fetchall()
                same_plan = plan is not None and set(json.loads(plan[0])) == set(job.levels) and plan[1] == job.duration_s
                extra = [(streams, row_id) for row_id, streams, _ in rows if streams not in job.levels]
                measured = all(reused_from is None for _, _, reused_from in rows)
                holds_plan = set(job.levels) <= {streams for _, streams, _ in rows}
                if same_plan and measured and len(extra) == 1 and holds_plan:
                    probe_id = extra[0][1]
            updated = tx.execute(f"UPDATE probe_jobs SET reuse_probe_id = ? WHERE {HELD_ATTEMPT} RETURNING id",
                                 (probe_id, job.id, owner, job.src)).fetchone()
        return probe_id if updated is not None else None

    def probe_point(self, probe_id: int) -> dict[str, Any] | None:
        """Stored probe ``probe_id`` as :meth:`latest_run_points` gives a run's, or None when it is gone."""
        with self.db.transaction() as tx:
            row = tx.execute(f"SELECT {_POINT_COLUMNS} FROM probe_results WHERE id = ?", (probe_id,)).fetchone()
        return None if row is None else _point(row)

    def latest_run_points(self, dest_key: str, control: str | None = None, or_unrecorded: bool = False, *,
                          src: str) -> BaseRun | None:
        """The link's run with results on the newest probes under ``control`` (None: runs that did not record one),
        or None; with ``or_unrecorded`` (``control`` is the service's default), the one the advice rests on
        (:func:`_advised_run`)."""
        with self.db.transaction() as tx:
            advised_run = _advised_run(tx, "d.src = ? AND d.dest = ?", (src, dest_key), control, or_unrecorded)
            if advised_run is None:
                return None
            run, run_control = advised_run
            rows = tx.execute(f"SELECT {_POINT_COLUMNS} FROM probe_results WHERE probe_run_id = ? ORDER BY id",
                              (run[0],)).fetchall()
        return BaseRun(run[0], run[1], run[2], run[3], [_point(r) for r in rows], run_control)

    # -- observations ---------------------------------------------------------------------

    def add_observation(self, dest: Destination, observation: Observation,
                        refit: Callable[[list[dict[str, float]]], NewFit | None],
                        limit: int = REFIT_OBSERVATIONS, *, src: str,
                        or_unrecorded: bool = False, max_links: int = MAX_SITE_LINKS,
                        base_run: BaseRun | None = None, request: KeyedRequest | None = None,
                        answer: Callable[[int, int | None], dict[str, Any]] | None = None) -> tuple[int, int | None]:
        """Store an observation of a transfer from site ``src`` and, in the same transaction, the refit ``refit(observations)`` returns.

        ``base_run``: the run ``refit`` rests on (:meth:`latest_run_points`, read before this transaction, with
        ``or_unrecorded`` when the observation's control is the service's default); when the link's run on the
        newest probes (as latest_run_points takes it) is another one by then (one committed since), the refit would
        hide it behind older probes, so the observation is stored without one (the newer run's fit stands, and the next observation
        refits on it).

        ``refit`` gets the observations ({streams, throughput_bps, duration_s, stream_bps, stream_retransmits}; the
        lists empty where not reported) under the observation's congestion control that feed the fit (all
        streams standard: :attr:`Observation.feeds_fit`), stored since ``base_run`` reached the store (finished_at;
        those that recorded no control too when the run did not record its control), at most
        ``limit``, newest first, and returns the new fit or None. An observation that does not feed the fit, or has no
        ``base_run`` to refit on, is stored without calling it. Returns (the observation's id, the new fit's id or
        None). One that would be a new link past ``max_links`` is refused (TooManyLinks), nothing stored. With ``request`` (a client's
        Idempotency-Key) the key is claimed first (AlreadyTaken when an earlier request stored it: nothing stored)
        and ``answer(observation id, fit id)`` kept with it.

        The refit is computed before the write transaction, on the observations stored by then, and kept when the
        transaction finds the same ones (the write lock, the whole store's on SQLite, is held for the inserts, not
        for the fit); when another write came between, it is computed again inside the transaction. Writers in this
        process to one link take turns (early refit and write), so that is only when another process wrote it.
        """
        window = _RefitWindow.of(observation, base_run, limit, or_unrecorded)
        if not (observation.feeds_fit and base_run is not None):
            return self._store_observation(dest, observation, refit, window, None, src=src, max_links=max_links,
                                           request=request, answer=answer)
        # Taken before any transaction (none is held while waiting for it), released after the write's commit.
        with self._refit_turns[hash((src, dest.key)) % _REFIT_TURN_STRIPES]:
            early: tuple[tuple[int, ...], NewFit | None] | None = None
            with self.db.transaction() as tx:
                row = tx.execute("SELECT id FROM destinations WHERE src = ? AND dest = ?", (src, dest.key)).fetchone()
                if row is not None:
                    ids, rows = window.read(tx, row[0], window.limit - 1)
                    early = ids, refit([window.reported(observation), *rows])
            return self._store_observation(dest, observation, refit, window, early, src=src, max_links=max_links,
                                           request=request, answer=answer)

    def _store_observation(self, dest: Destination, observation: Observation,
                           refit: Callable[[list[dict[str, float]]], NewFit | None], window: "_RefitWindow",
                           early: tuple[tuple[int, ...], NewFit | None] | None, *, src: str, max_links: int,
                           request: KeyedRequest | None,
                           answer: Callable[[int, int | None], dict[str, Any]] | None) -> tuple[int, int | None]:
        with self.db.transaction(write=True) as tx:
            if request is not None:
                request.claim(tx, self.clock())
            ids = self._add_observation(tx, dest, observation, refit, window, early, src=src, max_links=max_links)
            if request is not None:
                request.remember(tx, ids[0], answer(*ids))
        return ids

    def _add_observation(self, tx: Tx, dest: Destination, observation: Observation,
                         refit: Callable[[list[dict[str, float]]], NewFit | None], window: "_RefitWindow",
                         early: tuple[tuple[int, ...], NewFit | None] | None, *, src: str,
                         max_links: int) -> tuple[int, int | None]:
        record = observation.to_record()
        destination_id = self.link_id(tx, src, dest, max_links)
        self.check_link_control(tx, destination_id, observation.congestion_control, src, dest.key)
        now = self.clock()
        observation_id = tx.execute(
            f"INSERT INTO observations (destination_id, observed_at, {', '.join(record)}) "
            f"VALUES (?, ?, {', '.join('?' for _ in record)}) RETURNING id",
            (destination_id, now, *record.values()),
        ).fetchone()[0]
        if not observation.feeds_fit or window.base_run is None:
            # No probe run to refit on: the window is not read (up to REFIT_OBSERVATIONS of 1024-stream lists, parsed
            # inside the write lock, for a refit that could not be made).
            return observation_id, None
        if tx.dialect == "postgresql":
            # Refits of one link from several processes (replicas) take turns from here to the commit: each one's
            # window then holds the observation the one before it stored, which one running beside it would not see
            # (each fit leaving out the other's). SQLite's write lock is the whole store's already.
            tx.execute("SELECT 1 FROM destinations WHERE id = ? FOR NO KEY UPDATE", (destination_id,))
        newest = _advised_run(tx, "d.id = ?", (destination_id,), observation.congestion_control, window.or_unrecorded)
        if newest is None or newest[0][0] != window.base_run.id:
            return observation_id, None
        if early is not None and window.ids(tx, destination_id) == (observation_id, *early[0]):
            fit = early[1]
        else:
            fit = refit(window.read(tx, destination_id, window.limit)[1])
        if fit is None:
            return observation_id, None
        self._step("observation refit")
        return observation_id, self._insert_fit(tx, destination_id, None, fit)

    def observation(self, observation_id: int) -> tuple[str, str, float, Observation] | None:
        """(source site, destination key, observed_at, observation) of a stored observation, or None."""
        with self.db.transaction() as tx:
            row = tx.execute(
                f"SELECT d.src, d.dest, o.observed_at, {', '.join('o.' + c for c in OBSERVATION_COLUMNS)} "
                "FROM observations o JOIN destinations d ON d.id = o.destination_id WHERE o.id = ?",
                (observation_id,),
            ).fetchone()
        if row is None:
            return None
        return row[0], row[1], row[2], Observation.from_record(dict(zip(OBSERVATION_COLUMNS, row[3:])))
