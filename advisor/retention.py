"""Retention: what the advice store keeps, and pruning the rest in short batches.

Kept, per link (a row of destinations: source site and destination): the newest ``keep_fits`` fits with their curves, and always the current
fit under each congestion control (current_fits); the newest ``keep_runs`` probe runs with their
results, and of those only runs finished within ``run_max_age_s`` (0: no age limit); always the run
any kept fit rests on (fits.probe_run_id) and the run with results on the newest probes under each control (the
base an observation refits on, :meth:`advisor.store.Store.latest_run_points`); the newest ``keep_observations`` observations
(never fewer than the refit window, :data:`advisor.store.REFIT_OBSERVATIONS`, so the
observations the current fit used stay); queued and running probe jobs, and the newest
``keep_runs`` finished ones, within the same age, and every job of a registered site started within the hour its
probe budget counts (:data:`advisor.sites.BUDGET_WINDOW_S`); the probe-seconds of lapsed attempts (``spent_attempts``) for
as long as a site's budget counts them (:data:`advisor.sites.BUDGET_WINDOW_S`); the Idempotency-Key of a stored
write (advisor/idempotency.py) as long as the run or observation it names. The SQL views (current_fits,
current_advice) read only the current fit (on the newest probes) and its curve, which stay as long as their link and
its control (below).

A probe's ``raw`` record (iperf3's report, summarised: up to ``probes.iperf_parse.RAW_MAX_CHARS`` characters) is kept
only in the results of each link's newest run with results; older runs that stay keep their parsed numbers (what
fits, refits and advice read) and have ``raw`` set to NULL. Nothing in the service reads ``raw`` back; it is there
for an operator to check what the latest probe saw, and one run per link (not per control: a link may be probed
under any number of controls) is what bounds it by the link count.

A link itself (its ``destinations`` row) goes once nothing of it is newer than ``run_max_age_s`` and no probe of it is
queued or running (made before then, and no fit made, run finished, observation made or job asked for or finished
since), with all it holds (its fits and their curves, runs and their results, observations, finished jobs); with no
age limit (0) links stay. A link in use is never that old: an agent that registers it re-probes it every TTL, and
GET /v1/advice of stale advice queues a probe (the settings refuse an age under two TTLs); reading the SQL views
keeps no link, nor does a read whose re-probe the queue refuses (full) for the whole age. So a site at its link cap
(advisor.store.Store.check_new_link) is not held there for ever by links it no longer uses, written to once or
fitted long ago. Until then the current fit under each control stays, as above, unless its control goes (below).

A registered site (its ``sites`` row) goes likewise once it holds no link and no queued or running probe and no
agent of it registered since ``run_max_age_s``, so sites named once do not hold advisor.links.Links.check_new_site's
cap (TAME_MAX_SITES) for ever; its next registration makes it again.

Likewise a link's congestion control (its row of ``link_controls``, one of the advisor.limits.MAX_LINK_CONTROLS the
link may hold: advisor.store.Store.check_link_control) is released once nothing of the link under that control is
newer than ``run_max_age_s`` and no probe of the link under it is queued or running (no fit made, run finished or
observation made under it, and no probe under it asked for or finished, since; a job that did not record its control
counts as under each), with what the link holds under it (its fits there and their curves, runs and their results,
observations; their Idempotency-Keys then go too); with no age limit (0) controls stay. Only results under it go:
those that did not record their control (NULL) are under none and stay with the link. So a link probed long ago under
as many controls as it may hold, and in use under one of them since, takes a new control, as a site at its link cap
takes a new link. A pass goes through ``link_controls`` in key order (link id, control), ``batch`` rows a
transaction whether released or not, and the next pass goes on from where it stopped (kept in the store's
prune_positions, :attr:`PruneCounts.resume`), so a store with more controls than one pass goes through is not
scanned from its first row every time, and replicas of the service on one store go on from each other's position.
The fits and observations steps likewise go through the links past the count kept in link id order, at most
LINKS_A_BATCH a batch, from where the last batch stopped: a batch finds them by each link's (keep+1)-th newest row (an
index range of keep+1 ids a link, of every link after the position when fewer are past the count) and reads what they
keep (their current fits, their refit windows) and what goes from those links' own rows only.

Each batch is one short write transaction of at most ``batch`` parent rows (and their children:
a fit's curve points, a run's results; a released control's rows), so readers and writers wait at most for one
batch. On PostgreSQL a link is removed, or its control released, only under a lock on its row taken without waiting,
skipping a link a write holds, so a write either ends before and keeps it, or waits and then makes it again. On
SQLite the pages freed are reused by later writes: under a steady load the file stays flat
without VACUUM (auto_vacuum is left as it is; switching it on for an existing file needs a VACUUM
that rewrites the whole file under an exclusive lock). On PostgreSQL, autovacuum reclaims the
dead rows.

Several replicas of the service on one PostgreSQL store prune one at a time: each batch first takes
:data:`advisor.locks.PRUNE_LOCK` without waiting, and a replica that finds it taken ends its pass there
(:attr:`PruneCounts.yielded`), holding nothing. So two passes never delete the same rows at once (neither waits on
the other's rows nor deadlocks with it, and no row is counted twice), and a write waits for at most one batch. A
batch reads what to delete after taking the lock, so it sees what the batch before, of any replica, deleted. On
SQLite a batch's write transaction is the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from advisor.db import Tx
from advisor.errors import AdvisorError
from advisor.idempotency import RECORD_TABLES
from advisor.locks import PRUNE_LOCK
from advisor.sites import BUDGET_WINDOW_S
from advisor.store import REFIT_OBSERVATIONS, Store, run_is_newer

log = logging.getLogger(__name__)

# A pass stops after this many batches per table even if rows are left (the next pass goes on).
MAX_BATCHES_PER_PASS = 200


@dataclass(frozen=True)
class Retention:
    """How much history the store keeps (see the module docstring)."""

    keep_fits: int = 20
    keep_runs: int = 20
    run_max_age_s: float = 30 * 86400.0
    keep_observations: int = 1000
    batch: int = 500
    interval_s: float = 60.0

    def __post_init__(self):
        for name in ("keep_fits", "keep_runs", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.keep_observations < REFIT_OBSERVATIONS:
            raise ValueError(f"keep_observations must be at least {REFIT_OBSERVATIONS} (the refit window), "
                             f"not {self.keep_observations}")
        if self.run_max_age_s < 0 or self.interval_s < 0:
            raise ValueError("run_max_age_s and interval_s must be >= 0")


@dataclass
class PruneCounts:
    """Rows deleted by one pass, per table (``probe_results.raw``: results whose raw record was cleared;
    ``link_controls``: controls released, with what their links held under them), where the next pass's release
    of controls goes on from (``resume``: after that (link id, control) of link_controls; None: from the first), and
    whether the pass ended early because another replica was pruning (``yielded``)."""

    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    resume: tuple[int, str] | None = None
    yielded: bool = False

    def add(self, table: str, rows: int) -> None:
        self.deleted[table] = self.deleted.get(table, 0) + rows


def _cutoff(table: str) -> str:
    """SQL for the id of link d's (keep+1)-th newest row of ``table`` (parameter: keep), NULL when it has no more than
    keep: that id and older ones are past the count kept."""
    return f"(SELECT c.id FROM {table} c WHERE c.destination_id = d.id ORDER BY c.id DESC LIMIT 1 OFFSET ?)"


# Links one batch of the fits or observations step goes through: it reads what each one keeps (its current fits, its
# refit window) from the link's own rows, so a batch's read is bounded by them, not by the store. (One window function
# over every link's observations held SQLite's write lock 2.0 s a batch with 2,000 links past the count, 2,100,000
# observations, in benchmarks.prune_controls --controls 1 --observations 2100000; reading every link's current fits
# held it 188.5 and 199.0 ms a batch in two runs with 2,000 links of 24 fits, --controls 24.)
LINKS_A_BATCH = 50


def links_past_count(tx: Tx, table: str, keep: int, after: int, links: int) -> list[tuple[int, int]]:
    """(link id, cut-off id) of up to ``links`` links after link id ``after`` that hold more than ``keep`` rows of
    ``table``, in id order: the cut-off and older rows are past the count kept."""
    return [(r[0], r[1]) for r in tx.execute(
        f"SELECT did, cutoff FROM (SELECT d.id AS did, {_cutoff(table)} AS cutoff FROM destinations d "
        "WHERE d.id > ?) k WHERE cutoff IS NOT NULL ORDER BY did LIMIT ?", (keep, after, links)).fetchall()]


def fits_past_count(tx: Tx, link_id: int, cutoff: int, limit: int) -> list[int]:
    """Ids of link ``link_id``'s fits up to ``cutoff``, oldest first, but for its current fit under each control
    (current_fits), however many newer fits other controls have."""
    # An anti-join (NOT EXISTS), not NOT IN: PostgreSQL runs NOT IN over a subquery larger than its work_mem as a
    # plain subplan, reading it again for every row.
    rows = tx.execute(
        "WITH kept AS MATERIALIZED (SELECT cf.id FROM current_fits cf WHERE cf.destination_id = ?) SELECT t.id "
        "FROM fits t WHERE t.destination_id = ? AND t.id <= ? AND NOT EXISTS (SELECT 1 FROM kept WHERE kept.id = t.id) "
        "ORDER BY t.id LIMIT ?", (link_id, link_id, cutoff, limit)).fetchall()
    return [r[0] for r in rows]


def observations_past_count(tx: Tx, link_id: int, cutoff: int, limit: int) -> list[int]:
    """Ids of link ``link_id``'s observations up to ``cutoff``, oldest first, but for those in a control's refit
    window: its newest REFIT_OBSERVATIONS standard (tame_streams = 0) observations under each control (NULL, not
    recorded, is one). Tame transfers, which never refit, and other controls' transfers do not push them out."""
    rows = tx.execute(
        "WITH kept AS MATERIALIZED (SELECT w.id FROM (SELECT o.id, row_number() OVER (PARTITION BY "
        "o.congestion_control ORDER BY o.id DESC) AS newer FROM observations o WHERE o.destination_id = ? AND "
        "o.tame_streams = 0) w WHERE w.newer <= ?) SELECT t.id FROM observations t WHERE t.destination_id = ? AND "
        "t.id <= ? AND NOT EXISTS (SELECT 1 FROM kept WHERE kept.id = t.id) ORDER BY t.id LIMIT ?",
        (link_id, REFIT_OBSERVATIONS, link_id, cutoff, limit)).fetchall()
    return [r[0] for r in rows]


