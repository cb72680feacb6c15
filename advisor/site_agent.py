"""An agent at one site of many: registers its site with the central service, claims the site's probes and
pushes their runs (`tame agent --site NAME --server URL`).

Each round it registers the site (its links and probe budget; the service queues a probe for each link whose
advice is missing or stale), then claims queued probes one at a time, runs up to the budget's probes at once,
and pushes each run with the claim's job id so that the service closes the job. A claim is a lease: if this
agent dies, the job goes back to the queue when the lease runs out and another agent of the site claims it; one
that is stopped (``stop``, set on SIGTERM) kills its probes and hands their jobs back at once.
Runs the service did not take wait in the spool (advisor/commands/agent.py) and go first next round.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable

from advisor.allowlist import AGENT, agent_resolver
from advisor.destinations import parse_destination
from advisor.errors import AdvisorError, LookupUnfinished
from advisor.limits import MAX_SITE_PROBES
from advisor.plan_runner import LEASE_SETTINGS, lease_settings_differ, level_chooser, plan_for
from advisor.settings import Settings
from advisor.sites import SiteBudget
from advisor.tame import plan_control
from advisor.worker import probe_target
from probes.base import ProbeDriver
from probes.errors import ProbeError
from probes.plan import PlanResult, run_plan

log = logging.getLogger("tame")

# ProbeResult fields a pushed run does not carry (api.schemas.ProbeResultIn ignores them).
_NOT_PUSHED = ("dest", "stream_rtts", "interval_bps", "interval_side", "settled", "window_throughput_bps",
               "congestion_control", "rtt_min_s", "rtt_max_s")


def run_payload(dest: str, plan: PlanResult, started_at: float, control: str | None,
                **claim: Any) -> dict[str, Any]:
    """POST /v1/probe-runs' body for a finished plan; ``claim``: src, job_id and owner when the run answers a claim."""
    return {"dest": dest, "idle_rtt_s": plan.idle_rtt_s, "started_at": started_at, "congestion_control": control,
            "probes": [{k: v for k, v in dataclasses.asdict(p).items() if k not in _NOT_PUSHED} for p in plan.probes],
            **{k: v for k, v in claim.items() if v is not None}}


# What a plan leaves of its lease at least: the push of its run (the service's lease has 15 s past its own worst case).
LEASE_MARGIN_S = 5.0


def check_plan_fits_lease(worst_case_s: float, lease_s: float | None, settings: Settings,
                          services: dict[str, Any] | None) -> None:
    """ValueError when a plan that may take ``worst_case_s`` could outlast its claim's lease (``lease_s`` from the
    claim; None: a service that does not say): the job would go to another agent mid-probe, and the link would be
    probed twice at once. The message names the agent's ``settings`` that differ from the ``services`` the claim
    gives ("plan_settings"; None: a service that does not say), with both values."""
    if lease_s is None or worst_case_s <= lease_s - LEASE_MARGIN_S:
        return
    outlasts = (f"this agent's probe plan may take {worst_case_s:.0f} s, longer than the {lease_s:.0f} s lease its "
                "claim holds")
    variables = ", ".join(LEASE_SETTINGS.values())
    if services is None:
        raise ValueError(f"{outlasts}: run the agent with the service's {variables} (this service does not say "
                         "its own)")
    differ = lease_settings_differ(settings, services)
    if not differ:
        raise ValueError(f"{outlasts}, though its {variables} are the service's: run the agent and the service at the "
                         "same version of tame")
    raise ValueError(f"{outlasts}: its {'; its '.join(differ)}: run the agent with the service's "
                     + ("value" if len(differ) == 1 else "values"))


