"""Sites and their agents' claims: which agent probes which link, within its site's probe budget.

An agent at a site registers the site with its links and budget (PUT /v1/sites/NAME, every round: the site's
heartbeat; one budget per site, held by its live agents: :func:`register_site`), then claims the site's queued probe jobs (POST /v1/sites/NAME/claims). A claim is a lease: the job
is the agent's until ``lease_until``; an agent that goes away loses it when the lease runs out
(:meth:`advisor.store.Store.recover_jobs` re-queues it) and another agent of the site claims it. The claims of
one site are serialised on its ``sites`` row (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's write
transactions are serial) so that checking the budget and taking the job are one step; the job is taken with
``FOR UPDATE SKIP LOCKED``, and agents of different sites never wait on one another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, NamedTuple, Sequence

from advisor.destinations import Destination
from advisor.errors import BudgetConflict, InvalidRequest, TooManyLinks
from advisor.jobs import (ANSWERED_JOB, HELD_JOB, JOB_COLUMNS, LOOKUP_RETRY_AHEAD_S, LOOKUP_WAIT_OVER, Job,
                          end_attempt_in, fail_job_in, job_from_row, lock_claims)
from advisor.limits import (BUDGET_WINDOW_S, MAX_SITE_LINKS, MAX_SITE_PROBE_SECONDS_PER_HOUR, MAX_SITE_PROBES,
                            MAX_SITE_STREAMS)
from advisor.store import Store

# How long after its agents' last sign of life (a registration or a claimed probe; one under a lease counts until the
# lease runs out) a site's budget stays held against a different one, seconds. An agent registers every round
# (`tame agent --interval`, default 60 s) and claims through it, so five quiet rounds mean it has gone; an agent
# restarted with a new budget waits this long after its old process's last sign of life.
BUDGET_HOLD_S = 300.0


class Shortfall(NamedTuple):
    """A field of a budget that cannot give what a probe needs: the field, the need, and what the budget has."""

    name: str
    need: float
    have: float


@dataclass(frozen=True)
class SiteBudget:
    """What a site's probes may take at once and per hour: probes, streams, and probe-seconds in any hour."""

    max_probes: int = 1
    max_streams: int = 64
    probe_seconds_per_hour: float = 1800.0

    @classmethod
    def checked(cls, max_probes: Any, max_streams: Any, probe_seconds_per_hour: Any) -> "SiteBudget":
        """The budget as a user gave it, checked; InvalidRequest names the field that is wrong."""
        for name, value, high in (("max_probes", max_probes, MAX_SITE_PROBES),
                                  ("max_streams", max_streams, MAX_SITE_STREAMS)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise InvalidRequest(f"{name} must be a whole number from 1 to {high}; got {value!r}")
        seconds = probe_seconds_per_hour
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or not 1.0 <= seconds <= MAX_SITE_PROBE_SECONDS_PER_HOUR:
            raise InvalidRequest(f"probe_seconds_per_hour must be seconds from 1 to {MAX_SITE_PROBE_SECONDS_PER_HOUR:g}; "
                                 f"got {seconds!r}")
        return cls(max_probes, max_streams, float(seconds))

    def above(self, ceiling: "SiteBudget") -> list[str]:
        """The fields of this budget that are above ``ceiling``'s."""
        return [f.name for f in fields(self) if getattr(self, f.name) > getattr(ceiling, f.name)]

    def shortfalls(self, streams: int, seconds: float) -> list[Shortfall]:
        """The fields of this budget below what a probe (or a plan) needing ``streams`` streams at once and up to
        ``seconds`` probe-seconds takes, max_streams before probe_seconds_per_hour; empty when it fits."""
        return [Shortfall(name, need, getattr(self, name))
                for name, need in (("max_streams", streams), ("probe_seconds_per_hour", seconds))
                if getattr(self, name) < need]

    def capped(self, ceiling: "SiteBudget") -> "SiteBudget":
        """This budget held to ``ceiling``, field by field: the budget in force."""
        return SiteBudget(*(min(getattr(self, f.name), getattr(ceiling, f.name)) for f in fields(self)))

    def to_json(self) -> dict[str, Any]:
        return {"max_probes": self.max_probes, "max_streams": self.max_streams,
                "probe_seconds_per_hour": self.probe_seconds_per_hour}

    def __str__(self) -> str:
        return (f"max_probes={self.max_probes}, max_streams={self.max_streams}, "
                f"probe_seconds_per_hour={self.probe_seconds_per_hour:g}")


# The most any site's budget may be (SiteBudget.checked): the operator's ceiling when none is set
# (advisor.settings.Settings.site_ceiling).
SITE_HARD_CAPS = SiteBudget(MAX_SITE_PROBES, MAX_SITE_STREAMS, MAX_SITE_PROBE_SECONDS_PER_HOUR)

# The operator's ceiling on every site's budget (advisor.settings.Settings.site_ceiling): the variable behind each
# field.
SITE_CEILING_VARIABLES = {"max_probes": "TAME_MAX_SITE_PROBES", "max_streams": "TAME_MAX_SITE_STREAMS",
                          "probe_seconds_per_hour": "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR"}


@dataclass(frozen=True)
class SiteUse:
    """What a site's probes hold of its budget now: running probes, their streams, probe-seconds in the last hour."""

    probes: int
    streams: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"probes": self.probes, "streams": self.streams, "probe_seconds": self.seconds}