# Per table whose rows a link keeps a count of: the ids of one link's rows past the count that go.
_PAST_COUNT = {"fits": fits_past_count, "observations": observations_past_count}


def past_count_batch(tx: Tx, table: str, keep: int, after: int, limit: int) -> tuple[list[int], int, bool]:
    """What one batch of the fits or observations step (``table``) deletes: ids of up to ``limit`` rows past the
    ``keep`` newest of their link, of up to LINKS_A_BATCH links past the count after link id ``after``, in id order;
    the link id the next batch goes on after; and whether it has any to go on to."""
    links = links_past_count(tx, table, keep, after, LINKS_A_BATCH)
    ids: list[int] = []
    for link_id, cutoff in links:
        ids += _PAST_COUNT[table](tx, link_id, cutoff, limit - len(ids))
        if len(ids) == limit:
            break  # the next batch goes through this link again: it may hold more
        after = link_id
    return ids, after, len(ids) == limit or len(links) == LINKS_A_BATCH


def _prunable_runs(tx: Tx, keep: int, older_than: float | None, limit: int) -> list[int]:
    # A run goes when it is past the count kept or older than the age kept, unless a fit rests on it
    # or it is its destination's newest run (with results: the base of observation refits).
    rows = tx.execute(
        f"WITH cut AS (SELECT d.id AS did, {_cutoff('probe_runs')} AS cutoff, "
        "(SELECT max(r3.id) FROM probe_runs r3 WHERE r3.destination_id = d.id) AS newest, "
        "(SELECT max(r4.id) FROM probe_runs r4 WHERE r4.destination_id = d.id AND EXISTS "
        "(SELECT 1 FROM probe_results p WHERE p.probe_run_id = r4.id)) AS base FROM destinations d) "
        "SELECT r.id FROM probe_runs r JOIN cut ON r.destination_id = cut.did "
        "WHERE (r.id <= cut.cutoff OR r.finished_at < ?) AND r.id <> cut.newest AND r.id <> coalesce(cut.base, -1) "
        "AND NOT EXISTS (SELECT 1 FROM fits f WHERE f.probe_run_id = r.id) "
        # The run with results on the newest probes under each control (NULL, not recorded, is one group): no newer
        # one of its link and control, as Store.latest_run_points orders them.
        "AND NOT (EXISTS (SELECT 1 FROM probe_results p5 WHERE p5.probe_run_id = r.id) AND NOT EXISTS "
        "(SELECT 1 FROM probe_runs r5 WHERE r5.destination_id = r.destination_id AND (r5.congestion_control = "
        "r.congestion_control OR (r5.congestion_control IS NULL AND r.congestion_control IS NULL)) "
        "AND EXISTS (SELECT 1 FROM probe_results p6 WHERE p6.probe_run_id = r5.id) "
        f"AND {run_is_newer('r5', 'r')})) "
        "ORDER BY r.id LIMIT ?",
        (keep, -1.0 if older_than is None else older_than, limit)).fetchall()
    return [r[0] for r in rows]


