"""Sites and their agents: a site's registration (its budget, its links and the probes they are due), its agents'
claims of its queued probes and their reports of the ones they could not run, and the host names whose lookups timed
out in its registrations.

:class:`SiteDesk` holds them; :class:`advisor.service.AdviceService`, the one object callers use, inherits them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from advisor.allowlist import RESOLVE_TIMEOUT_S, Resolver
from advisor.destinations import Destination, parse_destination
from advisor.errors import (AdvisorError, DestinationNotAllowed, InvalidRequest, LookupsBusy, LookupTimedOut,
                            LookupUnfinished, QueueFull, UnknownProbe)
from advisor.jobs import Job
from advisor.limits import check_owner, check_site, MAX_SITE_STREAMS
from advisor.links import advised
from advisor.plan_runner import adaptive_probes, lease_settings, plan_for, plan_need_text, plan_needs
from advisor.settings import Settings
from advisor.slownames import SlowNames
from advisor.sites import SITE_CEILING_VARIABLES, SiteBudget, claim_job, holds, register_site, site_use
from advisor.store import Store

# A site's links are probed again once their evidence is this fraction of the TTL old, so that with agents
# keeping up they are never served stale.
REPROBE_AT_TTL = 0.8
# Claimed jobs to destinations no longer allowed that one claim fails before it answers with none (the next claim
# goes on).
MAX_REFUSED_IN_A_CLAIM = 16
# Seconds one registration may start looking its destinations' names up; the names left are refused, saying so. A
# lookup started within them may take two RESOLVE_TIMEOUT_S more (its wait for a slot, then its own deadline), so a
# registration answers within 25 s, before tame agent stops waiting for it (SERVICE_TIMEOUT_S, 30 s); with 30 s here,
# six names that time out made every registration of their site outlast that, and its agent never claimed a probe.
REGISTRATION_LOOKUPS_S = 15.0
# Names whose lookup last timed out in a site's registration, the most remembered in all, every site's
# (advisor.slownames.SlowNames: each registration checks its site's last, oldest timeout first).
SLOW_NAMES_KEPT = 4096


def fresh_destinations(paths: list[dict[str, Any]], control: str, unrecorded_control: str | None,
                       max_age_s: float | None = None) -> set[str]:
    """Destinations whose advice under ``control`` is fresh (GET /v1/paths rows of one site): not stale, not due for a
    probe (``reprobe_due``: advisor.freshness), and no older than ``max_age_s`` when it is given. When ``control`` is
    ``unrecorded_control`` (the service's default; None: not known), the fit its advice rests on may be one that
    recorded no control (advisor.links.advised), as the service's advice does for its default and no other control."""
    held: dict[str, list[dict[str, Any]]] = {}
    for p in paths:
        held.setdefault(p["dest"], []).append(p)
    advice_paths = (advised(((p["congestion_control"], p["probed_at"], p) for p in of_dest), control,
                            unrecorded_control) for of_dest in held.values())
    # .get: a service older than reprobe_due (an agent pushing to it) judges by stale alone.
    return {p["dest"] for p in advice_paths if p is not None and not p["stale"] and not p.get("reprobe_due")
            and (max_age_s is None or p["age_s"] <= max_age_s)}


def _probe_id(job_id: str) -> str:
    """``job_id`` as a path gave it, to look up: one holding a NUL names no job (UnknownProbe, as the store would
    answer), and PostgreSQL, which takes no NUL in text, would fail on it (a 503 for a request's own fault)."""
    if "\x00" in job_id:
        raise UnknownProbe(f"no probe job has id {job_id!r}")
    return job_id


class SiteDesk:
    """A site's registration and its agents' claims, a part of :class:`advisor.service.AdviceService` (which gives it
    ``store``, ``settings``, ``resolver``, ``monotonic``, and the checks and queue of probes (``control``,
    ``check_allowed``, ``_enqueue``, ``probe_status``, ``paths``, ``settle_reuse``))."""

    store: Store
    settings: Settings
    resolver: Resolver
    monotonic: Callable[[], float]

    def __init__(self) -> None:
        # Per site, host names whose lookup timed out in its registrations: its next registration checks them after
        # the others, oldest timeout first, so the names its lookup time did not reach last time are checked this
        # time, and the slow ones in turn, not refused again behind the same ones.
        self._slow_names = SlowNames(SLOW_NAMES_KEPT)

    def register_site(self, site: Any, budget: SiteBudget, dests: Sequence[Any],
                      congestion_control: Any = None, owner: Any = None) -> dict[str, Any]:
        """Register (or refresh) agent ``owner``'s site: its budget (BudgetConflict when the site's live agents run
        with another: advisor.sites.register_site) and its links to ``dests`` (each within the allow-list),
        and queue a probe under ``congestion_control`` (None: the default) for each of its links whose advice is
        missing or REPROBE_AT_TTL of the TTL old (FitRow.evidence_at: a link with recent transfers needs none), or
        whose newest probe is too old (advisor.freshness: /v1/paths' reprobe_due).
        A destination refused (outside the allow-list, not resolving now, or a new link past settings.max_site_links)
        is reported in "refused" and left out, the others registered; when the probe queue is full the rest wait for
        the next registration ("deferred").
        Returns {"site", "links", "queued", "deferred", "refused": [{"dest", "error"}], "budget"}."""
        name = check_site(site, "site")
        agent = None if owner is None else check_owner(owner)
        control = self.control(congestion_control)
        self._check_budget_fits(budget)
        parsed, refused = {}, []
        lookups_until = self.monotonic() + REGISTRATION_LOOKUPS_S
        # Each host looked up once a registration, however often (spellings, ports) it is listed: its addresses, or
        # the refusal its lookup raised. Else a name that times out, listed thrice, spent three lookups' time.
        answers: dict[str, list[str] | AdvisorError] = {}

        def resolver(host: str) -> list[str]:
            if host not in answers:
                try:
                    answers[host] = list(self.resolver(host))
                except (InvalidRequest, LookupUnfinished) as exc:
                    answers[host] = exc
            answer = answers[host]
            if isinstance(answer, AdvisorError):
                raise answer
            return answer

        for text in self._slow_names_last(name, dests):
            try:
                dest = parse_destination(text)
                if (self.settings.allowed.needs_lookup(dest) and dest.host not in answers
                        and self.monotonic() > lookups_until):
                    raise InvalidRequest(f"not checked: this registration's name lookups took their "
                                         f"{REGISTRATION_LOOKUPS_S:g} s (slow DNS): give addresses, or fewer names "
                                         "a registration (the next one checks these ahead of names whose lookup "
                                         "timed out more recently)")
                self._check_remembering_slow_names(name, dest, resolver)
            except (DestinationNotAllowed, InvalidRequest, LookupUnfinished) as exc:
                refused.append({"dest": str(text), "error": str(exc)})
                continue
            parsed[dest.key] = dest
        left_out = register_site(self.store, name, budget, list(parsed.values()), agent,
                                 ceiling=self.settings.site_ceiling, max_links=self.settings.max_site_links)
        for dest, why in left_out:
            del parsed[dest.key]
            refused.append({"dest": dest.key, "error": why})
        fresh = fresh_destinations(self.paths(name), control, self.settings.congestion_control,
                                   REPROBE_AT_TTL * self.settings.ttl_s)
        due = [dest for key, dest in parsed.items() if key not in fresh]
        queued = deferred = 0
        for index, dest in enumerate(due):
            try:
                _, created = self._enqueue(dest, name, control)
            except QueueFull:
                deferred = len(due) - index
                break
            queued += created
        return {"site": name, "links": len(parsed), "queued": queued, "deferred": deferred, "refused": refused,
                "budget": budget.to_json()}

    def _slow_names_last(self, site: str, dests: Sequence[Any]) -> list[Any]:
        """``dests`` in their order, but those whose host name timed out in ``site``'s registrations after the
        others, the one whose timeout was longest ago first."""
        ages = self._slow_names.ages(site)

        def age(text: Any) -> int:
            try:
                return ages.get(parse_destination(text).host, -1)
            except InvalidRequest:
                return -1

        return sorted(dests, key=age) if ages else list(dests)

    def _check_remembering_slow_names(self, site: str, dest: Destination, resolver: Resolver) -> None:
        """:meth:`check_allowed` with ``resolver``, remembering for ``site`` whether ``dest``'s name lookup timed out
        (_slow_names).
        A name the service's busy lookups never started (LookupsBusy) is neither remembered nor forgotten: nothing
        was learnt of it."""
        remember = self._slow_names.looked_up  # resolved, refused for its addresses, or not a name at all
        try:
            self.settings.allowed.check(dest, resolver)
        except LookupTimedOut:
            remember = self._slow_names.timed_out
            raise
        except LookupsBusy:
            remember = None
            raise
        finally:
            if remember is not None:
                remember(site, dest.host)

    def _check_budget_fits(self, budget: SiteBudget) -> None:
        """Refuse a site budget above the operator's ceiling (settings.site_ceiling), or one no probe of the
        configured plan fits (its probes would wait forever)."""
        ceiling = self.settings.site_ceiling
        above = budget.above(ceiling)
        if above:
            raise InvalidRequest("; ".join(
                f"{name} {getattr(budget, name):g} is above {getattr(ceiling, name):g}, the most this service gives "
                f"any site ({SITE_CEILING_VARIABLES[name]}, set by its operator): give at most "
                f"{getattr(ceiling, name):g} (tame agent --{name.replace('_', '-')})" for name in above))
        short = budget.shortfalls(*plan_needs(self.settings))
        if short:
            name, need, have = short[0]
            raise InvalidRequest(f"{name} {have:g} is below {plan_need_text(name, need)}: give at least "
                                 f"{math.ceil(need)}")

    def claim(self, site: Any, owner: Any, max_streams: Any, holding: Sequence[str] | None = None) -> dict[str, Any]:
        """Claim the site's next queued probe for agent ``owner``, within the site's budget (advisor.sites.claim_job;
        ``holding``: the ids of the probes the agent runs, None when it does not say):
        {"site", "job": the job (as GET /v1/probes/ID shows it) or None, "max_streams", "lease_until", "lease_s" (how
        long from now, by this service's clock), "waiting",
        "budget": the budget in force, "use", "plan_settings": this service's settings the lease is worked out from
        (advisor.plan_runner.lease_settings)}; jobs whose agent's lease ran out are queued again first."""
        name = check_site(site, "site")
        check_owner(owner)
        cap = max_streams if isinstance(max_streams, int) and not isinstance(max_streams, bool) else None
        if cap is None or not 1 <= cap <= MAX_SITE_STREAMS:
            raise InvalidRequest(f"max_streams must be a whole number from 1 to {MAX_SITE_STREAMS}; got {max_streams!r}")
        self.store.recover_jobs(self.settings.max_probe_attempts, local_src=self.settings.site)
        for _ in range(MAX_REFUSED_IN_A_CLAIM):
            claimed = claim_job(self.store, name, owner, max_streams=cap,
                                adaptive=adaptive_probes(self.settings.model) > 0, worst_case_s=self.worst_case_s,
                                ceiling=self.settings.site_ceiling, holding=holding)
            if claimed.job is None:
                break
            # Queued before the operator narrowed TAME_ALLOWED_DESTINATIONS or _PORTS: a site's agent checks only its
            # own list, so the service checks its own again here, out of the claim's transaction (a name resolves).
            try:
                self.check_allowed(parse_destination(claimed.job.dest))
                break
            except LookupUnfinished as exc:
                # Nothing is known against the job: it waits, uncounted, and this claim gives none (one claim spends
                # at most one lookup's deadline).
                self.store.defer_attempt(claimed.job.id, owner, name, str(exc), exc.retry_after_s)
                claimed = claimed.none(f"the probe of {claimed.job.dest} could not start: {exc}")
                break
            except DestinationNotAllowed as exc:
                self.store.refuse_attempt(claimed.job.id, owner, name, f"never run: {exc}")
            except InvalidRequest as exc:
                # The name does not resolve now: a failed attempt, as a probe's would be (to the back of the queue),
                # and no other job this claim, so one claim spends at most one attempt of it.
                self.store.fail_attempt(claimed.job.id, owner, name, f"not run: {exc}",
                                        self.settings.max_probe_attempts)
                claimed = claimed.none(f"the probe of {claimed.job.dest} could not start: {exc}")
                break
        else:
            claimed = claimed.none(f"the last {MAX_REFUSED_IN_A_CLAIM} queued probes claimed were to destinations this "
                                   "service no longer allows or cannot resolve now; they failed, saying so: claim again")
        if claimed.job is not None:
            # Settled here, where the store is: the job's "reuses_probe" tells the agent to leave the adaptive level out.
            self.settle_reuse(claimed.job, owner)
        return {"site": name, "job": None if claimed.job is None else self.probe_status(claimed.job.id),
                "max_streams": claimed.streams or None, "lease_until": claimed.lease_until,
                "lease_s": None if claimed.lease_until is None else claimed.lease_until - self.store.clock(),
                "waiting": claimed.waiting, "budget": claimed.budget.to_json(),
                "use": site_use(self.store, name).to_json(), "plan_settings": lease_settings(self.settings)}

    def fail_claim(self, site: Any, job_id: str, owner: Any, error: str) -> dict[str, Any]:
        """Agent ``owner`` of ``site`` could not run its claimed probe ``job_id`` (``error``, as it saw it): the job goes
        back to the queue, behind the site's others, or fails after settings.max_probe_attempts attempts; the site's
        budget counts the seconds the attempt took. The job as GET /v1/probes/ID shows it; UnknownProbe when the
        agent does not hold it."""
        name = check_site(site, "site")
        check_owner(owner)
        job = self.store.fail_attempt(_probe_id(job_id), owner, name, error, self.settings.max_probe_attempts)
        if job is None:
            raise UnknownProbe(f"{owner} of {name} holds no running probe {job_id} (finished, or its lease ran out and "
                               "went to another agent): nothing to report")
        return self.probe_status(job.id)

    def release_claim(self, site: Any, job_id: str, owner: Any, lookup_error: str | None = None) -> dict[str, Any]:
        """Agent ``owner`` of ``site`` hands back its claimed probe ``job_id`` unfinished: it is stopping, and the job
        is queued again at once; or its lookup of the destination's name did not finish (``lookup_error``), and the
        job waits as when this service's own lookup does not (Store.defer_attempt). The attempt is not counted, and
        the site's budget counts the seconds it took. The job as GET /v1/probes/ID shows it; UnknownProbe when the
        agent does not hold it."""
        name = check_site(site, "site")
        check_owner(owner)
        _probe_id(job_id)
        if lookup_error is None:
            job = self.store.release_attempt(job_id, owner, name, f"handed back by {owner}, which stopped; re-queued")
        else:
            job = self.store.defer_attempt(job_id, owner, name, f"at {owner}: {lookup_error}", RESOLVE_TIMEOUT_S)
        if job is None:
            raise UnknownProbe(f"{owner} of {name} holds no running probe {job_id} (finished, or its lease ran out and "
                               "went to another agent): nothing to hand back")
        return self.probe_status(job.id)

    def claimed_job(self, job_id: str | None, owner: str | None, src: str, dest: Destination) -> Job | None:
        """The running job ``job_id`` if ``owner`` holds it as a probe of the link from ``src`` to ``dest``, else
        None (no claim named, or its lease went to another agent: the run is kept, the job stays with its holder).
        Store.record_run checks the same again as it closes the job."""
        if job_id is None or owner is None:
            return None
        try:
            job = self.store.job(job_id)
        except UnknownProbe:
            return None
        return job if holds(self.store, job_id, owner, src, dest.key) else None

    def worst_case_s(self, job: Job) -> float:
        """The longest a job's probe plan may take, seconds (its lease, and what it holds of a site's budget)."""
        return plan_for(self.settings, job.levels, job.duration_s).worst_case_s