@dataclass(frozen=True)
class Claim:
    """A claimed job (None when there is none the budget allows) and why not, when not."""

    job: Job | None
    budget: SiteBudget  # the budget in force: the site's, held to the operator's ceiling
    streams: int = 0  # the most streams the job may open (its adaptive probe included)
    lease_until: float | None = None
    waiting: str | None = None  # why nothing was claimed: "no queued probe" or the budget that is spent

    def none(self, waiting: str) -> "Claim":
        """No job after all, within the same budget, and why (``waiting``)."""
        return Claim(None, self.budget, waiting=waiting)


def _row_lock(store: Store, clause: str = "FOR UPDATE") -> str:
    """``clause`` for the end of a SELECT on PostgreSQL; nothing on SQLite, whose write transactions are serial."""
    return f" {clause}" if store.db.dialect == "postgresql" else ""


def register_site(store: Store, site: str, budget: SiteBudget, dests: Sequence[Destination],
                  owner: str | None = None, *, ceiling: SiteBudget = SITE_HARD_CAPS,
                  max_links: int = MAX_SITE_LINKS) -> list[tuple[Destination, str]]:
    """Create or refresh the site (its budget, last_seen_at) and its links to ``dests`` for agent ``owner``, in one
    transaction; returns the destinations left out, each with why: new links past the site's ``max_links``
    (:meth:`advisor.store.Store.check_new_link`; the others are registered, as the route does with a destination
    outside the allow-list); TooManySites, and nothing stored, when ``site`` would be one more than the store holds
    (:meth:`advisor.store.Store.check_new_site`).

    A site runs with one budget. The same budget is taken from any agent; a different one only from the agent that
    set the one in force (an agent that gives no ``owner`` never did), or once the site's agents have been quiet for
    BUDGET_HOLD_S and none holds a lease; otherwise BudgetConflict, and nothing is stored. So two agents started
    with different budgets do not overwrite each other's every round: the later one is told, and stops. A budget
    held above the operator's ``ceiling`` (lowered since it was set) holds nothing: the service refuses it to every
    agent now, so the site's agents restarted within the ceiling are not made to wait."""
    now = store.clock()
    lock = _row_lock(store)
    with store.db.transaction(write=True) as tx:
        store.check_new_site(tx, site)
        row = None
        for _ in range(2):  # a second time when a pruning pass removed the row between the two statements
            created = tx.execute(
                "INSERT INTO sites (name, max_probes, max_streams, probe_seconds_per_hour, registered_at, "
                "last_seen_at, budget_set_by, budget_set_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (name) DO NOTHING RETURNING name",
                (site, budget.max_probes, budget.max_streams, budget.probe_seconds_per_hour, now, now, owner, now)
            ).fetchone()
            if created is not None:
                break
            # Serialised on the site's row (SQLite's write transactions are serial), so that of two agents
            # registering different budgets at once one sets it and the other is refused.
            row = tx.execute("SELECT max_probes, max_streams, probe_seconds_per_hour, budget_set_by, budget_set_at, "
                             f"last_seen_at FROM sites WHERE name = ?{lock}", (site,)).fetchone()
            if row is not None:
                break
        if created is None:
            held, set_by, set_at, seen_at = SiteBudget(*row[:3]), row[3], row[4], row[5]
            if held == budget:
                tx.execute("UPDATE sites SET last_seen_at = ? WHERE name = ?", (now, site))
            else:
                if (owner is None or owner != set_by) and not held.above(ceiling):
                    lease = tx.execute("SELECT max(lease_until) FROM probe_jobs WHERE src = ? AND status = 'running'",
                                       (site,)).fetchone()[0]
                    held_until = max(seen_at + BUDGET_HOLD_S, lease or 0.0)
                    if now < held_until:
                        raise BudgetConflict(_conflict(site, held, set_by, set_at, budget, now, seen_at, held_until))
                tx.execute("UPDATE sites SET max_probes = ?, max_streams = ?, probe_seconds_per_hour = ?, "
                           "budget_set_by = ?, budget_set_at = ?, last_seen_at = ? WHERE name = ?",
                           (budget.max_probes, budget.max_streams, budget.probe_seconds_per_hour, owner, now, now,
                            site))
        left_out = []
        for dest in dests:
            try:
                store.link_id(tx, site, dest, max_links)
            except TooManyLinks as exc:  # raised before anything of that link is written
                left_out.append((dest, str(exc)))
    return left_out