def _stale_raw(tx: Tx, limit: int) -> list[int]:
    """Ids of probe results that still hold ``raw`` but are not of their link's run with results on the newest
    probes (the newest stored among equals, as _NEWEST_RUN orders them: a late run kept as history is not it),
    oldest first."""
    rows = tx.execute(
        "SELECT p.id FROM probe_results p JOIN probe_runs r ON r.id = p.probe_run_id "
        "WHERE p.raw IS NOT NULL AND EXISTS (SELECT 1 FROM probe_runs r2 WHERE r2.destination_id = r.destination_id "
        "AND EXISTS (SELECT 1 FROM probe_results p2 WHERE p2.probe_run_id = r2.id) "
        f"AND {run_is_newer('r2', 'r')}) "
        "ORDER BY p.id LIMIT ?", (limit,)).fetchall()
    return [r[0] for r in rows]


def _prunable_jobs(tx: Tx, keep: int, older_than: float | None, limit: int, budget_since: float) -> list[str]:
    # Finished jobs only; their order is finished_at (job ids are random). A client polling a job
    # pruned gets 404, so the newest few per link stay for as long as runs do. A registered site's job started since
    # ``budget_since`` stays whatever else holds: the site's hourly probe budget counts its seconds from its row
    # (advisor.sites).
    rows = tx.execute(
        "SELECT j.id FROM probe_jobs j WHERE j.status IN ('done', 'failed') AND (j.finished_at < ? OR "
        "(SELECT count(*) FROM probe_jobs j2 WHERE j2.dest = j.dest AND j2.src = j.src AND j2.status IN ('done', 'failed') "
        "AND (j2.finished_at > j.finished_at OR (j2.finished_at = j.finished_at AND j2.id > j.id))) >= ?) "
        "AND (j.started_at IS NULL OR j.started_at < ? OR NOT EXISTS (SELECT 1 FROM sites s WHERE s.name = j.src)) "
        "ORDER BY j.finished_at LIMIT ?",
        (-1.0 if older_than is None else older_than, keep, budget_since, limit)).fetchall()
    return [r[0] for r in rows]


