"""The advice store: destinations, probe jobs and runs (raw results kept for the newest, advisor.retention), fits, curves, observations.

Schema: advisor/migrations/ (one versioned SQL file per change). Every write that belongs
together (a probe run, its results, its fit and curve, and the job's final status) happens in
one transaction, so a crash leaves either all of it or none of it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from advisor.advice import CurvePoint
from advisor.curves import rebuild_outdated_curves, write_curve
from advisor.db import DEFAULT_POOL_SIZE, Database, Tx
from advisor.destinations import Destination
from advisor.errors import QueueFull, StoreError, TooManyControls, TooManyLinks, UnknownProbe
from advisor.idempotency import KeyedRequest
from advisor.limits import BUDGET_WINDOW_S, MAX_LINK_CONTROLS, MAX_SITE_LINKS
from advisor.observations import RECORD_COLUMNS as OBSERVATION_COLUMNS, Observation
from probes.result import ProbeResult

Clock = Callable[[], float]
ACTIVE = ("queued", "running")
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
# PostgreSQL advisory locks of the link count, one per site (the first of two keys; the migrations' lock is one key):
# two transactions adding a site's last allowed link must not both count one less than the cap and insert.
LINK_COUNT_LOCK = 7316
# The job a run pushed for a claim closes (parameters: owner, src, dest): the claim's holder's running job, or one
# back in the queue after its lease lapsed (the run came late, from the agent's spool say: the probe it asked for is
# done, and probing the link again would be traffic for nothing), a probe of that link. One another agent holds is not.
# A job its claim's holder still runs (parameters: job id, owner).
HELD_JOB = "id = ? AND owner = ? AND status = 'running'"
# An attempt its prober (a site's agent, this service's worker) holds at its job, a probe of a link from its site
# (parameters: job id, owner, src).
HELD_ATTEMPT = "id = ? AND owner = ? AND src = ? AND status = 'running'"
ANSWERED_JOB = "((status = 'running' AND owner = ?) OR (status = 'queued' AND attempts > 0)) AND src = ? AND dest = ?"
# The PostgreSQL advisory lock every claim of a probe job takes first (this service's worker and the sites' agents,
# advisor.sites.claim_job): a claim checks that no probe of the job's destination runs, from any site, and marks the
# job running; two claims at once from different sites would both see the destination idle.
CLAIM_LOCK = 7317
# A job whose destination's name lookup did not finish as it was to start (Store.defer_attempt) is not claimed again
# before the lookup's retry_after_s has passed, twice as long for each such time before (at most LOOKUP_RETRY_MAX_S),
# and the MAX_LOOKUP_WAITS-th such time fails it: with advisor.allowlist's 5 s, a name that never resolves in time is
# tried 12 times over about 2.4 hours (waits of 5 s, 10 s, ... 2560 s, then 3600 s), then its job fails, saying so.
LOOKUP_RETRY_MAX_S = 3600.0
MAX_LOOKUP_WAITS = 12
# A queued job ``{j}`` whose wait for its name lookup (above) is over, so it may be claimed (parameter: now).
LOOKUP_WAIT_OVER = "({j}.retry_at IS NULL OR {j}.retry_at <= ?)"
# The key of Tx.memo holding the link counts check_new_link keeps for the transaction.
_LINK_COUNTS = "site_link_counts"


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
        return max(self.probed_at, self.fitted_at) if self.observations_used else self.probed_at


@dataclass(frozen=True)
class Job:
    """A probe request and where it is in its life cycle."""

    id: str
    dest: str
    status: str
    levels: list[int]
    duration_s: float
    requested_at: float
    started_at: float | None
    finished_at: float | None
    progress: float
    attempts: int
    error: str | None
    probe_run_id: int | None
    progress_detail: dict[str, Any] | None = None
    address: str | None = None
    congestion_control: str | None = None  # the control to probe under (NULL: jobs queued before it was kept)
    src: str = ""  # the site whose prober runs it


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
    run_control: str | None
    base_run: "BaseRun | None"

    @classmethod
    def of(cls, observation: Observation, run_control: str | None, base_run: "BaseRun | None",
           limit: int) -> "_RefitWindow":
        where, params = same_control("congestion_control", observation.congestion_control)
        if run_control is None and observation.congestion_control is not None:
            # The refit rests on a run that did not record its control (taken as this one's, the default):
            # the observations stored beside it did not record theirs either, and count too.
            where = f"({where} OR congestion_control IS NULL)"
        return cls(where, tuple(params), 0.0 if base_run is None else base_run.finished_at, limit, run_control,
                   base_run)

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
    """A link's newest probe run with results under one control: what an observation's refit rests on."""

    id: int
    probed_at: float  # Unix seconds when its probes ended (its fit's probed_at): the refit's probes are as old
    finished_at: float  # when the store took it: observations from then on came after it
    idle_rtt_s: float | None
    # [{streams, throughput_bps, rtt_mean_s, retransmits, duration_s, mss_bytes, stream_bps, stream_retransmits}];
    # the per-stream lists are tuples, empty where the run did not store them.
    points: list[dict[str, Any]]


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


JOB_COLUMNS = ("id, dest, status, levels_json, duration_s, requested_at, started_at, finished_at, "
                "progress, attempts, error, probe_run_id, progress_detail, address, congestion_control, src")
_FIT_COLUMNS = ("id, dest, model, params_json, regime, warnings_json, probe_streams_json, probes_json, "
                "observations_used, idle_rtt_s, n_max, fitted_at, probed_at, record_json, congestion_control, src")


def job_from_row(row) -> Job:
    return Job(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], row[6], row[7], row[8], row[9],
               row[10], row[11], json.loads(row[12]) if row[12] else None, row[13], row[14], row[15])


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


def same_control(column: str, control: str | None) -> tuple[str, tuple]:
    """SQL (and its parameters) for ``column`` holding ``control``; None matches NULL (not recorded)."""
    if control is None:
        return f"{column} IS NULL", ()
    return f"{column} = ?", (control,)


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


def _boot_id() -> str:
    """This boot of the kernel ("" where /proc does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (/proc/PID/stat field 22); None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return -1  # exists but unreadable: cannot tell, treat as alive
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last one.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return -1


def process_owner() -> str:
    """host:pid:boot_id:start_ticks:nonce naming this process as the owner of the jobs it runs.

    A pid alone is reused (a restart inside a PID namespace is PID 1 again); the same pid with
    the same start time in the same boot of the same host is the same process.
    """
    pid = os.getpid()
    ticks = _start_ticks(pid)
    return (f"{socket.gethostname()}:{pid}:{_boot_id()}:{'' if ticks is None or ticks < 0 else ticks}:"
            f"{uuid.uuid4().hex[:8]}")


def _owner_is_dead_here(owner: str | None) -> bool:
    """True when ``owner`` (see :func:`process_owner`) was a process on this host that no longer runs.

    Another host's owner is never judged dead here (its lease decides). On this host, an owner
    from an earlier boot is dead; otherwise it is alive only if its pid exists and started when
    the owner says (a pid reused by another process, e.g. PID 1 of a restarted container, has
    another start time). Owners written before start times were recorded (host:pid:nonce) are
    judged by the pid alone. Limit: two live processes on one host name in different PID
    namespaces cannot see each other's pids, so each would judge the other dead; give each
    instance its own host name (containers do).
    """
    if not owner:
        return True
    parts = owner.split(":")
    if parts[0] != socket.gethostname() or len(parts) < 2 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if len(parts) == 5:
        _, _, boot, start, _ = parts
        here = _boot_id()
        if boot and here and boot != here:
            return True
        if start.isdigit():
            ticks = _start_ticks(pid)
            if ticks is None:
                return True
            return ticks >= 0 and ticks != int(start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False



def fail_job_in(tx: Tx, job_id: str, error: str, now: float) -> None:
    """Finish a queued or running job as failed with ``error``, inside the caller's transaction ``tx``. A queued job
    fails without running: a started_at left from a lapsed attempt (kept in spent_attempts) goes, or a site's budget
    would count the job's time in the queue as probing."""
    tx.execute("UPDATE probe_jobs SET status = 'failed', finished_at = ?, error = ?, owner = NULL, lease_until = NULL, "
               "started_at = CASE WHEN status = 'queued' THEN NULL ELSE started_at END "
               "WHERE id = ? AND status IN ('queued', 'running')", (now, error, job_id))


def lock_claims(tx: Tx) -> None:
    """Take the claims' lock (CLAIM_LOCK) for ``tx`` on PostgreSQL; SQLite runs one write transaction at a time."""
    if tx.dialect == "postgresql":
        tx.execute(f"SELECT pg_advisory_xact_lock({CLAIM_LOCK})")


def charge_attempt_in(tx: Tx, src: str, job_id: str, started_at: float, seconds: float) -> None:
    """Keep an attempt's ``seconds`` (from ``started_at``) in spent_attempts, where a site's hourly budget counts them."""
    tx.execute("INSERT INTO spent_attempts (src, job_id, started_at, seconds) VALUES (?, ?, ?, ?)",
               (src, job_id, started_at, max(0.0, seconds)))


def end_attempt_in(tx: Tx, held: str, held_params: Sequence[Any], *, job_id: str, src: str, attempts: int,
                   started_at: float | None, lease_until: float | None, now: float, max_attempts: int, gave_up: str,
                   requeued: str, requeued_at: float | None = None, counted: bool = True,
                   address: str | None = None) -> bool:
    """End a running job's attempt, inside ``tx``, if the job still matches ``held`` (a WHERE clause, its
    ``held_params``). The attempt stopped ``now``, or when its lease ran out if that was earlier (the longest it
    was allowed to send). It fails with ``gave_up`` (finished then, its seconds counted from its own row) when it
    was the ``max_attempts``-th, else goes back in the queue with ``requeued`` (behind the site's others when
    ``requeued_at`` is given; kept from probes of ``address`` while one runs) and the seconds it took from
    ``started_at`` (None: none to count) kept in spent_attempts, as a site's hourly budget counts them. An attempt
    not ``counted`` (handed back: its prober stopped, not the job) never gives up and is not one of the job's
    attempts. Returns whether the job matched."""
    stopped = now if lease_until is None else min(now, lease_until)
    if counted and attempts >= max_attempts:
        return tx.execute("UPDATE probe_jobs SET status = 'failed', finished_at = ?, owner = NULL, lease_until = NULL, "
                          f"error = ? WHERE {held} RETURNING id", (stopped, gave_up, *held_params)).fetchone() is not None
    behind, behind_params = ("requested_at = ?, ", (requeued_at,)) if requeued_at is not None else ("", ())
    uncount = "" if counted else "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, "
    done = tx.execute("UPDATE probe_jobs SET status = 'queued', progress = 0, progress_detail = NULL, owner = NULL, "
                      f"lease_until = NULL, address = ?, {behind}{uncount}error = ? WHERE {held} RETURNING id",
                      (address, *behind_params, requeued, *held_params)).fetchone() is not None
    if done and started_at is not None:
        charge_attempt_in(tx, src, job_id, started_at, stopped - started_at)
    return done


def _held_attempt(tx: Tx, job_id: str, owner: str, src: str, *more: str) -> tuple | None:
    """(attempts, started_at, lease_until, and the columns ``more``) of the attempt ``owner`` holds at its job
    (HELD_ATTEMPT), locked as read: a lease lapsing meanwhile (Store.recover_jobs) re-queues the job once, not under
    the caller's report too. None when it holds none."""
    lock = " FOR UPDATE" if tx.dialect == "postgresql" else ""
    columns = ", ".join(("attempts", "started_at", "lease_until", *more))
    return tx.execute(f"SELECT {columns} FROM probe_jobs WHERE {HELD_ATTEMPT}{lock}", (job_id, owner, src)).fetchone()


class Store:
    """All reads and writes of the advice store. ``clock`` gives Unix seconds."""

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

    # -- links --------------------------------------------------------------------------

    def link_id(self, tx: Tx, src: str, dest: Destination, max_links: int = MAX_SITE_LINKS) -> int:
        """The row id of the link from site ``src`` to ``dest`` (a row of ``destinations``), the row created if
        missing; safe against concurrent first writes. A new link is refused (TooManyLinks, nothing written) when
        ``src`` has ``max_links`` links already (:meth:`check_new_link`)."""
        # On PostgreSQL the row is held (KEY SHARE, as a foreign key's check holds it) until the transaction ends,
        # so pruning (advisor/retention.py) cannot remove a link a write has just found; one being removed is
        # waited for and then not found, and made again.
        held = " FOR KEY SHARE" if self.db.dialect == "postgresql" else ""
        select = f"SELECT id FROM destinations WHERE src = ? AND dest = ?{held}"
        row = tx.execute(select, (src, dest.key)).fetchone()
        if row:  # the common case, without an insert that would spend an id of the sequence
            return row[0]
        self.check_new_link(tx, src, dest.key, max_links)
        # Several transactions may miss the row at once (on PostgreSQL they run in parallel): the
        # upsert makes all but one wait for the winner's commit and do nothing, and the SELECT after
        # it (a new snapshot under READ COMMITTED) then sees that row.
        made = tx.execute(
            "INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (src, dest) DO NOTHING RETURNING id",
            (src, dest.key, dest.host, dest.port, self.clock()),
        ).fetchone()
        if made:
            return made[0]
        # Another transaction's row: whether this transaction's count of the site's links saw it is not known, so
        # the next new link counts them again.
        self._forget_link_count(tx, src)
        return tx.execute(select, (src, dest.key)).fetchone()[0]

    def _link_controls(self, tx: Tx, src: str, dest_key: str) -> list[str]:
        """The controls link (``src``, ``dest_key``) holds results under, and those of its queued and running probes
        (a probe queued under a new control holds its place, so its run is never refused after it ran)."""
        return sorted(r[0] for r in tx.execute(
            "SELECT lc.congestion_control FROM link_controls lc JOIN destinations d ON d.id = lc.destination_id "
            "WHERE d.src = ? AND d.dest = ? UNION SELECT congestion_control FROM probe_jobs WHERE src = ? AND dest = ? "
            "AND status IN ('queued', 'running') AND congestion_control IS NOT NULL",
            (src, dest_key, src, dest_key)).fetchall())

    def check_link_control(self, tx: Tx, destination_id: int, control: str | None, src: str, dest_key: str) -> None:
        """Record that link ``destination_id`` (``src`` to ``dest_key``) holds results under ``control`` (None: not
        recorded, no check); TooManyControls, and nothing of this transaction kept, when that would make more than
        MAX_LINK_CONTROLS, counting its queued and running probes' controls (:meth:`check_job_control`)."""
        held_already = "SELECT 1 FROM link_controls WHERE destination_id = ? AND congestion_control = ?"
        if control is None or tx.execute(held_already, (destination_id, control)).fetchone() is not None:
            return
        self.check_job_control(tx, src, dest_key, control)
        tx.execute("INSERT INTO link_controls (destination_id, congestion_control) VALUES (?, ?) "
                   "ON CONFLICT (destination_id, congestion_control) DO NOTHING", (destination_id, control))

    def check_job_control(self, tx: Tx, src: str, dest_key: str, control: str | None) -> None:
        """TooManyControls when results or a probe of link (``src``, ``dest_key``) under ``control`` would be one
        control more than MAX_LINK_CONTROLS (a probe's run would be refused after it ran)."""
        if control is None:
            return
        if self.db.dialect == "postgresql":
            # One new control of a link at a time, so two at once cannot both find room for one; taken before
            # link_controls' INSERT, whose key check would share the row with the other one's (a deadlock). Writes
            # under the link's own controls (a key share) are not held back by it.
            tx.execute("SELECT 1 FROM destinations WHERE src = ? AND dest = ? FOR NO KEY UPDATE", (src, dest_key))
        held = self._link_controls(tx, src, dest_key)
        if control not in held and len(held) >= MAX_LINK_CONTROLS:
            raise TooManyControls(
                f"link {src} -> {dest_key} holds results or probes under {len(held)} congestion controls "
                f"({', '.join(held):.300}), the most this service keeps for one link, and {control!r} would be "
                "another, so nothing was stored: report it under the control the streams used, one of those (a "
                "control is released once nothing under it is newer than TAME_RUN_MAX_AGE_S and no probe under it is "
                "queued or running; never while TAME_RUN_MAX_AGE_S is 0)")

    def check_new_link(self, tx: Tx, src: str, dest_key: str, max_links: int) -> None:
        """Refuse (TooManyLinks) to make ``dest_key`` a link of ``src`` when it is not one yet and ``src`` has
        ``max_links`` links: rows of ``destinations`` and destinations of its queued or running probe jobs (a probe
        queued for a new link holds its place, so its run is never refused after it ran). Each new link would
        bring its own retention allowance (advisor/retention.py), so links are what bounds the store per site.

        A link this passes is taken as made by the caller in this transaction (or the transaction ends): the site's
        links are counted once per transaction, and each new link passed adds one, so a registration of many new
        links reads them once, not once per link."""
        counts = tx.memo.setdefault(_LINK_COUNTS, {})  # src: its links in this transaction, or None: not counted
        if src not in counts:
            if self.db.dialect == "postgresql":
                # Held to the end of the transaction, so no other transaction adds one of the site's links while
                # this one's count stands; SQLite's write transactions are serial already.
                tx.execute(f"SELECT pg_advisory_xact_lock({LINK_COUNT_LOCK}, hashtext(?))", (src,))
            counts[src] = None
        known = tx.execute(
            "SELECT 1 FROM destinations WHERE src = ? AND dest = ? UNION ALL SELECT 1 FROM probe_jobs WHERE src = ? "
            "AND dest = ? AND status IN ('queued', 'running')", (src, dest_key, src, dest_key)).fetchone()
        if known:
            return
        links = counts[src]
        if links is None:
            links = counts[src] = tx.execute(
                "SELECT count(*) FROM (SELECT dest FROM destinations WHERE src = ? UNION SELECT dest FROM probe_jobs "
                "WHERE src = ? AND status IN ('queued', 'running')) AS links", (src, src)).fetchone()[0]
        if links >= max_links:
            raise TooManyLinks(
                f"site {src} has {links} links, the most this service keeps for one site (TAME_MAX_SITE_LINKS="
                f"{max_links}), and {dest_key} would be another, so it was not stored. Write for a link it has, or "
                "wait: a link with no queued or running probe and nothing newer than TAME_RUN_MAX_AGE_S "
                "(fits, runs, observations, probes) is removed when the store is pruned (never while TAME_RUN_MAX_AGE_S "
                "is 0). The operator can raise TAME_MAX_SITE_LINKS")
        counts[src] = links + 1

    @staticmethod
    def _forget_link_count(tx: Tx, src: str) -> None:
        counts = tx.memo.get(_LINK_COUNTS)
        if counts is not None and src in counts:
            counts[src] = None  # counted again when next needed; the site's lock is still held

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
        probes, the newest stored among equals; with ``or_unrecorded``, the current one of those that did not record
        one when there is none under ``control``."""
        where, params = same_control("congestion_control", control)
        if or_unrecorded and control is not None:
            where = f"({where} OR congestion_control IS NULL)"
        with self.db.transaction() as tx:
            # One current fit per control: a recorded one comes before the unrecorded one.
            row = tx.execute(f"SELECT {_FIT_COLUMNS} FROM current_fits WHERE src = ? AND dest = ? AND {where} "
                             "ORDER BY CASE WHEN congestion_control IS NULL THEN 1 ELSE 0 END LIMIT 1",
                             (src, dest_key, *params)).fetchone()
        return _fit(row) if row else None

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
                   probed_at: float | None = None) -> StoredRun:
        """Store a finished probe run from site ``src``, its results and fit, and close its job, in one transaction
        (a run that would be a new link past ``max_links``: TooManyLinks, nothing stored). With ``request`` (a
        client's Idempotency-Key) the key is claimed first (AlreadyTaken when an earlier request stored it: nothing
        stored) and ``answer(the stored run)`` kept with it.

        A link's current fit under a control is the one on the newest probes (the current_fits view): a run whose
        probes are older than the current fit's (delivered late, from an agent's spool) is stored, its fit kept as
        history, and its job closed as any other; :attr:`StoredRun.newer_probed_at` says so.

        ``probed_at``: when the probes ended (None: now), kept with the run as its fit's is, so a refit on it later
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
                    "INSERT INTO probe_results (probe_run_id, streams, throughput_bps, sender_bps, retransmits, "
                    "rtt_mean_s, duration_s, omit_s, throughput_stderr_bps, started_at, raw, mss_bytes, "
                    "stream_bps, stream_retransmits) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, r.streams, r.throughput_bps, r.sender_bps, r.retransmits, r.rtt_mean_s, r.duration_s,
                     r.omit_s, r.throughput_stderr_bps, r.started_at, r.raw, r.mss_bytes,
                     _json_list(r.stream_bps), _json_list(r.stream_retransmits)),
                )
                step("result")
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
                    "started_at = CASE WHEN status = 'queued' THEN NULL ELSE started_at END, "
                    f"owner = NULL, lease_until = NULL WHERE id = ?{held}",
                    ("failed" if job_error else "done", self.clock(), job_error, run_id, job_id, *held_params),
                )
            step("job")
            if request is not None:
                request.remember(tx, run_id, answer(stored))
        return stored

    def latest_run_points(self, dest_key: str, control: str | None = None, *, src: str) -> BaseRun | None:
        """The link's run with results on the newest probes under ``control`` (None: runs that did not record one),
        or None."""
        with self.db.transaction() as tx:
            run = _newest_run(tx, "d.src = ? AND d.dest = ?", (src, dest_key), control)
            if not run:
                return None
            rows = tx.execute(
                "SELECT streams, throughput_bps, rtt_mean_s, retransmits, duration_s, mss_bytes, stream_bps, "
                "stream_retransmits FROM probe_results WHERE probe_run_id = ? ORDER BY id",
                (run[0],),
            ).fetchall()
        names = ("streams", "throughput_bps", "rtt_mean_s", "retransmits", "duration_s", "mss_bytes")
        return BaseRun(run[0], run[1], run[2], run[3],
                       [{**dict(zip(names, r[:6])), "stream_bps": _from_json_list(r[6]),
                         "stream_retransmits": _from_json_list(r[7])} for r in rows])

    # -- observations ---------------------------------------------------------------------

    def add_observation(self, dest: Destination, observation: Observation,
                        refit: Callable[[list[dict[str, float]]], NewFit | None],
                        limit: int = REFIT_OBSERVATIONS, *, src: str,
                        run_control: str | None = None, max_links: int = MAX_SITE_LINKS,
                        base_run: BaseRun | None = None, request: KeyedRequest | None = None,
                        answer: Callable[[int, int | None], dict[str, Any]] | None = None) -> tuple[int, int | None]:
        """Store an observation of a transfer from site ``src`` and, in the same transaction, the refit ``refit(observations)`` returns.

        ``base_run``: the run ``refit`` rests on (:meth:`latest_run_points`, read before this transaction); when the
        link's run on the newest probes is another one by then (one committed since), the refit would hide it behind
        older probes, so the observation is stored without one (the newer run's fit stands, and the next observation
        refits on it).

        ``refit`` gets the observations ({streams, throughput_bps, duration_s, stream_bps, stream_retransmits}; the
        lists empty where not reported) under the observation's congestion control that feed the fit (all
        streams standard: :attr:`Observation.feeds_fit`), stored since ``base_run`` reached the store (finished_at; under
        ``run_control``: its control, or None for one that did not record its control), at most
        ``limit``, newest first, and returns the new fit or None. An observation that does not feed the fit is
        stored without calling it. Returns (the observation's id, the new fit's id or None). One that would be a
        new link past ``max_links`` is refused (TooManyLinks), nothing stored. With ``request`` (a client's
        Idempotency-Key) the key is claimed first (AlreadyTaken when an earlier request stored it: nothing stored)
        and ``answer(observation id, fit id)`` kept with it.

        The refit is computed before the write transaction, on the observations stored by then, and kept when the
        transaction finds the same ones (the write lock, the whole store's on SQLite, is held for the inserts, not
        for the fit); when another write came between, it is computed again inside the transaction. Writers in this
        process to one link take turns (early refit and write), so that is only when another process wrote it.
        """
        window = _RefitWindow.of(observation, run_control, base_run, limit)
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
        if not observation.feeds_fit:
            return observation_id, None
        if tx.dialect == "postgresql":
            # Refits of one link from several processes (replicas) take turns from here to the commit: each one's
            # window then holds the observation the one before it stored, which one running beside it would not see
            # (each fit leaving out the other's). SQLite's write lock is the whole store's already.
            tx.execute("SELECT 1 FROM destinations WHERE id = ? FOR NO KEY UPDATE", (destination_id,))
        if window.base_run is not None:
            newest = _newest_run(tx, "d.id = ?", (destination_id,), window.run_control)
            if newest is None or newest[0] != window.base_run.id:
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

    # -- probe jobs -----------------------------------------------------------------------

    def enqueue_job(self, dest: Destination, levels: Sequence[int], duration_s: float,
                    max_queued: int | None = None, retry_after_s: float = 60.0, client: str | None = None,
                    max_queued_per_client: int | None = None, *, src: str,
                    congestion_control: str | None = None, max_queued_per_src: int | None = None,
                    max_links: int = MAX_SITE_LINKS) -> tuple[Job, bool]:
        """A new queued job probing the link from site ``src`` under ``congestion_control``, or the link's active
        one under that control: (job, created).

        Raises QueueFull (with ``retry_after_s``) when ``max_queued`` jobs are queued already,
        ``max_queued_per_client`` of them were asked for by ``client``, or ``max_queued_per_src`` of them are
        links from ``src``; TooManyLinks when the job would be a new link of ``src`` past ``max_links``."""
        job_id = uuid.uuid4().hex
        job_where, job_params = same_control("congestion_control", congestion_control)
        try:
            with self.db.transaction(write=True) as tx:
                active = tx.execute(
                    f"SELECT {JOB_COLUMNS} FROM probe_jobs WHERE src = ? AND dest = ? AND {job_where} "
                    "AND status IN ('queued', 'running')",
                    (src, dest.key, *job_params),
                ).fetchone()
                if active:
                    return job_from_row(active), False
                # Before LOCK TABLE: a run's transaction takes the link count's lock, then writes probe_jobs.
                self.check_new_link(tx, src, dest.key, max_links)
                self.check_job_control(tx, src, dest.key, congestion_control)
                if max_queued is not None:
                    if self.db.dialect == "postgresql":
                        # Two processes must not both count max_queued - 1 and insert.
                        tx.execute("LOCK TABLE probe_jobs IN SHARE ROW EXCLUSIVE MODE")
                    queued = tx.execute("SELECT count(*) FROM probe_jobs WHERE status = 'queued'").fetchone()[0]
                    if queued >= max_queued:
                        raise QueueFull(f"the probe queue is full ({queued} probes waiting, at most {max_queued}); "
                                        f"ask again in {retry_after_s:.0f} s", retry_after_s)
                if client is not None and max_queued_per_client is not None:
                    mine = tx.execute("SELECT count(*) FROM probe_jobs WHERE client = ? AND status = 'queued'",
                                      (client,)).fetchone()[0]
                    if mine >= max_queued_per_client:
                        raise QueueFull(f"you have {mine} probes waiting, at most {max_queued_per_client} per client; "
                                        f"ask again in {retry_after_s:.0f} s", retry_after_s)
                if max_queued_per_src is not None:
                    theirs = tx.execute("SELECT count(*) FROM probe_jobs WHERE src = ? AND status = 'queued'",
                                        (src,)).fetchone()[0]
                    if theirs >= max_queued_per_src:
                        raise QueueFull(f"site {src} has {theirs} probes waiting for its agents to claim them, at most "
                                        f"{max_queued_per_src} per site; ask again in {retry_after_s:.0f} s",
                                        retry_after_s)
                tx.execute(
                    "INSERT INTO probe_jobs (id, src, dest, status, levels_json, duration_s, requested_at, client, "
                    "congestion_control) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?)",
                    (job_id, src, dest.key, json.dumps(list(levels)), duration_s, self.clock(), client,
                     congestion_control),
                )
        except StoreError as exc:
            # Another process enqueued the same destination between our check and insert.
            if not self.db.is_unique_violation(exc):
                raise
            return self.active_job(dest.key, congestion_control, src=src), False
        return self.job(job_id), True

    def active_job(self, dest_key: str, control: str | None = None, *, src: str) -> Job | None:
        """The link's queued or running job under ``control`` (None: a job queued before controls were kept)."""
        where, params = same_control("congestion_control", control)
        with self.db.transaction() as tx:
            row = tx.execute(
                f"SELECT {JOB_COLUMNS} FROM probe_jobs WHERE src = ? AND dest = ? AND {where} "
                "AND status IN ('queued', 'running')",
                (src, dest_key, *params),
            ).fetchone()
        return job_from_row(row) if row else None

    def job(self, job_id: str) -> Job:
        with self.db.transaction() as tx:
            row = tx.execute(f"SELECT {JOB_COLUMNS} FROM probe_jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownProbe(f"no probe job has id {job_id!r}")
        return job_from_row(row)

    def claim_job(self, owner: str, lease_s: Callable[[Job], float], limit: int, *, src: str) -> Job | None:
        """Mark site ``src``'s next queued job running for ``owner`` if fewer than ``limit`` of that site's probes
        run (a site's probes share its links): clients in turn, the oldest of each first."""
        with self.db.transaction(write=True) as tx:
            lock_claims(tx)
            if self.db.dialect == "postgresql":
                tx.execute("LOCK TABLE probe_jobs IN SHARE ROW EXCLUSIVE MODE")
            running = tx.execute("SELECT count(*) FROM probe_jobs WHERE status = 'running' AND src = ?",
                                 (src,)).fetchone()[0]
            if running >= limit:
                return None
            # A job whose destination another site's agent probes, or whose address (as it resolved when it last
            # ran) has a probe running, waits its turn. Clients take turns (the jobs the service queues itself,
            # client NULL, are one): first the job of the client whose last probe started longest ago (none in the
            # last hour: first of all), so one asking for many long probes cannot hold the worker while another's
            # wait behind them, and the service's own re-probes wait one round of the clients waiting, not until
            # every client has had as many probes as it has.
            now = self.clock()
            # Each client's last start once (one per candidate read the site's every job again for each). A start
            # after now (the clock stepped back, or another replica's runs ahead) is left out: it would stay the
            # client's last until the clock caught up, and the client served first after the step, its new starts
            # all older, take every turn until then.
            row = tx.execute(
                "WITH turns AS (SELECT client, max(started_at) AS started FROM probe_jobs WHERE src = ? AND "
                f"started_at >= ? AND started_at <= ? GROUP BY client) SELECT {JOB_COLUMNS} FROM probe_jobs j LEFT JOIN turns t ON "
                "(t.client = j.client OR "
                "(t.client IS NULL AND j.client IS NULL)) WHERE j.status = 'queued' AND j.src = ? AND (j.address IS "
                "NULL OR j.address NOT IN (SELECT address FROM probe_jobs WHERE status = 'running' AND address IS NOT "
                "NULL)) AND j.dest NOT IN (SELECT dest FROM probe_jobs WHERE status = 'running') AND "
                f"{LOOKUP_WAIT_OVER.format(j='j')} ORDER BY coalesce(t.started, 0), j.requested_at, j.id LIMIT 1",
                (src, now - BUDGET_WINDOW_S, now, src, now)
            ).fetchone()
            if row is None:
                return None
            job = job_from_row(row)
            tx.execute(
                "UPDATE probe_jobs SET status = 'running', started_at = ?, progress = 0, progress_detail = NULL, "
                "attempts = attempts + 1, owner = ?, lease_until = ?, error = NULL, address = NULL WHERE id = ?",
                (now, owner, now + lease_s(job), job.id),
            )
        return self.job(job.id)

    def pin_address(self, job_id: str, owner: str, address: str, lease_until: float) -> bool:
        """Record that ``owner``'s running job probes ``address`` (and renew its lease), unless another
        running job probes that address: False then, and the job should wait (:meth:`release_job`)."""
        with self.db.transaction(write=True) as tx:
            lock_claims(tx)
            if self.db.dialect == "postgresql":
                tx.execute("LOCK TABLE probe_jobs IN SHARE ROW EXCLUSIVE MODE")
            busy = tx.execute(
                "SELECT count(*) FROM probe_jobs WHERE status = 'running' AND address = ? AND id <> ?",
                (address, job_id),
            ).fetchone()[0]
            if busy:
                return False
            tx.execute(f"UPDATE probe_jobs SET address = ?, lease_until = ? WHERE {HELD_JOB}",
                       (address, lease_until, job_id, owner))
        return True

    def release_job(self, job_id: str, owner: str, note: str, address: str | None = None) -> None:
        """Put this service's worker ``owner``'s running job back in the queue without counting the attempt (a
        shutdown, or its address is busy: ``address`` is kept so the claim skips the job while that address is
        probed)."""
        with self.db.transaction(write=True) as tx:
            end_attempt_in(tx, HELD_JOB, (job_id, owner), job_id=job_id, src="",
                            attempts=0, started_at=None, lease_until=None, now=self.clock(), max_attempts=1,
                            gave_up="", requeued=note, counted=False, address=address)

    def set_progress(self, job_id: str, owner: str, progress: float, detail: dict[str, Any] | None = None) -> None:
        """The fraction done and, optionally, where in its plan the job is (a small JSON object)."""
        with self.db.transaction(write=True) as tx:
            tx.execute(f"UPDATE probe_jobs SET progress = ?, progress_detail = ? WHERE {HELD_JOB}",
                       (progress, None if detail is None else json.dumps(detail), job_id, owner))

    def fail_attempt(self, job_id: str, owner: str, src: str, error: str, max_attempts: int) -> Job | None:
        """``owner``'s attempt at its running job (a probe of a link from ``src``) failed with ``error``, reported by
        that agent: the job goes to the back of the site's queue (failed when this was its ``max_attempts``-th
        attempt), and the attempt's probe-seconds are what it took, started_at to now (not its lease's worth, as a
        lapsed one counts). None when ``owner`` does not hold the job (its lease went to another agent)."""
        now = self.clock()
        # Behind the site's other queued jobs: one that fails at once must not hold the head of the queue.
        return self._end_agent_attempt(
            job_id, owner, src, now, max_attempts=max_attempts,
            gave_up=lambda attempts: f"failed {attempts} times; giving up. Last: {error}",
            requeued=lambda attempts: f"attempt {attempts} failed: {error}; re-queued", requeued_at=now)

    def release_attempt(self, job_id: str, owner: str, src: str, note: str) -> Job | None:
        """Agent ``owner``'s running job (a probe of a link from ``src``) goes back unfinished, because the agent is
        stopping or its claim could not start it: the job is queued again at once, in its place, the attempt not
        counted, and the attempt's
        probe-seconds are what it took, started_at to now. None when ``owner`` does not hold the job."""
        return self._end_agent_attempt(job_id, owner, src, self.clock(), max_attempts=1, gave_up=lambda _: "",
                                       requeued=lambda _: note, counted=False)

    def defer_attempt(self, job_id: str, owner: str, src: str, error: str, retry_after_s: float, *,
                      charged: bool = True) -> Job | None:
        """``owner``'s running job (a probe of a link from ``src``) could not start: its destination's name lookup did
        not finish (``error``: advisor.errors.LookupUnfinished, which says to wait ``retry_after_s``). Nothing is known
        against the job, so the attempt is not counted: the job goes behind the site's other queued ones, not to be
        claimed again before it has waited (LOOKUP_WAIT_OVER), so a name that stays slow is not looked up again and
        again, and fails the MAX_LOOKUP_WAITS-th time. The attempt's seconds, started_at to now, count in the site's
        budget when ``charged`` (an agent's claim). None when ``owner`` does not hold the job."""
        now = self.clock()
        with self.db.transaction(write=True) as tx:
            row = _held_attempt(tx, job_id, owner, src, "lookup_waits")
            if row is None:
                return None
            attempts, started_at, lease_until, waits = row
            waits += 1
            wait_s = min(retry_after_s * 2.0 ** (waits - 1), LOOKUP_RETRY_MAX_S)
            last = waits >= MAX_LOOKUP_WAITS  # counted, with max_attempts 1: it fails the job whatever its attempts
            end_attempt_in(tx, HELD_ATTEMPT, (job_id, owner, src), job_id=job_id, src=src, attempts=attempts,
                            started_at=started_at if charged else None, lease_until=lease_until, now=now,
                            max_attempts=1, counted=last, requeued_at=now,
                            gave_up=f"never run: its name lookup did not finish as it was to start, {waits} times; "
                                    f"the last time: {error}",
                            requeued=f"not started: {error}; re-queued, tried again in {wait_s:g} s")
            tx.execute("UPDATE probe_jobs SET lookup_waits = ?, retry_at = ? WHERE id = ?",
                       (waits, None if last else now + wait_s, job_id))
        return self.job(job_id)

    def refuse_attempt(self, job_id: str, owner: str, src: str, error: str) -> Job | None:
        """The job agent ``owner`` has just claimed (a probe of a link from ``src``) must not run (``error``: its
        destination is no longer allowed): it fails now, whatever its attempts, and the site is charged nothing.
        None when ``owner`` does not hold the job."""
        return self._end_agent_attempt(job_id, owner, src, self.clock(), max_attempts=1, gave_up=lambda _: error,
                                       requeued=lambda _: error)

    def _end_agent_attempt(self, job_id: str, owner: str, src: str, now: float, *,
                           gave_up: Callable[[int], str], requeued: Callable[[int], str], **end: Any) -> Job | None:
        """:func:`end_attempt_in` for the attempt agent ``owner`` holds at its job (the messages made from the
        attempt's number); None when it holds none."""
        with self.db.transaction(write=True) as tx:
            row = _held_attempt(tx, job_id, owner, src)
            if row is None:
                return None
            attempts, started_at, lease_until = row
            end_attempt_in(tx, HELD_ATTEMPT, (job_id, owner, src), job_id=job_id, src=src, attempts=attempts,
                            started_at=started_at, lease_until=lease_until, now=now, gave_up=gave_up(attempts),
                            requeued=requeued(attempts), **end)
        return self.job(job_id)

    def fail_job(self, job_id: str, error: str) -> None:
        with self.db.transaction(write=True) as tx:
            fail_job_in(tx, job_id, error, self.clock())

    def recover_jobs(self, max_attempts: int, owner_is_dead: Callable[[str | None], bool] = _owner_is_dead_here, *,
                     local_src: str | None = None) -> int:
        """Re-queue running jobs whose owner died or whose lease ran out (failed after ``max_attempts``).

        The probe-seconds a re-queued attempt may have spent are kept in ``spent_attempts`` in the same transaction
        (its site's hourly budget counts them: :mod:`advisor.sites`); a job given up on keeps its last attempt in its
        own row, finished when that attempt stopped. With ``local_src``, only that site's jobs are judged by ``owner_is_dead`` (their owners are processes that
        share this host's view); other sites' jobs were claimed by remote agents, whose owner names are theirs to
        choose, and are judged by their lease alone. A job changed since it was read here (claimed again by
        another process meanwhile) is left alone."""
        now = self.clock()
        with self.db.transaction(write=True) as tx:
            rows = tx.execute(
                "SELECT id, owner, lease_until, attempts, src, started_at FROM probe_jobs WHERE status = 'running'"
            ).fetchall()
            orphans = [r for r in rows if (r[2] is not None and r[2] < now)
                       or ((local_src is None or r[4] == local_src) and owner_is_dead(r[1]))]
            recovered = 0
            for job_id, owner, lease_until, attempts, src, started_at in orphans:
                unchanged = ("id = ? AND status = 'running' AND owner IS NOT DISTINCT FROM ? "
                             "AND lease_until IS NOT DISTINCT FROM ?")
                # When the attempt stopped is not known: an owner found dead here stopped by now, a remote one
                # may have sent until its lease ran out.
                recovered += end_attempt_in(
                    tx, unchanged, (job_id, owner, lease_until), job_id=job_id, src=src, attempts=attempts,
                    started_at=started_at, lease_until=lease_until, now=now,
                    max_attempts=max_attempts,
                    gave_up=f"interrupted {attempts} times (the probing process stopped); giving up",
                    requeued="interrupted: the probing process stopped; re-queued")
        return recovered

    def job_counts(self) -> dict[str, int]:
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT status, count(*) FROM probe_jobs GROUP BY status").fetchall()
        return {status: count for status, count in rows}