def _conflict(site: str, held: SiteBudget, set_by: str | None, set_at: float | None, asked: SiteBudget,
              now: float, seen_at: float, held_until: float) -> str:
    who = f"agent {set_by!r}" if set_by else "an agent that gave no owner"
    when = f" {max(0.0, now - set_at):.0f} s ago" if set_at is not None else ""
    return (f"site {site!r} runs with budget {held}, set by {who}{when}, and its agents are alive (last seen "
            f"{max(0.0, now - seen_at):.0f} s ago); this agent asked for {asked}. Run every agent of a site with the "
            f"same budget (--max-probes, --max-streams, --probe-seconds-per-hour), or stop the other one: a new budget "
            f"is taken once the site's agents have been quiet for {BUDGET_HOLD_S:.0f} s and hold no probe "
            f"(in {math.ceil(held_until - now):.0f} s if none is seen meanwhile)")


def site_budget(store: Store, site: str) -> SiteBudget | None:
    """The registered site's budget, or None for a site no agent registered."""
    with store.db.transaction() as tx:
        row = tx.execute("SELECT max_probes, max_streams, probe_seconds_per_hour FROM sites WHERE name = ?",
                         (site,)).fetchone()
    return SiteBudget(*row) if row else None


def _use(tx, site: str, now: float) -> SiteUse:
    running, streams = tx.execute(
        "SELECT count(*), coalesce(sum(streams_reserved), 0) FROM probe_jobs WHERE src = ? AND status = 'running'",
        (site,)).fetchone()
    # Attempts started within the window: a running job counts the longest it may take, a finished one what it
    # took, and an attempt whose lease lapsed (its job re-queued) what Store.recover_jobs kept for it. One
    # statement, so that a job recovered meanwhile is counted once (one snapshot on PostgreSQL).
    since = now - BUDGET_WINDOW_S
    seconds = tx.execute(
        "SELECT (SELECT coalesce(sum(CASE WHEN status = 'running' THEN coalesce(seconds_reserved, 0) "
        "ELSE finished_at - started_at END), 0) FROM probe_jobs WHERE src = ? AND started_at >= ? "
        "AND (status = 'running' OR (status IN ('done', 'failed') AND finished_at IS NOT NULL))) + "
        "(SELECT coalesce(sum(seconds), 0) FROM spent_attempts WHERE src = ? AND started_at >= ?)",
        (site, since, site, since)).fetchone()[0]
    return SiteUse(int(running), int(streams), float(seconds))


def site_use(store: Store, site: str) -> SiteUse:
    with store.db.transaction() as tx:
        return _use(tx, site, store.clock())


# Whether candidate job ``j`` must wait its turn: another site seen within BUDGET_HOLD_S (its agents alive; the
# parameters are that time, then LOOKUP_WAIT_OVER's), whose latest claim was not refused for its budget, has a job
# queued for the same destination, not waiting for its name lookup (so it could take the destination now), and last
# started a probe of it before j's site did (never counts as earliest; on a tie, the one queued first goes first, as the queue orders them). Sites so take turns at a destination
# they share: one site's agents cannot keep it busy (claiming it again and again, or holding claims they never
# finish) while another's probe of it waits.
_LAST_TURN = "coalesce((SELECT max(t.started_at) FROM probe_jobs t WHERE t.src = {src} AND t.dest = j.dest), -1)"
_TURN_WAITS = (
    "EXISTS (SELECT 1 FROM probe_jobs o JOIN sites s ON s.name = o.src WHERE o.dest = j.dest AND o.status = 'queued' "
    "AND o.src <> j.src AND s.last_seen_at >= ? AND s.budget_refused_at IS NULL AND "
    f"{LOOKUP_WAIT_OVER.format(j='o')} AND ("
    f"{_LAST_TURN.format(src='o.src')} < {_LAST_TURN.format(src='j.src')} OR "
    f"({_LAST_TURN.format(src='o.src')} = {_LAST_TURN.format(src='j.src')} AND (o.requested_at < j.requested_at OR "
    "(o.requested_at = j.requested_at AND o.id < j.id)))))")