def _nothing_since(control: str = "") -> str:
    """SQL true when link ``d`` holds nothing newer than a cut-off (each of its parameters): no fit made, run
    finished or observation made since, no probe job queued or running and none asked for or finished since; under
    ``control`` (SQL naming a congestion control) only, when given."""
    def under(alias: str) -> str:
        return f" AND {alias}.congestion_control = {control}" if control else ""
    # A job that did not record its control (queued before they were kept) runs under the service's default, not
    # known here: it holds every control of its link.
    job = f" AND (j.congestion_control = {control} OR j.congestion_control IS NULL)" if control else ""
    return (f"NOT EXISTS (SELECT 1 FROM fits f WHERE f.destination_id = d.id{under('f')} AND f.fitted_at >= ?) "
            f"AND NOT EXISTS (SELECT 1 FROM probe_jobs j WHERE j.src = d.src AND j.dest = d.dest{job} AND "
            "(j.status IN ('queued', 'running') OR j.requested_at >= ? OR j.finished_at >= ?)) "
            f"AND NOT EXISTS (SELECT 1 FROM probe_runs r WHERE r.destination_id = d.id{under('r')} "
            "AND r.finished_at >= ?) "
            f"AND NOT EXISTS (SELECT 1 FROM observations o WHERE o.destination_id = d.id{under('o')} "
            "AND o.observed_at >= ?)")


