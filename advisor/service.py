"""The advice service: answers advice, curve and path queries from the store, queues probes, takes observations.

Everything the HTTP API and the CLI do goes through here; it knows nothing of HTTP.
Advice is per link: a source site (``src``; default this service's own, settings.site) and a destination.
:class:`AdviceService` holds fits, probes, observations and the reads of curves, paths and links; the advice cache
and the advice read through it (advisor.advice_cache) and sites and their agents (advisor.site_desk) are parts of it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Sequence

from advisor.advice import Advice, curve_to_json
from advisor.advice_cache import AdviceCache
from advisor.allowlist import SERVICE, Resolver, system_resolver
from advisor.destinations import Destination, client_key, parse_destination
from advisor.errors import InvalidRequest, UnknownDestination
from advisor.curves import curve_of
from advisor.fitcodec import fit_from_stored, fit_to_record
from advisor.idempotency import KeyedRequest
from advisor.jobs import Job
from advisor.limits import (check_available_control, check_congestion_control, check_probe_duration_s,
                            check_probe_levels, check_site)
from advisor.observations import Observation
from advisor.plan_runner import adaptive_probes, plan_for
from advisor.settings import Settings
from advisor.site_desk import SiteDesk, _probe_id
from advisor.sites import SiteBudget, never_fits, site_budget
from advisor.store import FitRow, NewFit, ReusedProbeGone, Store, StoredRun
from advisor.tame import CURVE_VERSION, advise, plan_control, point_from_probe, representative_rtt_s, stored_point
from models.errors import FitError
from models.parallel import ParallelFit, ProbePoint
from models.registry import MIN_LEVELS, fit
from probes.controls import available_controls
from probes.result import ProbeResult

log = logging.getLogger(__name__)


class AdviceService(AdviceCache, SiteDesk):
    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float] = time.time,
                 resolver: Resolver = system_resolver,
                 controls: Callable[[], Sequence[str]] = available_controls,
                 monotonic: Callable[[], float] = time.monotonic, who: str = SERVICE):
        self.store = store
        self.settings = settings
        store.limit_sites(settings.max_sites, {settings.site, *(site for site, _ in settings.site_tokens)})
        self.clock = clock
        # Seconds that only go forward: a registration's lookup deadline (REGISTRATION_LOOKUPS_S) is read from it.
        self.monotonic = monotonic
        self.resolver = resolver
        # Whose allow-list settings.allowed is, as its refusals name it: AGENT in a `tame agent` (advisor.allowlist).
        self.who = who
        # The congestion controls a probe run here may use (read when a probe is asked for: modules load).
        self.controls = controls
        AdviceCache.__init__(self)
        self._listeners: list[Callable[[], None]] = []
        SiteDesk.__init__(self)

    def on_enqueue(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after a probe job is queued (the local worker wakes up)."""
        self._listeners.append(listener)

    # -- fits -----------------------------------------------------------------------------

    def site(self, name: Any = None) -> str:
        """The source site a request names (checked), or this service's own when it names none."""
        return self.settings.site if name is None else check_site(name)

    def control(self, name: Any = None) -> str:
        """The congestion control a request names (checked), or the service's default when it names none."""
        return self.settings.congestion_control if name is None else check_congestion_control(name)

    def build_fit(self, points: Sequence[ProbePoint], idle_rtt_s: float | None, probed_at: float,
                  observations_used: int = 0, congestion_control: str | None = None) -> NewFit:
        """Fit the configured model and compute its curve; raises FitError if the probes cannot be fitted."""
        empty = sorted({p.streams for p in points if not p.throughput_bps > 0})
        if empty:
            raise FitError(f"the probes at {', '.join(f'{n:g}' for n in empty)} stream(s) carried no data")
        fitted = fit(self.settings.model, points)
        if not all(math.isfinite(v) for v in fitted.params.values()):
            raise FitError(f"the {fitted.model} fit of these probes has non-finite parameters {dict(fitted.params)}")
        return self.stored_fit(fitted, points, idle_rtt_s, probed_at, observations_used, congestion_control)

    def stored_fit(self, fitted: ParallelFit, points: Sequence[ProbePoint], idle_rtt_s: float | None,
                   probed_at: float, observations_used: int = 0, congestion_control: str | None = None) -> NewFit:
        """What the store keeps of ``fitted`` (probed under ``congestion_control``): its record and its curve,
        advisable up to the throughput peak, of the fit as read back from that record (as the advice reads it)."""
        record = fit_to_record(fitted)
        return NewFit(
            record=record, curve=curve_of(record, self.settings.n_max),
            probes=[{"streams": float(p.streams), "throughput_bps": float(p.throughput_bps)} for p in points],
            observations_used=observations_used, idle_rtt_s=representative_rtt_s(points, idle_rtt_s),
            n_max=self.settings.n_max, probed_at=probed_at, congestion_control=congestion_control,
            curve_version=CURVE_VERSION,
        )

    def job_control(self, job: Job) -> str:
        """The control a job probes under: its own, or the default for a job queued before controls were kept."""
        return job.congestion_control or self.settings.congestion_control

    def settle_reuse(self, job: Job, owner: str) -> Job:
        """Running ``job``, held by ``owner``, with its reuse_probe_id settled and kept
        (advisor.store.Store.choose_reuse): for a model with an adaptive probe, the one of the link's last probing under
        the job's control when that may be re-used."""
        # Written every time (cleared for a model without an adaptive probe), so an earlier attempt's choice never lasts.
        within_s = self.settings.reuse_adaptive_within_s if adaptive_probes(self.settings.model) else 0.0
        chosen = self.store.choose_reuse(job, owner, self.job_control(job), within_s)
        return dataclasses.replace(job, reuse_probe_id=chosen)

    def ingest_run(self, dest: Destination, idle_rtt_s: float | None, results: Sequence[ProbeResult],
                   started_at: float, source: str, job_id: str | None = None,
                   address: str | None = None, congestion_control: str | None = None,
                   src: Any = None, job_owner: str | None = None, measured_ago_s: float = 0.0,
                   request: KeyedRequest | None = None,
                   answer: Callable[[StoredRun, str | None], dict[str, Any]] | None = None,
                   job: Job | None = None) -> tuple[StoredRun, str | None]:
        """Fit and store a finished probe run from site ``src`` (None: this service's) and close its job, in one
        transaction: (the stored run, fit error). A run whose probes are older than those of the link's current fit
        under its control (delivered late) is kept as history: the newer fit stays the advice (Store.record_run). ``measured_ago_s``: how long ago the probes ended (a pushed run held back
        by its agent), seconds; the fit's probed_at, and so the advice's age, counts from then. ``request``: the
        client's Idempotency-Key, kept with ``answer(stored run, fit error)`` (AlreadyTaken when it was stored before).
        ``job``: the run's job, whose reuse_probe_id (the earlier probe it re-uses instead of its adaptive level,
        advisor.store.Store.choose_reuse) is fitted and stored with the run, unless the run measured a level beyond
        the job's own (an agent that does not re-use), ran under another control, or the probe is gone (also when it
        goes while the run is stored); the job keeps the id of the probe its run re-used, or none.

        ``address``: the IP address the probes went to, when this service resolved it. The run and its fit
        are stored under the control the probes report they used, else ``congestion_control`` (the one
        asked for; None: not known). A run whose probes report another control than the one asked for is
        kept under the one they used, and its job fails saying so."""
        try:
            used = plan_control(results, congestion_control)
        except ValueError as exc:
            raise InvalidRequest(f"probes: {exc}") from exc
        points = [point_from_probe(r) for r in results]
        reused = None  # (id, the stored probe) of the job's re-used probe, when this run is fitted with it
        if (job is not None and job.reuse_probe_id is not None and {p.streams for p in points} <= set(job.levels)
                and used == self.job_control(job)):  # the agent left the level out, under the control it was chosen for
            stored = self.store.probe_point(job.reuse_probe_id)
            reused = None if stored is None else (job.reuse_probe_id, stored_point(stored))
        probed_at = self.clock() - measured_ago_s
        site = self.site(src)

        def fit_and_record(reused: tuple[int, ProbePoint] | None) -> tuple[StoredRun, str | None]:
            error = None
            new_fit = None
            try:
                new_fit = self.build_fit([*points, *([reused[1]] if reused else [])], idle_rtt_s, probed_at=probed_at,
                                         congestion_control=used)
            except FitError as exc:
                error = f"the probes could not be fitted: {exc}"
            if error is None and congestion_control is not None and used != congestion_control:
                error = (f"the probes were asked to run under {congestion_control} but used {used} (is "
                         f"{congestion_control} allowed for this process? net.ipv4.tcp_allowed_congestion_control); "
                         f"kept as {used}'s advice")
            run = self.store.record_run(dest, src=site, source=source, idle_rtt_s=idle_rtt_s, results=results,
                                        started_at=started_at, fit=new_fit, job_id=job_id, job_error=error,
                                        address=address, congestion_control=used, job_owner=job_owner,
                                        max_links=self.settings.max_site_links, request=request,
                                        answer=None if answer is None else lambda stored: answer(stored, error),
                                        probed_at=probed_at, reused_probe_id=reused[0] if reused else None)
            return run, error

        try:
            run, error = fit_and_record(reused)
        except ReusedProbeGone:  # removed since it was read (retention): the run is fitted on what it measured
            run, error = fit_and_record(None)
        self.invalidate(site, dest.key)
        return run, error

    # -- advice (read through advisor.advice_cache), curves, paths and links -------------

    def _current(self, src: str, dest_key: str, control: str) -> FitRow | None:
        """The link's current fit (on the newest probes) under ``control``; for the default control, the one on the
        newer probes of that and the one that did not record its control (advisor.links.advised)."""
        return self.store.current_fit(dest_key, control, or_unrecorded=control == self.settings.congestion_control,
                                      src=src)

    def _load(self, src: str, dest_key: str, control: str) -> FitRow:
        row = self._current(src, dest_key, control)
        if row is None:
            probed = sorted({r.congestion_control for r in self.store.current_fits(dest_key, src=src)
                             if r.congestion_control})
            under = f" (it has been probed under {', '.join(probed)})" if probed else ""
            # Another site's links are probed by that site's agents, which register with this service.
            site = "" if src == self.settings.site else f"--site {src} --server URL "
            raise UnknownDestination(
                f"no advice from {src} to {dest_key} under {control} yet{under}: request a probe with POST /v1/probes "
                f"{{\"src\": \"{src}\", \"dest\": \"{dest_key}\", \"congestion_control\": \"{control}\"}} (or "
                f"`tame agent {site}--dest-file FILE --congestion-control {control}` at {src}), then ask again when "
                "GET /v1/probes/ID says done"
            )
        return row

    def _advise_row(self, row: FitRow, budget: float, control: str) -> Advice:
        """The advice a stored fit gives for ``budget``, its fractional stream calibrated against the fit's control."""
        fitted = fit_from_stored(row.model, row.params, row.regime, row.probe_streams, row.warnings, row.record)
        probes = [ProbePoint(streams=p["streams"], throughput_bps=p["throughput_bps"]) for p in row.probes]
        return advise(fitted, budget, row.n_max, row.idle_rtt_s, probes,
                      standard_control=row.congestion_control or control)

    def curve(self, dest_text: str, control: Any = None, src: Any = None) -> dict[str, Any]:
        dest = parse_destination(dest_text)
        cc = self.control(control)
        site = self.site(src)
        row = self._load(site, dest.key, cc)
        points = self.store.curve(row.id)
        payload = curve_to_json(row.model, row.params, [p for p, _ in points])
        for entry, (_, advisable) in zip(payload["curve"], points):
            entry["advisable"] = advisable
        now, freshness = self.clock(), self.settings.freshness
        payload.update(src=site, dest=dest.key, congestion_control=row.congestion_control or cc, regime=row.regime,
                       warnings=row.warnings, probes=row.probes,
                       fitted_at=row.fitted_at, probed_at=row.probed_at,
                       age_s=freshness.age_s(row.evidence_at, now), stale=freshness.stale(row.evidence_at, now))
        return payload

    def paths(self, src: Any = None) -> list[dict[str, Any]]:
        """The current fit (on the newest probes) of each (link, control), of the links from ``src`` when it is
        given (None: all), with
        ``reprobe_due``: why the link is due for a probe under that control (advisor.freshness), or None."""
        now = self.clock()
        freshness = self.settings.freshness
        return [
            {"src": row.src, "dest": row.dest, "congestion_control": row.congestion_control, "model": row.model, "regime": row.regime, "params": row.params,
             "fitted_at": row.fitted_at, "probed_at": row.probed_at, "age_s": freshness.age_s(row.evidence_at, now),
             "stale": freshness.stale(row.evidence_at, now), "reprobe_due": freshness.due(row.evidence_at, row.probed_at, now),
             "observations_used": row.observations_used}
            for row in self.store.current_fits(src=None if src is None else check_site(src))
        ]

    def links(self, src: Any = None) -> list[dict[str, Any]]:
        """Each link (from ``src`` when given): {"src", "dest", "congestion_controls", "evidence_at", "age_s",
        "stale"}, as of its newest evidence (probes or transfers, FitRow.evidence_at) under any control."""
        now, freshness = self.clock(), self.settings.freshness
        links: dict[tuple[str, str], dict[str, Any]] = {}
        for row in self.store.current_fits(src=None if src is None else check_site(src)):
            link = links.setdefault((row.src, row.dest), {"src": row.src, "dest": row.dest, "congestion_controls": [],
                                                          "evidence_at": row.evidence_at})
            link["congestion_controls"].append(row.congestion_control)
            link["evidence_at"] = max(link["evidence_at"], row.evidence_at)
        for link in links.values():
            link.update(age_s=freshness.age_s(link["evidence_at"], now), stale=freshness.stale(link["evidence_at"], now))
        return list(links.values())

    def staleness(self) -> tuple[int, int, float]:
        """(destinations, stale destinations, oldest probe age in seconds) for monitoring."""
        now, freshness = self.clock(), self.settings.freshness
        evidence = [row.evidence_at for row in self.store.current_fits()]
        stale = sum(freshness.stale(at, now) for at in evidence)
        return len(evidence), stale, max((freshness.age_s(at, now) for at in evidence), default=0.0)

    # -- probes ---------------------------------------------------------------------------

    def check_allowed(self, dest: Destination) -> None:
        """Refuse a destination outside the allow-list as it resolves now (at request time)."""
        self.settings.allowed.check(dest, self.resolver, self.who)

    def probe_address(self, dest: Destination) -> str:
        """The IP address a probe of ``dest`` must go to: resolved once here and checked (at run time)."""
        return self.settings.allowed.checked_address(dest, self.resolver, self.who)

    def request_probe(self, dest_text: str, levels: Sequence[int] | None = None,
                      duration_s: float | None = None, client: str | None = None,
                      congestion_control: Any = None, src: Any = None) -> tuple[Job, bool]:
        """Queue a probe of the link from ``src`` (None: this service's site, probed here; another site's
        probes wait for that site's agent) under a congestion control (None: the default; for this site one
        this kernel offers), or return the link's active one under it: (job, created). ``client`` (the API's
        remote address), and another site, are each held to settings.max_queued_probes_per_client queued jobs."""
        if client is not None:
            # One key per client, however its address is written (an X-Forwarded-For from a trusted proxy, a
            # dual-stack socket's ::ffff:a.b.c.d) and whichever address of its IPv6 /64 it uses, or it would get a
            # fresh cap with each.
            client = client_key(client)
        dest = parse_destination(dest_text)
        control = self.control(congestion_control)
        site = self.site(src)
        budget = None  # this site's own probes run here, within no site budget
        if site == self.settings.site:
            try:
                offered = self.controls()
            except OSError as exc:
                raise InvalidRequest(f"cannot tell which congestion controls this kernel offers: {exc}") from exc
            check_available_control(control, offered)
        else:
            budget = site_budget(self.store, site)
            if budget is None:
                # Nothing would ever run it: only a registered site's agents claim its probes.
                raise InvalidRequest(f"site {site!r} is not registered, so no agent would run this probe: start `tame "
                                     f"agent --site {site} --server URL` there, or leave src out to probe from "
                                     f"{self.settings.site}")
        self.check_allowed(dest)
        return self._enqueue(dest, site, control, levels, duration_s, client, budget)

    def _enqueue(self, dest: Destination, site: str, control: str, levels: Sequence[int] | None = None,
                 duration_s: float | None = None, client: str | None = None,
                 budget: SiteBudget | None = None) -> tuple[Job, bool]:
        """Queue a probe of a checked link (its destination within the allow-list) under a checked control; one
        that site's ``budget`` (when given), held to the operator's ceiling, could never run is refused."""
        levels = check_probe_levels(self.settings.default_levels if levels is None else levels,
                                    MIN_LEVELS[self.settings.model], self.settings.model)
        duration = check_probe_duration_s(self.settings.default_duration_s if duration_s is None else duration_s)
        if budget is not None:
            # The site's claim would fail it at once (advisor.sites.claim_job); better said to the one asking.
            never = never_fits(site, max(levels), plan_for(self.settings, levels, float(duration)).worst_case_s,
                               budget, self.settings.site_ceiling)
            if never is not None:
                raise InvalidRequest(f"this probe would never run: {never}")
        # A client may ask again once about one job per probe slot has run: a whole default plan.
        retry_after_s = max(1.0, len(self.settings.default_levels) * (self.settings.omit_s + float(duration)))
        job, created = self.store.enqueue_job(dest, levels, float(duration), max_queued=self.settings.max_queued_probes,
                                              retry_after_s=retry_after_s, client=client,
                                              max_queued_per_client=self.settings.max_queued_probes_per_client,
                                              src=site, congestion_control=control,
                                              # Another site's jobs wait for its agents: one site (one token) must
                                              # not fill the queue all sites share.
                                              max_queued_per_src=(None if site == self.settings.site
                                                                  else self.settings.max_queued_probes_per_client),
                                              max_links=self.settings.max_site_links)
        if created:
            for listener in self._listeners:
                listener()
        return job, created

    def probe_status(self, job_id: str) -> dict[str, Any]:
        job = self.store.job(_probe_id(job_id))
        payload: dict[str, Any] = {
            "id": job.id, "src": job.src, "dest": job.dest, "congestion_control": job.congestion_control, "status": job.status,
            "progress": job.progress,
            "progress_detail": job.progress_detail if job.status == "running" else None,
            "levels": job.levels, "duration_s": job.duration_s, "requested_at": job.requested_at,
            "started_at": job.started_at, "finished_at": job.finished_at, "attempts": job.attempts,
            "retry_at": job.lookup_wait_ends(self.store.clock()), "lookup_waits": job.lookup_waits,
            # Queued, a lapsed attempt's choice is no promise: the next attempt settles its own.
            "error": job.error, "reuses_probe": None if job.status == "queued" else job.reuse_probe_id, "result": None,
        }
        if job.status == "done":
            row = self._current(job.src, job.dest, self.job_control(job))
            if row is not None:
                payload["result"] = {"congestion_control": row.congestion_control, "model": row.model, "params": row.params, "regime": row.regime,
                                     "warnings": row.warnings, "probes": row.probes, "fitted_at": row.fitted_at}
        return payload

    # -- observations ---------------------------------------------------------------------

    def observe(self, dest_text: str, streams: Any, throughput_bps: Any, src: Any = None,
                request: KeyedRequest | None = None, **detail: Any) -> dict[str, Any]:
        """Store a finished transfer from site ``src`` (None: this service's) under its standard streams'
        congestion control (None: the default; ``detail``: the other fields of :meth:`Observation.checked`) and,
        when all its streams were standard, refit the link on its newest probes under that control plus its
        standard observations since.

        A transfer with a tame stream is stored with its detail and does not refit (advisor/observations.py).
        Returns {"src", "dest", "congestion_control", "accepted", "refit", "id", "feeds_fit"}; ``request``: the
        client's Idempotency-Key, kept with that answer (AlreadyTaken when it was stored before)."""
        dest = parse_destination(dest_text)
        site = self.site(src)
        observation = Observation.checked(streams, throughput_bps, **detail)
        control = self.control(observation.congestion_control)
        observation = dataclasses.replace(observation, congestion_control=control)
        # An observation becomes advice schedulers read: only for destinations this service may probe.
        self.check_allowed(dest)
        # As the advice does: runs that did not record their control count as the default's.
        or_unrecorded = control == self.settings.congestion_control
        run = self.store.latest_run_points(dest.key, control, or_unrecorded, src=site)
        base = [stored_point(p) for p in (run.points if run is not None else ())]

        def refit(observations: list[dict[str, float]]) -> NewFit | None:
            if run is None:
                # No probe run under this control: transfers alone do not make a curve (nor a "measured" control).
                # At DEBUG, as the next: one line per request a client sends (its answer says refit: false).
                log.debug("observation from %s to %s under %s stored without a refit: no probe run under it", site,
                         dest.key, control)
                return None
            # A transfer's per-stream rates and retransmissions are evidence as a probe's are (loss dispersion).
            points = base + [ProbePoint(streams=o["streams"], throughput_bps=o["throughput_bps"],
                                        duration_s=o["duration_s"], stream_bps=o["stream_bps"],
                                        stream_retransmits=o["stream_retransmits"],
                                        retransmits=sum(o["stream_retransmits"]) if o["stream_retransmits"] else None)
                             for o in observations]
            try:
                # Dated by the run's probes, as the run's own fit was: transfers since do not make them newer
                # (FitRow.evidence_at counts the transfers).
                return self.build_fit(points, run.idle_rtt_s, probed_at=run.probed_at,
                                      observations_used=len(observations), congestion_control=control)
            except FitError as exc:
                log.debug("observation for %s stored without a refit: %s", dest.key, exc)
                return None

        def answer(observation_id: int, fit_id: int | None) -> dict[str, Any]:
            return {"src": site, "dest": dest.key, "congestion_control": control, "accepted": True,
                    "refit": fit_id is not None, "id": observation_id, "feeds_fit": observation.feeds_fit}

        ids = self.store.add_observation(dest, observation, refit, src=site, or_unrecorded=or_unrecorded,
                                         max_links=self.settings.max_site_links, base_run=run, request=request,
                                         answer=answer)
        self.invalidate(site, dest.key)
        return answer(*ids)