# Seconds a claim's lease lasts past its plan's worst case: the agent pushes its run as its plan ends.
LEASE_SLACK_S = 15.0


def claim_job(store: Store, site: str, owner: str, *, max_streams: int, adaptive: bool,
              worst_case_s: Callable[[Job], float], lease_slack_s: float = LEASE_SLACK_S,
              ceiling: SiteBudget = SITE_HARD_CAPS, holding: Sequence[str] | None = None) -> Claim:
    """Claim the site's oldest queued job for ``owner`` if the site's budget, held to the operator's ``ceiling``,
    allows it (a budget stored before the ceiling was lowered never takes effect above it).

    The job holds its highest fixed level's streams of the site's stream budget; with an ``adaptive`` probe
    (the model adds one above its fixed levels) it may open, and holds, up to ``max_streams`` (the agent's own
    cap), the site's stream budget shared among its probes at once, and what that budget has left. It holds
    ``worst_case_s(job)`` seconds of the hourly budget while it runs, and its lease lasts that long plus
    ``lease_slack_s``.

    ``holding``: the ids of the probes ``owner`` is running (None: not said). A running job held in ``owner``'s name
    and not among them was claimed by it without its knowing (the answer was lost on the way): it goes back in its
    place in the queue first, the attempt not counted and the seconds since it was claimed charged
    (:func:`_requeue_unknown`), and the claim goes on within the budget, usually giving it again. A queued job that budget could not give even with nothing else running (:func:`never_fits`)
    fails, saying why, and the claim goes on to the next."""
    now = store.clock()
    lock, skip = _row_lock(store), _row_lock(store, "FOR UPDATE SKIP LOCKED")
    with store.db.transaction(write=True) as tx:
        lock_claims(tx)  # claims from other sites check the same running destinations
        row = tx.execute(f"SELECT max_probes, max_streams, probe_seconds_per_hour FROM sites WHERE name = ?{lock}",
                         (site,)).fetchone()
        if row is None:
            raise InvalidRequest(f"site {site!r} is not registered: PUT /v1/sites/{site} first (tame agent does)")
        held = SiteBudget(*row)
        budget = held.capped(ceiling)
        if holding is not None:
            _requeue_unknown(tx, site, owner, holding, now)
        use = _use(tx, site, now)

        def over_budget(waiting: str) -> Claim:
            # Until a claim of its own is granted, the site holds no other site's turn (_TURN_WAITS).
            tx.execute("UPDATE sites SET budget_refused_at = ? WHERE name = ?", (now, site))
            return Claim(None, budget, waiting=waiting)

        if use.probes >= budget.max_probes:
            return over_budget(f"{use.probes} probe(s) of {site} running, at most {budget.max_probes}")
        waited = (now, now + LOOKUP_RETRY_AHEAD_S)  # LOOKUP_WAIT_OVER's
        while True:
            # A destination being probed from any site waits (an iperf3 server runs one test at a time, and two
            # probes through one bottleneck would measure each other); one that another live site also waits for
            # goes to that site first when its turn is older (:data:`_TURN_WAITS`).
            row = tx.execute(
                f"SELECT {JOB_COLUMNS} FROM probe_jobs j WHERE j.src = ? AND j.status = 'queued' AND j.dest NOT IN "
                f"(SELECT dest FROM probe_jobs WHERE status = 'running') AND {LOOKUP_WAIT_OVER.format(j='j')} AND NOT "
                f"{_TURN_WAITS} ORDER BY j.requested_at, j.id LIMIT 1{skip}",
                (site, *waited, now - BUDGET_HOLD_S, *waited)).fetchone()
            if row is None:
                queued, next_lookup = tx.execute(
                    "SELECT count(*), min(CASE WHEN retry_at > ? AND retry_at <= ? THEN retry_at END) FROM probe_jobs "
                    "WHERE src = ? AND status = 'queued'", (*waited, site)).fetchone()
                lookups = ("" if next_lookup is None else ", or their name lookups did not finish as they were to "
                           f"start (the first is tried again in {math.ceil(next_lookup - now)} s)")
                return Claim(None, budget, waiting="no queued probe" if not queued else (
                    f"{queued} queued probe(s) of {site} wait: their destinations are being probed"
                    f"{',' if lookups else ', or'} another site that probed them less recently waits for them "
                    f"too{lookups}"))
            job = job_from_row(row)
            needed, seconds = max(job.levels), worst_case_s(job)
            never = never_fits(site, needed, seconds, held, ceiling)
            if never is None:
                break
            # A job the budget in force could not give even with nothing else running would wait at the head of
            # the site's queue for ever, and every job behind it with it: it fails, and the claim takes the next.
            fail_job_in(tx, job.id, f"never run: {never}", now)
        streams_left = budget.max_streams - use.streams
        if streams_left < needed:
            return over_budget(f"{use.streams} of {site}'s {budget.max_streams} streams are probing; the next probe "
                               f"needs {needed}")
        if use.seconds + seconds > budget.probe_seconds_per_hour:
            return over_budget(f"{use.seconds:.0f} of {site}'s {budget.probe_seconds_per_hour:g} probe-seconds this "
                               f"hour are spent; the next probe may take {seconds:.0f}")
        share = budget.max_streams // budget.max_probes
        streams = max(needed, min(max_streams, streams_left, share)) if adaptive else needed
        lease_until = now + seconds + lease_slack_s
        tx.execute(
            "UPDATE probe_jobs SET status = 'running', started_at = ?, progress = 0, progress_detail = NULL, "
            "attempts = attempts + 1, owner = ?, lease_until = ?, error = NULL, streams_reserved = ?, "
            "seconds_reserved = ? WHERE id = ?",
            (now, owner, lease_until, streams, seconds, job.id))
        tx.execute("UPDATE sites SET last_seen_at = ?, budget_refused_at = NULL WHERE name = ?", (now, site))
    return Claim(store.job(job.id), budget, streams, lease_until)