# A link (d) that holds nothing newer than a cut-off (each parameter): made before it, and nothing since.
_IDLE_LINK = f"d.created_at < ? AND {_nothing_since()}"
# A registered site (s) not seen since a cut-off (the parameter) that has no link and no queued or running probe.
_IDLE_SITE = ("s.last_seen_at < ? AND NOT EXISTS (SELECT 1 FROM destinations d WHERE d.src = s.name) AND NOT EXISTS "
              "(SELECT 1 FROM probe_jobs j WHERE j.src = s.name AND j.status IN ('queued', 'running'))")
# A control (lc, a row of link_controls) of link d under which the link holds nothing newer than a cut-off.
_IDLE_CONTROL = _nothing_since("lc.congestion_control")


def _idle_links(tx: Tx, older_than: float, limit: int, among: Sequence[int] | None = None) -> list[int]:
    """Ids of links that hold nothing newer than ``older_than`` (_IDLE_LINK), oldest first; of ``among`` when given."""
    within = f" AND d.id IN ({_placeholders(among)})" if among is not None else ""
    rows = tx.execute(f"SELECT d.id FROM destinations d WHERE {_IDLE_LINK}{within} ORDER BY d.id LIMIT ?",
                      (older_than,) * _IDLE_LINK.count("?") + tuple(among or ()) + (limit,)).fetchall()
    return [r[0] for r in rows]


def _controls_after(tx: Tx, older_than: float, after: tuple[int, str] | None, limit: int,
                    among: Sequence[int] | None = None) -> list[tuple[int, str, bool]]:
    """The first ``limit`` rows of link_controls after ``after`` (None: from the first) in key order (link id,
    control), of links ``among`` when given, each as (link id, control, whether the link holds nothing under it
    newer than ``older_than``: _IDLE_CONTROL)."""
    where, params = [], []
    if after is not None:
        where.append("(lc.destination_id, lc.congestion_control) > (?, ?)")
        params += after
    if among is not None:
        where.append(f"lc.destination_id IN ({_placeholders(among)})")
        params += among
    rows = tx.execute(
        f"SELECT lc.destination_id, lc.congestion_control, CASE WHEN {_IDLE_CONTROL} THEN 1 ELSE 0 END "
        "FROM link_controls lc JOIN destinations d ON d.id = lc.destination_id "
        f"{'WHERE ' + ' AND '.join(where) if where else ''} "
        "ORDER BY lc.destination_id, lc.congestion_control LIMIT ?",
        ((older_than,) * _IDLE_CONTROL.count("?") + tuple(params) + (limit,))).fetchall()
    return [(did, control, bool(idle)) for did, control, idle in rows]