@dataclasses.dataclass
class SiteAgent:
    """One agent of ``site``: ``client`` is an api.client.TameClient, ``push(payload)`` sends a run (spooling it
    when the service cannot take it now), ``report_failure(job_id, error)`` a claimed probe that could not run."""

    client: Any
    site: str
    owner: str
    budget: SiteBudget
    settings: Settings
    driver: ProbeDriver
    push: Callable[[dict[str, Any]], bool]
    clock: Callable[[], float]
    # report_failure(job id, error): tells the service a claimed probe could not run (left unreported, its lease
    # runs out and returns it to the queue later).
    report_failure: Callable[[str, str], None] = lambda job_id, error: None
    # hand_back(job id, lookup error): gives back a claimed probe this agent stopped (``stop``) before it ended, queued
    # again at once; or, with the error, one that could not start because this host's lookup of its name did not
    # finish, which the service keeps waiting a while before it is claimed again.
    hand_back: Callable[[str, str | None], None] = lambda job_id, lookup_error=None: None
    log: Callable[[str], None] = lambda line: print(line, flush=True)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    # Every job this agent claimed, by id, to when its lease ends (time.monotonic()): named in each claim while it
    # lasts (see _holding), whether its probe runs or its run waits to be delivered.
    claimed: dict[str, float] = dataclasses.field(default_factory=dict)

    def register(self, dests: list[str]) -> dict[str, Any]:
        """PUT /v1/sites/NAME: the site's links and budget; the service queues the probes that are due."""
        return self.client.register_site(self.site, dests, self.budget.to_json(), self.settings.congestion_control,
                                         owner=self.owner)

    def round(self, dests: list[str]) -> int:
        """Register, then claim and run the site's due probes (up to the budget's at once) until none is left
        or the budget is spent. Returns how many probes ran."""
        answer = self.register(dests)
        self.log(f"tame agent: site {self.site}: {answer['links']} link(s), {answer['queued']} probe(s) queued"
                 + (f", {answer['deferred']} left for the next round (the service's probe queue is full)"
                    if answer["deferred"] else ""))
        for refused in answer["refused"]:
            print(f"tame agent: site {self.site}: {refused['dest']} left out: {refused['error']}", file=sys.stderr,
                  flush=True)
        ran = 0
        running: dict[Future, str] = {}  # each probe running, by its job's id
        with ThreadPoolExecutor(max_workers=self.budget.max_probes, thread_name_prefix="tame-site-probe") as pool:
            while not self.stop.is_set():
                running = {f: job_id for f, job_id in running.items() if not f.done()}
                if len(running) >= self.budget.max_probes:
                    self.stop.wait(0.05)
                    continue
                # The jobs this agent holds are named: one the service gave it in an answer that never came back is
                # given again, not left to hold the site's budget until its lease runs out.
                claim = self.client.claim(self.site, self.owner, self.budget.max_streams,
                                          holding=self._holding(running.values()))
                if claim["job"] is None:
                    if not running:
                        if claim["waiting"] != "no queued probe":
                            self.log(f"tame agent: site {self.site}: waiting: {claim['waiting']}")
                        break
                    self.stop.wait(1.0)  # a running probe may free the budget, or its link had the last job
                    continue
                self.claimed[claim["job"]["id"]] = time.monotonic() + float(claim.get("lease_s") or 0.0)
                probe = pool.submit(self._probe, claim)
                probe.add_done_callback(functools.partial(self._finished, claim))  # read, however the round ends
                running[probe] = claim["job"]["id"]
                ran += 1
        return ran

    def _holding(self, running: Iterable[str]) -> list[str]:
        """The jobs to name in a claim: those probing now, then those claimed since whose lease has not ended (their
        run not delivered yet, say: spooled while the service was down, or refused), newest first; at most
        MAX_SITE_PROBES. A job left out (more claims than that in one lease) may be given back and probed once
        more."""
        now = time.monotonic()
        for job_id in [job_id for job_id, ends in self.claimed.items() if ends <= now]:
            del self.claimed[job_id]
        named = list(dict.fromkeys([*running, *reversed(self.claimed)]))
        return named[:MAX_SITE_PROBES]

    def _finished(self, claim: dict[str, Any], future: Future) -> None:
        """A probe's thread ended: one that raised (a bug) is logged, and its claim is reported as failed, so its job
        is queued again now rather than when its lease ends."""
        exc = future.exception()
        if exc is None:
            return
        job = claim["job"]
        log.error("site %s -> %s: the probe of job %s ended with an error", self.site, job["dest"], job["id"],
                  exc_info=exc)
        self.report_failure(job["id"], f"the agent failed: {type(exc).__name__}: {exc}")

    def _probe(self, claim: dict[str, Any]) -> None:
        job = claim["job"]
        dest = job["dest"]
        try:
            parsed = parse_destination(dest)
            # Resolved once: the probes go to the address checked, never to the name again.
            target = probe_target(self.settings.allowed.checked_address(parsed, agent_resolver, AGENT), parsed.port)
            started = self.clock()
            control = job["congestion_control"] or self.settings.congestion_control
            planned = plan_for(self.settings, job["levels"], job["duration_s"], control,
                               reuses_adaptive=job.get("reuses_probe") is not None)
            check_plan_fits_lease(planned.worst_case_s, claim.get("lease_s"), self.settings,
                                  claim.get("plan_settings"))
            plan = run_plan(self.driver, target, planned,
                            next_level=level_chooser(self.settings.model, min(self.settings.n_max, claim["max_streams"])))
            used = plan_control(plan.probes, control)
        except LookupUnfinished as exc:
            # Nothing is known against the job (nothing was probed): handed back to wait, not a failed attempt.
            print(f"tame agent: {self.site} -> {dest}: {exc}; handed back", file=sys.stderr, flush=True)
            self.hand_back(job["id"], str(exc))
            return
        except (AdvisorError, ProbeError, ValueError) as exc:
            if self.stop.is_set():  # stopping killed the probe: not the job's fault, so not a failed attempt
                self.hand_back(job["id"])
                return
            print(f"tame agent: {self.site} -> {dest}: {exc}", file=sys.stderr, flush=True)
            # Its job goes behind the site's others, and the budget counts the seconds it took, not its lease's worth.
            self.report_failure(job["id"], str(exc) or type(exc).__name__)
            return
        self.push(run_payload(dest, plan, started, used, src=self.site, job_id=job["id"], owner=self.owner))