def _requeue_unknown(tx, site: str, owner: str, holding: Sequence[str], now: float) -> None:
    """Put back in their place in the queue the running jobs of ``site`` held by ``owner`` under a lease not yet
    lapsed but not among the ``holding`` it says it runs (claimed without its knowing: the answer was lost on the
    way), the attempt not counted and its seconds so far kept in spent_attempts, as a lapsed lease's would be. The
    claim then gives the next job as any claim does, within the site's budget: leaving a job out of ``holding`` never
    takes its time off the budget nor renews its lease past it."""
    known = tuple(holding)
    exclude = f" AND id NOT IN ({', '.join('?' * len(known))})" if known else ""
    lock = " FOR UPDATE" if tx.dialect == "postgresql" else ""
    rows = tx.execute(f"SELECT id, attempts, started_at, lease_until FROM probe_jobs WHERE src = ? AND "
                      f"status = 'running' AND owner = ? AND lease_until > ?{exclude} ORDER BY id{lock}",
                      (site, owner, now, *known)).fetchall()
    for job_id, attempts, started_at, lease_until in rows:
        end_attempt_in(tx, HELD_JOB, (job_id, owner), job_id=job_id, src=site,
                        attempts=attempts, started_at=started_at, lease_until=lease_until, now=now, max_attempts=1,
                        gave_up="", requeued=f"given back: {owner} did not name it among the probes it holds",
                        counted=False)


def never_fits(site: str, needed: int, seconds: float, held: SiteBudget, ceiling: SiteBudget) -> str | None:
    """Why a job needing ``needed`` streams and up to ``seconds`` probe-seconds could not run within the budget in
    force (``held``, the site's, capped to ``ceiling``) even with nothing else running, naming what limits it; None
    when it could."""
    short = held.capped(ceiling).shortfalls(needed, seconds)
    if not short:
        return None
    name, need, have = short[0]
    what = {"max_streams": "streams", "probe_seconds_per_hour": "probe-seconds in an hour"}[name]
    capped = getattr(ceiling, name) < getattr(held, name)
    limit = (f"the operator's {SITE_CEILING_VARIABLES[name]}" if capped
             else f"its agents' tame agent --{name.replace('_', '-')}")
    return (f"it needs {math.ceil(need)} {what}; site {site}'s budget in force allows {have:g} "
            f"({limit}): request it with fewer streams or levels, or raise the budget")


def holds(store: Store, job_id: str, owner: str, src: str, dest_key: str) -> bool:
    """True when a run from ``owner`` of the link from ``src`` to ``dest_key`` answers job ``job_id``: ``owner``
    holds it (its lease not yet handed to another agent), or it is back in the queue (:data:`ANSWERED_JOB`)."""
    with store.db.transaction() as tx:
        row = tx.execute(f"SELECT 1 FROM probe_jobs WHERE id = ? AND {ANSWERED_JOB}",
                         (job_id, owner, src, dest_key)).fetchone()
    return row is not None