def _delete_held(tx: Tx, ids: Sequence[int], control: str | None = None) -> None:
    """Delete what links ``ids`` hold (fits and their curves, runs and their results, observations, link_controls
    rows): all of it, or only what is under ``control`` when given (a fit rests only on a run of its own control:
    Store.record_run stores both under the run's)."""
    where, params = f"destination_id IN ({_placeholders(ids)})", list(ids)
    if control is not None:
        where, params = f"{where} AND congestion_control = ?", [*params, control]
    tx.execute(f"DELETE FROM curve_points WHERE fit_id IN (SELECT id FROM fits WHERE {where})", params)
    tx.execute(f"DELETE FROM fits WHERE {where}", params)
    tx.execute(f"DELETE FROM probe_results WHERE probe_run_id IN (SELECT id FROM probe_runs WHERE {where})", params)
    tx.execute(f"DELETE FROM probe_runs WHERE {where}", params)
    tx.execute(f"DELETE FROM observations WHERE {where}", params)
    tx.execute(f"DELETE FROM link_controls WHERE {where}", params)


def _placeholders(ids) -> str:
    return ", ".join("?" for _ in ids)


def _lock_unheld(tx: Tx, ids: Sequence[int]) -> list[int]:
    """Of links ``ids``, those no write holds, locked (PostgreSQL) to the end of ``tx``; the caller then asks again,
    in a new snapshot, whether each still holds nothing.

    A write that found a link holds it (Store.link_id; check_link_control too): that link is in use, and is skipped,
    never waited for, so a registration holding several links cannot deadlock with a pass. A write that finds a link
    locked here waits, and then does not find what the pass removed (the link, or its control in link_controls) and
    makes it again."""
    return [row[0] for row in tx.execute(
        f"SELECT id FROM destinations WHERE id IN ({_placeholders(ids)}) FOR UPDATE SKIP LOCKED", ids).fetchall()]


# The controls step's name in prune_positions (the fits and observations steps keep theirs under their table's name;
# the others start from their first row: what they delete goes).
_CONTROLS_STEP = "link_controls"


def _position(tx: Tx, step: str) -> tuple[int, str] | None:
    """Where ``step`` stopped, as the last pass (of any replica) left it; None: from the first."""
    row = tx.execute("SELECT destination_id, congestion_control FROM prune_positions WHERE step = ?",
                     (step,)).fetchone()
    return (row[0], row[1]) if row else None


def _keep_position(tx: Tx, step: str, position: tuple[int, str] | None) -> None:
    if position is None:
        tx.execute("DELETE FROM prune_positions WHERE step = ?", (step,))
    else:
        tx.execute("INSERT INTO prune_positions (step, destination_id, congestion_control) VALUES (?, ?, ?) "
                   "ON CONFLICT (step) DO UPDATE SET destination_id = excluded.destination_id, "
                   "congestion_control = excluded.congestion_control", (step, *position))


def _take_turn(tx: Tx) -> bool:
    """Whether this batch may prune: on PostgreSQL, PRUNE_LOCK taken for ``tx`` without waiting (False: another
    replica's batch holds it); on SQLite always (``tx`` holds the write lock)."""
    if tx.dialect != "postgresql":
        return True
    return bool(tx.execute(f"SELECT pg_try_advisory_xact_lock({PRUNE_LOCK})").fetchone()[0])


class _Yield(Exception):
    """Another replica's batch holds PRUNE_LOCK: this pass ends."""


