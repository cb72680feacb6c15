"""The probe job queue: jobs, their claims and leases, their attempts (ended, charged to a site's budget,
deferred while a name lookup waits), and the owners (processes) that hold them.

:class:`JobQueue` holds the queue's reads and writes; :class:`advisor.store.Store`, the one object callers use,
inherits them. The functions ending in ``_in`` write inside a caller's transaction (a run's, a site's claim).
"""

from __future__ import annotations

import json
import math
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from advisor.db import Database, Tx
from advisor.destinations import Destination
from advisor.errors import QueueFull, StoreError, UnknownProbe
from advisor.limits import BUDGET_WINDOW_S, MAX_SITE_LINKS, SPENT_ATTEMPTS_BUCKET_S
from advisor.links import same_control
from advisor.locks import CLAIM_LOCK

ACTIVE = ("queued", "running")
# The job a run pushed for a claim closes (parameters: owner, src, dest): the claim's holder's running job, or one
# back in the queue after its lease lapsed (the run came late, from the agent's spool say: the probe it asked for is
# done, and probing the link again would be traffic for nothing), a probe of that link. One another agent holds is not.
# A job its claim's holder still runs (parameters: job id, owner).
HELD_JOB = "id = ? AND owner = ? AND status = 'running'"
# An attempt its prober (a site's agent, this service's worker) holds at its job, a probe of a link from its site
# (parameters: job id, owner, src).
HELD_ATTEMPT = "id = ? AND owner = ? AND src = ? AND status = 'running'"
ANSWERED_JOB = "((status = 'running' AND owner = ?) OR (status = 'queued' AND attempts > 0)) AND src = ? AND dest = ?"
# A job whose destination's name lookup did not finish as it was to start (Store.defer_attempt) is not claimed again
# before the lookup's retry_after_s has passed, twice as long for each such time before (at most LOOKUP_RETRY_MAX_S),
# and the MAX_LOOKUP_WAITS-th such time fails it: with advisor.allowlist's 5 s, a name that never resolves in time is
# tried 12 times over about 2.4 hours (waits of 5 s, 10 s, ... 2560 s, then 3600 s), then its job fails, saying so.
LOOKUP_RETRY_MAX_S = 3600.0
MAX_LOOKUP_WAITS = 12
# A retry_at further ahead of now than this was set by a clock ahead of the one reading it (set back since, or
# another replica's): its wait is over, else a clock set back a day would hold the job a day, one reset by years for
# ever. Twice the longest wait, so replicas whose clocks differ by less than an hour keep each other's waits.
LOOKUP_RETRY_AHEAD_S = 2 * LOOKUP_RETRY_MAX_S
# A queued job ``{j}`` whose wait for its name lookup (above) is over, so it may be claimed (parameters: now, then
# now + LOOKUP_RETRY_AHEAD_S).
LOOKUP_WAIT_OVER = "({j}.retry_at IS NULL OR {j}.retry_at <= ? OR {j}.retry_at > ?)"


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
    retry_at: float | None = None  # not claimed before then: its name lookup did not finish (Store.defer_attempt)
    lookup_waits: int = 0  # such waits since its last attempt that got past its lookup
    # The adaptive probe (probe_results.id) of the link's last probing this job re-uses instead of measuring the level
    # again (advisor.store.Store.choose_reuse): while it runs (and, queued again, for a run its attempt delivers
    # late), the one chosen; once done, the one its run re-used; failed without a run: None. None: the whole plan.
    reuse_probe_id: int | None = None

    def lookup_wait_ends(self, now: float) -> float | None:
        """When the job, queued to wait for its name lookup (Store.defer_attempt), may be claimed again; None when it
        does not wait at ``now`` (LOOKUP_WAIT_OVER's rule)."""
        waits = (self.status == "queued" and self.retry_at is not None
                 and now < self.retry_at <= now + LOOKUP_RETRY_AHEAD_S)
        return self.retry_at if waits else None


JOB_COLUMNS = ("id, dest, status, levels_json, duration_s, requested_at, started_at, finished_at, "
                "progress, attempts, error, probe_run_id, progress_detail, address, congestion_control, src, "
                "retry_at, lookup_waits, reuse_probe_id")


def job_from_row(row) -> Job:
    return Job(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], row[6], row[7], row[8], row[9],
               row[10], row[11], json.loads(row[12]) if row[12] else None, row[13], row[14], row[15], row[16],
               row[17], row[18])


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
               "started_at = CASE WHEN status = 'queued' THEN NULL ELSE started_at END, reuse_probe_id = NULL "
               "WHERE id = ? AND status IN ('queued', 'running')", (now, error, job_id))


def lock_claims(tx: Tx) -> None:
    """Take the claims' lock (advisor.locks.CLAIM_LOCK) for ``tx`` on PostgreSQL; SQLite runs one write transaction at a time."""
    if tx.dialect == "postgresql":
        tx.execute(f"SELECT pg_advisory_xact_lock({CLAIM_LOCK})")


def charge_attempt_in(tx: Tx, src: str, job_id: str, started_at: float, seconds: float) -> None:
    """Keep an attempt's ``seconds`` (from ``started_at``) in spent_attempts, where a site's hourly budget counts them:
    added to the site's row for attempts started in the same SPENT_ATTEMPTS_BUCKET_S (whose job_id is its first
    attempt's), dated by the latest start among them, else in a row of its own."""
    seconds = max(0.0, seconds)
    bucket = math.floor(started_at / SPENT_ATTEMPTS_BUCKET_S) * SPENT_ATTEMPTS_BUCKET_S
    row = tx.execute("SELECT id FROM spent_attempts WHERE src = ? AND started_at >= ? AND started_at < ? "
                     "ORDER BY id LIMIT 1", (src, bucket, bucket + SPENT_ATTEMPTS_BUCKET_S)).fetchone()
    # The row found may be gone by the UPDATE: on PostgreSQL a pruning pass deletes a row dated before the hour
    # (advisor/retention.py) while this attempt, started later in its minute, is still inside it. It then gets a row
    # of its own, not dropped with the one it would have joined.
    if row is not None and tx.execute(
            "UPDATE spent_attempts SET seconds = seconds + ?, "
            "started_at = CASE WHEN started_at < ? THEN ? ELSE started_at END WHERE id = ? RETURNING id",
            (seconds, started_at, started_at, row[0])).fetchone() is not None:
        return
    tx.execute("INSERT INTO spent_attempts (src, job_id, started_at, seconds) VALUES (?, ?, ?, ?)",
               (src, job_id, started_at, seconds))


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
                          f"reuse_probe_id = NULL, error = ? WHERE {held} RETURNING id",
                          (stopped, gave_up, *held_params)).fetchone() is not None
    behind, behind_params = ("requested_at = ?, ", (requeued_at,)) if requeued_at is not None else ("", ())
    # A counted attempt got past its name lookup: a slow one after it starts the waits (Store.defer_attempt) anew.
    uncount = ("lookup_waits = 0, retry_at = NULL, " if counted
               else "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, ")
    # The attempt's reuse choice stays, for a run it delivers late (ANSWERED_JOB); the next attempt settles its own
    # (AdviceService.settle_reuse), and a queued job shows none (AdviceService.probe_status).
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


class JobQueue:
    """The probe job queue's reads and writes, a part of :class:`advisor.store.Store` (which gives it ``db``,
    ``clock`` and the link checks of :class:`advisor.links.Links`)."""

    db: Database
    clock: Callable[[], float]

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
                (src, now - BUDGET_WINDOW_S, now, src, now, now + LOOKUP_RETRY_AHEAD_S)
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