def prune(store: Store, retention: Retention, *, pause_s: float = 0.0, max_batches: int = MAX_BATCHES_PER_PASS,
          stop: threading.Event | None = None) -> PruneCounts:
    """One pass: delete what ``retention`` does not keep, ``retention.batch`` rows per transaction
    (a set ``stop`` ends the pass between batches, another replica pruning at once ends it before a batch). Controls
    are released going on from where the last pass stopped (prune_positions)."""
    counts = PruneCounts()
    now = store.clock()
    older_than = now - retention.run_max_age_s if retention.run_max_age_s > 0 else None
    db = store.db
    b = retention.batch

    def batches(step: Callable[[Tx], int]) -> None:
        # A step returns how many rows it went through: fewer than a batch, and none are left.
        for _ in range(max_batches):
            if stop is not None and stop.is_set():
                return
            with db.transaction(write=True) as tx:
                if not _take_turn(tx):
                    raise _Yield
                done = step(tx)
            counts.batches += 1
            if done < b:
                return
            if pause_s:
                time.sleep(pause_s)  # lets waiting writers in between batches

    def past_count(table: str, keep: int) -> Callable[[Tx], int]:
        # Trims each link's rows of ``table`` (fits with their curves, or observations) to ``keep``: up to
        # LINKS_A_BATCH links past the count a batch, after where the last batch (of any pass or replica) stopped
        # (prune_positions, under step ``table``: the link id; its control column unused); a link whose rows fill the
        # batch is gone through again by the next. Every link is reached in turn.
        def step(tx: Tx) -> int:
            position = _position(tx, table)
            ids, after, more = past_count_batch(tx, table, keep, position[0] if position else 0, b)
            if ids:
                if table == "fits":  # a fit's curve goes with it
                    tx.execute(f"DELETE FROM curve_points WHERE fit_id IN ({_placeholders(ids)})", ids)
                tx.execute(f"DELETE FROM {table} WHERE id IN ({_placeholders(ids)})", ids)
            counts.add(table, len(ids))
            _keep_position(tx, table, (after, "") if more else None)
            return b if more else len(ids)  # (batches() goes on while a step has gone through a whole batch)
        return step

    fits = past_count("fits", retention.keep_fits)
    observations = past_count("observations", retention.keep_observations)  # never below the refit window (Retention)

    def runs(tx: Tx) -> int:
        ids = _prunable_runs(tx, retention.keep_runs, older_than, b)
        if ids:
            tx.execute(f"DELETE FROM probe_results WHERE probe_run_id IN ({_placeholders(ids)})", ids)
            tx.execute(f"DELETE FROM probe_runs WHERE id IN ({_placeholders(ids)})", ids)
        counts.add("probe_runs", len(ids))
        return len(ids)

    def raw(tx: Tx) -> int:
        ids = _stale_raw(tx, b)
        if ids:
            tx.execute(f"UPDATE probe_results SET raw = NULL WHERE id IN ({_placeholders(ids)})", ids)
        counts.add("probe_results.raw", len(ids))
        return len(ids)

    def jobs(tx: Tx) -> int:
        ids = _prunable_jobs(tx, retention.keep_runs, older_than, b, now - BUDGET_WINDOW_S)
        if ids:
            tx.execute(f"DELETE FROM probe_jobs WHERE id IN ({_placeholders(ids)}) "
                       "AND status IN ('done', 'failed')", ids)
        counts.add("probe_jobs", len(ids))
        return len(ids)

    def spent(tx: Tx) -> int:
        # Counted in a site's budget by the hour they started in; nothing else reads them.
        ids = [r[0] for r in tx.execute("SELECT id FROM spent_attempts WHERE started_at < ? ORDER BY id LIMIT ?",
                                        (now - BUDGET_WINDOW_S, b)).fetchall()]
        if ids:
            tx.execute(f"DELETE FROM spent_attempts WHERE id IN ({_placeholders(ids)})", ids)
        counts.add("spent_attempts", len(ids))
        return len(ids)

    def keys(tx: Tx) -> int:
        # A key goes with the record it names: bounded as the records are (advisor/idempotency.py).
        gone = " OR ".join(f"(k.kind = '{kind}' AND NOT EXISTS (SELECT 1 FROM {table} t WHERE t.id = k.record_id))"
                           for kind, table in RECORD_TABLES.items())
        ids = [r[0] for r in tx.execute(f"SELECT k.id FROM request_keys k WHERE {gone} ORDER BY k.id LIMIT ?",
                                        (b,)).fetchall()]
        if ids:
            tx.execute(f"DELETE FROM request_keys WHERE id IN ({_placeholders(ids)})", ids)
        counts.add("request_keys", len(ids))
        return len(ids)

    def controls(tx: Tx) -> int:
        # A batch goes through the next ``b`` rows of link_controls in key order, released or not, so a pass that
        # stops (max_batches, ``stop``) has gone through each row once and the next one goes on from there.
        after = _position(tx, _CONTROLS_STEP)
        rows = _controls_after(tx, older_than, after, b)
        idle = {(did, control) for did, control, free in rows if free}
        if idle and db.dialect == "postgresql":
            locked = _lock_unheld(tx, sorted({did for did, _ in idle}))
            idle &= {(did, control) for did, control, free in (
                _controls_after(tx, older_than, after, b, among=locked) if locked else ()) if free}
        for control in sorted({control for _, control in idle}):
            _delete_held(tx, sorted(did for did, c in idle if c == control), control)
        counts.add("link_controls", len(idle))
        counts.resume = (rows[-1][0], rows[-1][1]) if len(rows) == b else None
        _keep_position(tx, _CONTROLS_STEP, counts.resume)
        return len(rows)

    def links(tx: Tx) -> int:
        ids = _idle_links(tx, older_than, b)
        if ids and db.dialect == "postgresql":
            ids = _lock_unheld(tx, ids)
            ids = _idle_links(tx, older_than, b, among=ids) if ids else []
        if ids:
            _delete_held(tx, ids)
            tx.execute("DELETE FROM probe_jobs WHERE status IN ('done', 'failed') AND EXISTS (SELECT 1 FROM "
                       f"destinations d WHERE d.id IN ({_placeholders(ids)}) AND d.src = probe_jobs.src "
                       "AND d.dest = probe_jobs.dest)", ids)
            tx.execute(f"DELETE FROM destinations WHERE id IN ({_placeholders(ids)})", ids)
        counts.add("destinations", len(ids))
        return len(ids)

    def sites(tx: Tx) -> int:
        # A site goes as its last link did, once not registered since (TAME_MAX_SITES counts it until then).
        names = [r[0] for r in tx.execute(f"SELECT s.name FROM sites s WHERE {_IDLE_SITE} ORDER BY s.name LIMIT ?",
                                          (older_than, b)).fetchall()]
        if names:
            tx.execute(f"DELETE FROM sites WHERE name IN ({_placeholders(names)}) AND name IN "
                       f"(SELECT s.name FROM sites s WHERE {_IDLE_SITE})", (*names, older_than))
        counts.add("sites", len(names))
        return len(names)

    # Fits first: a run is kept while a fit rests on it. Raw after runs: what goes anyway is not rewritten first.
    # Controls, then links, last: they go once what they held has gone.
    steps = [fits, runs, raw, observations, jobs, spent]
    if older_than is not None:
        steps += [controls, links, sites]
    steps.append(keys)  # after every step that removes runs and observations
    try:
        for step in steps:
            batches(step)
    except _Yield:
        counts.yielded = True
    return counts


class Pruner:
    """A daemon thread that prunes the store every ``retention.interval_s`` seconds (0: never); ``recover``, when
    given, runs first in each pass (a server without a probe worker re-queues jobs whose lease ran out with it). Each
    pass goes on releasing controls where the one before, of any replica, stopped (prune_positions)."""

    def __init__(self, store: Store, retention: Retention, pause_s: float = 0.05,
                 recover: Callable[[], object] | None = None, max_batches: int = MAX_BATCHES_PER_PASS):
        self.store = store
        self.retention = retention
        self.pause_s = pause_s
        self.recover = recover
        self.max_batches = max_batches
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.retention.interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="tame-prune", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run_pass(self) -> PruneCounts:
        """One pass (``recover`` first)."""
        if self.recover is not None:
            self.recover()
        return prune(self.store, self.retention, pause_s=self.pause_s, max_batches=self.max_batches, stop=self._stop)

    def _loop(self) -> None:
        while not self._stop.wait(self.retention.interval_s):
            try:
                counts = self.run_pass()
            except AdvisorError as exc:  # a store briefly unavailable: the next pass tries again
                log.warning("pruning the store failed: %s", exc)
                continue
            if any(counts.deleted.values()):
                log.info("pruned %s", ", ".join(f"{n} {t}" for t, n in counts.deleted.items() if n))
