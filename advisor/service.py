"""The advice service: answers advice, curve and path queries from the store, queues probes, takes observations.

Everything the HTTP API and the CLI do goes through here; it knows nothing of HTTP.
Advice is per link: a source site (``src``; default this service's own, settings.site) and a destination.
It is cached in memory per (src, canonical dest, max_impact, congestion control), at most _CACHE_LIMIT entries
(the least recently read goes first); a write this process makes drops the entries of its link (see
_GENERATION_STRIPES), and for writes made by other processes sharing the database, an entry is never served older than ``settings.cache_max_age_s``
(see _REFRESH_AHEAD).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from advisor.advice import Advice, curve_to_json
from advisor.alternatives import alternatives, budget_met
from advisor.allowlist import RESOLVE_TIMEOUT_S, Resolver, system_resolver
from advisor.destinations import Destination, client_key, parse_destination
from advisor.errors import (AdvisorError, BatchTooLarge, DestinationNotAllowed, InvalidRequest, LookupsBusy,
                            LookupTimedOut, LookupUnfinished, QueueFull, RetryLater, UnknownDestination, UnknownProbe)
from advisor.curves import curve_of
from advisor.fitcodec import fit_from_stored, fit_to_record
from advisor.idempotency import KeyedRequest
from advisor.jobs import Job
from advisor.limits import (check_available_control, check_congestion_control, check_max_impact, check_probe_duration_s,
                            check_owner, check_probe_levels, check_site, MAX_SITE_STREAMS)
from advisor.observations import Observation
from advisor.opening import how_to_open
from advisor.plan_runner import adaptive_probes, lease_settings, plan_for, plan_need_text, plan_needs
from advisor.settings import Settings
from advisor.slownames import SlowNames
from advisor.sites import (SITE_CEILING_VARIABLES, SiteBudget, claim_job, holds, never_fits, register_site, site_budget,
                           site_use)
from advisor.store import FitRow, NewFit, Store, StoredRun
from advisor.tame import CURVE_VERSION, advise, plan_control, point_from_probe, representative_rtt_s
from models.errors import FitError
from models.parallel import ParallelFit, ProbePoint
from models.registry import MIN_LEVELS, fit
from probes.controls import available_controls
from probes.result import ProbeResult

log = logging.getLogger(__name__)

# Advice entries kept (1.4-2.6 KB each: mostly the advice's JSON, longer when it lists alternatives); past it the
# least recently read is dropped, one at a time.
_CACHE_LIMIT = 50_000
# Write generations, one per stripe of links (a link's stripe: the hash of (src, canonical dest)): a write of this
# process moves its link's stripe on, and an entry loaded under an older generation of its stripe is no longer
# served or kept. A fixed table whatever links are written; a write drops the entries of the links sharing its
# stripe (about 1 in 4,096 of the others), not the whole cache.
_GENERATION_STRIPES = 4096
# Locks that give each key one loader at a time (see _refresh_lock): a fixed table, whatever readers ask for.
_REFRESH_STRIPES = 256
# A stale destination's re-probe is requested at most this often from the read path.
_REFRESH_RETRY_S = 60.0
# The consistency bound: an entry reflects every write committed before its store read began
# (AdviceEntry.loaded_at) and is served only while that is at most settings.cache_max_age_s ago, so advice
# never lags another process's committed write by more. One background thread re-reads an entry once it
# is this fraction of the bound old, while readers are still served it: on a healthy store no reader
# waits. Past the bound while that re-read is asking the store (the store is slow) readers are served the
# entry marked stale: true rather than held by the store; with none asking (an entry nobody read for a while,
# a re-read still queued behind others, or one that failed) they wait for one reload of their own, and a store
# error is reported (503), never hidden behind older advice.
_REFRESH_AHEAD = 0.5
# How long past its store read an entry may be served marked stale while its re-read asks the store; past it
# readers wait for the re-read again, as they did before stale answers (a store that never answers holds them).
_LAGGING_LIMIT_S = 30.0


def _log_unexpected(task: Future) -> None:
    """Log what a background re-read raised beyond the store's errors (nothing waits for its result)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("an advice re-read failed", exc_info=task.exception())


# (src, canonical dest: Destination.key, max_impact, congestion control): what a cached advice entry answers.
# Every part is checked before a key is made, so text that is refused never becomes one.
CacheKey = tuple[str, str, float, str]


@dataclass(eq=False, slots=True)
class AdviceEntry:
    """The advice for one (link, budget, control) as cached: Advice.to_json() plus src, dest, fitted_at, probed_at,
    observations_used and open, kept as the JSON every reader gets (encoded once, when loaded) but for age_s and
    stale; the dict is not kept (with it an entry took twice the memory)."""

    json_prefix: bytes  # the payload's JSON object without its closing brace
    dest: str  # payload["dest"]: the link's canonical destination
    probed_at: float  # payload["probed_at"]: the probes' time (advisor.freshness)
    evidence_at: float  # FitRow.evidence_at: age_s and stale are judged by it
    loaded_at: float
    stripe: int  # the link's write stripe (AdviceService._stripe) and its generation when the entry was read
    generation: int
    fit_ids: tuple[int, ...]  # current fits of the destination, every control, when loaded (alternatives read them all)

    @classmethod
    def of(cls, payload: dict[str, Any], evidence_at: float, loaded_at: float, stripe: int, generation: int,
           fit_ids: tuple[int, ...]) -> "AdviceEntry":
        return cls(json.dumps(payload, separators=(",", ":")).encode()[:-1], payload["dest"], payload["probed_at"],
                   evidence_at, loaded_at, stripe, generation, fit_ids)

    def json_bytes(self, age_s: float, stale: bool) -> bytes:
        """The advice as a reader gets it (GET /v1/advice, batch items), as compact JSON."""
        return (self.json_prefix + b',"age_s":' + json.dumps(age_s).encode()
                + (b',"stale":true}' if stale else b',"stale":false}'))

    def document(self, age_s: float, stale: bool) -> dict[str, Any]:
        """``json_bytes(age_s, stale)`` decoded (`tame advise` and other in-process readers)."""
        return json.loads(self.json_bytes(age_s, stale))


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
    ``unrecorded_control`` (the service's default; None: not known), a destination with no fit under it counts its
    fit that recorded no control, as the service's advice does for its default and for no other control."""
    recorded = {p["dest"] for p in paths if p["congestion_control"] == control}
    unrecorded_counts = control == unrecorded_control
    # .get: a service older than reprobe_due (an agent pushing to it) judges by stale alone.
    return {p["dest"] for p in paths if not p["stale"] and not p.get("reprobe_due")
            and (max_age_s is None or p["age_s"] <= max_age_s)
            and (p["congestion_control"] == control
                 or (unrecorded_counts and p["congestion_control"] is None and p["dest"] not in recorded))}


def _probe_id(job_id: str) -> str:
    """``job_id`` as a path gave it, to look up: one holding a NUL names no job (UnknownProbe, as the store would
    answer), and PostgreSQL, which takes no NUL in text, would fail on it (a 503 for a request's own fault)."""
    if "\x00" in job_id:
        raise UnknownProbe(f"no probe job has id {job_id!r}")
    return job_id


class AdviceService:
    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float] = time.time,
                 resolver: Resolver = system_resolver,
                 controls: Callable[[], Sequence[str]] = available_controls,
                 monotonic: Callable[[], float] = time.monotonic):
        self.store = store
        self.settings = settings
        store.limit_sites(settings.max_sites, settings.site)
        self.clock = clock
        # Seconds that only go forward: a registration's lookup deadline (REGISTRATION_LOOKUPS_S) is read from it.
        self.monotonic = monotonic
        self.resolver = resolver
        # The congestion controls a probe run here may use (read when a probe is asked for: modules load).
        self.controls = controls
        # Least recently read first; guarded by _lock.
        self._cache: OrderedDict[CacheKey, AdviceEntry] = OrderedDict()
        self._cache_limit = _CACHE_LIMIT
        self._generations = [0] * _GENERATION_STRIPES  # per stripe of links; guarded by _lock
        # When the read path last asked for each link's probe: a key per link read with advice (writers add links;
        # pruned links leave theirs, dropped with the rest at _CACHE_LIMIT, see _reprobe).
        self._refresh_requested: dict[tuple[str, str, str], float] = {}
        # One thread at a time brings an expired entry up to date; the others serve the previous one.
        self._refresh_locks = tuple(threading.Lock() for _ in range(_REFRESH_STRIPES))
        # Keys submitted for a background refresh and not yet done with it; guarded by _lock. Each was cached when
        # submitted, and at most _cache_limit are kept (see _refresh_in_background).
        self._refresh_pending: set[CacheKey] = set()  # queued or running background re-reads
        self._refresh_reading: set[CacheKey] = set()  # of those, the ones asking the store now
        self._refresher: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        # Store reads of the cache (for /metrics): "unchanged" kept an entry, "reloaded" rebuilt one.
        self._cache_reads = {"unchanged": 0, "reloaded": 0}
        # Per site, host names whose lookup timed out in its registrations: its next registration checks them after
        # the others, oldest timeout first, so the names its lookup time did not reach last time are checked this
        # time, and the slow ones in turn, not refused again behind the same ones.
        self._slow_names = SlowNames(SLOW_NAMES_KEPT)

    # -- writes and cache -----------------------------------------------------------------

    def on_enqueue(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after a probe job is queued (the local worker wakes up)."""
        self._listeners.append(listener)

    @staticmethod
    def _stripe(src: str, dest_key: str) -> int:
        """The write stripe of the link from ``src`` to ``dest_key`` (canonical)."""
        return hash((src, dest_key)) % _GENERATION_STRIPES

    def invalidate(self, src: str, dest_key: str) -> None:
        """A write of this process to the link from ``src`` to ``dest_key`` (canonical) committed: the link's cached
        advice is not served again, nor kept by a read that began before the write."""
        with self._lock:
            self._generations[self._stripe(src, dest_key)] += 1

    def drop_cache(self) -> None:
        """Forget all cached advice (the store was written other than through this service)."""
        with self._lock:
            self._generations = [generation + 1 for generation in self._generations]
            self._cache.clear()

    def _no_write_since(self, entry: AdviceEntry) -> bool:
        """No write of this process to the entry's link (or its stripe) since the entry was read."""
        return entry.generation == self._generations[entry.stripe]

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

    def ingest_run(self, dest: Destination, idle_rtt_s: float | None, results: Sequence[ProbeResult],
                   started_at: float, source: str, job_id: str | None = None,
                   address: str | None = None, congestion_control: str | None = None,
                   src: Any = None, job_owner: str | None = None, measured_ago_s: float = 0.0,
                   request: KeyedRequest | None = None,
                   answer: Callable[[StoredRun, str | None], dict[str, Any]] | None = None) -> tuple[StoredRun, str | None]:
        """Fit and store a finished probe run from site ``src`` (None: this service's) and close its job, in one
        transaction: (the stored run, fit error). A run whose probes are older than those of the link's current fit
        under its control (delivered late) is kept as history: the newer fit stays the advice (Store.record_run). ``measured_ago_s``: how long ago the probes ended (a pushed run held back
        by its agent), seconds; the fit's probed_at, and so the advice's age, counts from then. ``request``: the
        client's Idempotency-Key, kept with ``answer(stored run, fit error)`` (AlreadyTaken when it was stored before).

        ``address``: the IP address the probes went to, when this service resolved it. The run and its fit
        are stored under the control the probes report they used, else ``congestion_control`` (the one
        asked for; None: not known). A run whose probes report another control than the one asked for is
        kept under the one they used, and its job fails saying so."""
        try:
            used = plan_control(results, congestion_control)
        except ValueError as exc:
            raise InvalidRequest(f"probes: {exc}") from exc
        points = [point_from_probe(r) for r in results]
        probed_at = self.clock() - measured_ago_s
        error = None
        new_fit = None
        try:
            new_fit = self.build_fit(points, idle_rtt_s, probed_at=probed_at,
                                     congestion_control=used)
        except FitError as exc:
            error = f"the probes could not be fitted: {exc}"
        if error is None and congestion_control is not None and used != congestion_control:
            error = (f"the probes were asked to run under {congestion_control} but used {used} (is {congestion_control} "
                     f"allowed for this process? net.ipv4.tcp_allowed_congestion_control); kept as {used}'s advice")
        site = self.site(src)
        run = self.store.record_run(dest, src=site, source=source, idle_rtt_s=idle_rtt_s, results=results,
                                    started_at=started_at, fit=new_fit, job_id=job_id, job_error=error,
                                    address=address, congestion_control=used, job_owner=job_owner,
                                    max_links=self.settings.max_site_links, request=request,
                                    answer=None if answer is None else lambda stored: answer(stored, error),
                                    probed_at=probed_at)
        self.invalidate(site, dest.key)
        return run, error

    # -- advice ---------------------------------------------------------------------------

    def _current(self, src: str, dest_key: str, control: str) -> FitRow | None:
        """The link's current fit (on the newest probes) under ``control``; for the default control, fits that did
        not record theirs (stored before controls were) answer until one under it is stored."""
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

    def _reprobe_due(self, src: str, control: str, entry: AdviceEntry, now: float) -> str | None:
        """Why the entry's link is due for a probe (advisor.freshness), unless its probe was asked for from the read
        path within _REFRESH_RETRY_S: None then, and when it is not due."""
        due = self.settings.freshness.due(entry.evidence_at, entry.probed_at, now)
        last = self._refresh_requested.get((src, entry.dest, control))
        return due if due is not None and (last is None or now - last >= _REFRESH_RETRY_S) else None

    def _reprobe(self, src: str, control: str, entry: AdviceEntry, now: float) -> None:
        """Queue the probe of the entry's link when it is due; the entry is served as it is meanwhile."""
        due = self._reprobe_due(src, control, entry, now)
        if due is None:
            return
        dest_key = entry.dest
        if len(self._refresh_requested) >= _CACHE_LIMIT:  # links pruned since left keys behind: start again
            self._refresh_requested.clear()
        self._refresh_requested[(src, dest_key, control)] = now
        try:
            self.request_probe(dest_key, congestion_control=control, src=src)
        except (DestinationNotAllowed, InvalidRequest, RetryLater) as exc:
            # The advice is still the best answer; the re-probe is asked for again later (a full queue, or a name
            # lookup that did not finish, among them).
            log.info("advice from %s to %s under %s (%s) not re-probed: %s", src, dest_key, control, due, exc)

    def cached_entry(self, dest_text: str, max_impact: float, control: str | None = None,
                     src: str | None = None) -> tuple[AdviceEntry, float, bool] | None:
        """(entry, age_s, stale) from memory alone, or None when the store is needed (a miss, an entry past
        the consistency bound, or a re-probe to queue). Never blocks: the API answers warm requests with
        it on the event loop. An entry due for a re-read is still served while one background thread brings
        it up to date (no reader waits for the store, none refits)."""
        if isinstance(max_impact, bool) or not isinstance(max_impact, float) or not 0.0 <= max_impact <= 1.0:
            return None
        site, cc = src or self.settings.site, control or self.settings.congestion_control
        # Text spelt as a key is looked up without a parse (a few microseconds): keys are canonical, so only the
        # canonical spelling of an entry's destination can match one.
        key = (site, dest_text, max_impact, cc)
        cached = self._cached(key)
        if cached is None:
            try:
                key = (site, parse_destination(dest_text).key, max_impact, cc)
            except InvalidRequest:
                return None
            cached = self._cached(key)
        now = self.clock()
        if cached is None or not self._no_write_since(cached):
            return None
        lagging = self._lagging(key, cached, now)
        if not lagging and not self._servable(cached, now):
            return None  # no re-read under way, or it failed: the route loads the entry or reports why
        if not lagging and not self._fresh(cached, now):
            self._refresh_in_background(key)
        if self._reprobe_due(key[0], key[3], cached, now) is not None:
            return None  # the route queues the probe
        return self._answer(cached, now, lagging)

    def advice_entry(self, dest_text: str, max_impact: Any, control: Any = None,
                     src: Any = None) -> tuple[AdviceEntry, float, bool]:
        """(entry, age_s, stale) for a budget under a congestion control (None: the default) on the link from
        ``src`` (None: this service's site), from the cache or the store; the probe of a link due for one
        (advisor.freshness: stale, or its newest probe too old) is queued."""
        budget = check_max_impact(max_impact)
        cc = self.control(control)
        site = self.site(src)
        key = (site, parse_destination(dest_text).key, budget, cc)
        now = self.clock()
        cached = self._cached(key)
        lagging = self._lagging(key, cached, now)
        if not lagging and not self._servable(cached, now):
            cached = self._refreshed(key)
        elif not lagging and not self._fresh(cached, now):  # (a lagging entry's re-read is under way)
            self._refresh_in_background(key)
        self._reprobe(site, cc, cached, now)
        return self._answer(cached, now, lagging)

    def advice(self, dest_text: str, max_impact: Any, control: Any = None, src: Any = None) -> dict[str, Any]:
        """Advice.to_json() plus src, dest, fitted_at, probed_at, observations_used, age_s and stale."""
        entry, age_s, stale = self.advice_entry(dest_text, max_impact, control, src)
        return entry.document(age_s, stale)

    def _cached(self, key: CacheKey) -> AdviceEntry | None:
        """The cached entry for ``key``, now the most recently read (None: not cached)."""
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
            return entry

    def _keep(self, key: CacheKey, entry: AdviceEntry) -> None:
        """Cache ``entry`` as the most recently read, unless a write came since it was read; past _cache_limit the
        least recently read entry goes (one, not all: the other readers' entries stay warm)."""
        with self._lock:
            if not self._no_write_since(entry):
                return
            self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_limit:
                self._cache.popitem(last=False)

    def _servable(self, cached: AdviceEntry | None, now: float) -> bool:
        """Within the consistency bound: it may be served."""
        return (cached is not None and self._no_write_since(cached)
                and now - cached.loaded_at <= self.settings.cache_max_age_s)

    def _answer(self, entry: AdviceEntry, now: float, lagging: bool) -> tuple[AdviceEntry, float, bool]:
        """(entry, age_s, stale) as served: stale when its evidence is past the TTL or the entry is lagging."""
        return entry, max(0.0, now - entry.evidence_at), lagging or self.settings.freshness.stale(entry.evidence_at, now)

    def _lagging(self, key: CacheKey, cached: AdviceEntry | None, now: float) -> bool:
        """Past the consistency bound while its background re-read is asking the store (a slow store; not one
        still queued, which its reader does sooner itself), no write of this process since and at most
        _LAGGING_LIMIT_S old: served marked stale instead of waited for."""
        return (cached is not None and self._no_write_since(cached)
                and self.settings.cache_max_age_s < now - cached.loaded_at <= _LAGGING_LIMIT_S
                and key in self._refresh_reading)

    def _fresh(self, cached: AdviceEntry | None, now: float) -> bool:
        """Servable and not yet due for a re-read."""
        return (self._servable(cached, now)
                and now - cached.loaded_at <= _REFRESH_AHEAD * self.settings.cache_max_age_s)

    def _refresh_lock(self, key: CacheKey) -> threading.Lock:
        """The lock held by whichever thread brings ``key``'s entry up to date: one of _REFRESH_STRIPES, by the
        key's hash, so each key has one loader at a time while the table stays the same size whatever is asked
        (keys that share a lock take turns)."""
        return self._refresh_locks[hash(key) % _REFRESH_STRIPES]

    def _refreshed(self, key: CacheKey) -> AdviceEntry:
        """The entry for ``key`` brought up to date by one thread at a time (no stampede when it expires
        under load): the others wait for it and take what it loaded."""
        refreshing = self._refresh_lock(key)
        refreshing.acquire()
        try:
            current = self._cache.get(key)
            if self._servable(current, self.clock()):
                return current
            return self._load_entry(key, current)
        finally:
            refreshing.release()

    def _refresh_in_background(self, key: CacheKey) -> None:
        """Bring ``key``'s entry up to date in the background, unless that is already asked for.

        The stripe lock is taken by the task when it runs, not here: a stripe held while the task waits for one
        of the two refresh threads would make a reader of any other key on that stripe wait behind the queue."""

        def refresh() -> None:
            try:
                with self._refresh_lock(key):
                    current = self._cache.get(key)  # not a read: the entry keeps its place
                    # Evicted or dropped by a write since: its next reader loads it, if it has one.
                    if current is not None and not self._fresh(current, self.clock()):
                        with self._lock:
                            self._refresh_reading.add(key)
                        try:
                            self._load_entry(key, current)  # renews the entry before readers stop lagging
                        finally:
                            with self._lock:
                                self._refresh_reading.discard(key)
            except AdvisorError as exc:  # readers keep the previous entry up to the bound; the route reports it after
                log.warning("advice for %s not refreshed: %s", key[0], exc)
            finally:
                with self._lock:
                    self._refresh_pending.discard(key)

        with self._lock:
            # Past _cache_limit pending keys (the cache turning over faster than two threads re-read it) the
            # entry is left to go past the bound and be reloaded by its reader: the queue stays bounded.
            if key in self._refresh_pending or len(self._refresh_pending) >= self._cache_limit:
                return
            self._refresh_pending.add(key)
            if self._refresher is None:
                self._refresher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tame-advice-refresh")
            refresher = self._refresher
        try:
            refresher.submit(refresh).add_done_callback(_log_unexpected)
        except RuntimeError:  # the interpreter is shutting down
            with self._lock:
                self._refresh_pending.discard(key)

    def _load_entry(self, key: CacheKey, previous: AdviceEntry | None) -> AdviceEntry:
        src, dest_key, budget, control = key
        stripe = self._stripe(src, dest_key)
        generation = self._generations[stripe]
        now = self.clock()
        if previous is not None and previous.generation == generation \
                and self.store.current_fit_ids(dest_key, src=src) == previous.fit_ids:
            # Nothing was written since (not even by another process): keep the advice, and the entry object.
            previous.loaded_at = now
            self._count_read("unchanged")
            self._keep(key, previous)
            return previous
        fit_ids = self.store.current_fit_ids(dest_key, src=src)  # read first: a fit written after it reloads
        row = self._load(src, dest_key, control)
        advice = self._advise_row(row, budget, control)
        if row.congestion_control is None:
            advice = dataclasses.replace(advice, warnings=[*advice.warnings, (
                f"the probes behind this advice did not record their congestion control (stored before it was "
                f"kept, or posted without congestion_control); they are taken to be this service's default, {control}: "
                "probe again, or post runs with their congestion_control, to be sure")])
        if not budget_met(advice):
            measured = {r.congestion_control: (self._advise_row(r, budget, r.congestion_control), r.probed_at)
                        for r in self.store.current_fits(dest_key, src=src)
                        if r.congestion_control is not None and r.congestion_control != control}
            offered = None  # another site's kernel: not known here, every calibrated control is named
            if src == self.settings.site:
                try:
                    offered = self.controls()
                except OSError:
                    offered = None
            remote = None if src == self.settings.site else src
            advice = dataclasses.replace(advice, alternatives=alternatives(dest_key, budget, control, advice,
                                                                           measured, offered, src=remote))
        payload = advice.to_json()
        payload.update(src=src, dest=dest_key, fitted_at=row.fitted_at, probed_at=row.probed_at,
                       observations_used=row.observations_used,
                       open=how_to_open(advice, dest_key, row.idle_rtt_s))
        entry = AdviceEntry.of(payload, row.evidence_at, now, stripe, generation, fit_ids)
        self._count_read("reloaded")
        self._keep(key, entry)
        return entry

    def _count_read(self, result: str) -> None:
        with self._lock:
            self._cache_reads[result] += 1

    def cache_reads(self) -> dict[str, int]:
        """How often the advice cache read the store: {"unchanged": kept an entry, "reloaded": rebuilt one}."""
        with self._lock:
            return dict(self._cache_reads)

    def _advise_row(self, row: FitRow, budget: float, control: str) -> Advice:
        """The advice a stored fit gives for ``budget``, its fractional stream calibrated against the fit's control."""
        fitted = fit_from_stored(row.model, row.params, row.regime, row.probe_streams, row.warnings, row.record)
        probes = [ProbePoint(streams=p["streams"], throughput_bps=p["throughput_bps"]) for p in row.probes]
        return advise(fitted, budget, row.n_max, row.idle_rtt_s, probes,
                      standard_control=row.congestion_control or control)

    def batch(self, items: Sequence[tuple[str, Any, Any, Any]]) -> list[bytes]:
        """One JSON object per (dest, max_impact, cc, src): {"src", "dest", "max_impact", "cc", "advice", "error"}
        as asked, with the advice (AdviceEntry.json_bytes) or null and {"kind", "message"} or null."""
        if len(items) > self.settings.max_batch:
            raise BatchTooLarge(f"batch has {len(items)} items; at most {self.settings.max_batch} are allowed per request")
        out = []
        for dest_text, budget, control, src in items:
            item = json.dumps({"src": src, "dest": dest_text, "max_impact": budget, "cc": control},
                              separators=(",", ":")).encode()[:-1]
            try:
                entry, age_s, stale = self.advice_entry(dest_text, budget, control, src)
                out.append(item + b',"advice":' + entry.json_bytes(age_s, stale) + b',"error":null}')
            except (InvalidRequest, UnknownDestination) as exc:
                error = json.dumps({"kind": type(exc).__name__, "message": str(exc)}, separators=(",", ":"))
                out.append(item + b',"advice":null,"error":' + error.encode() + b"}")
        return out

    def curve(self, dest_text: str, control: Any = None, src: Any = None) -> dict[str, Any]:
        dest = parse_destination(dest_text)
        cc = self.control(control)
        site = self.site(src)
        row = self._load(site, dest.key, cc)
        points = self.store.curve(row.id)
        payload = curve_to_json(row.model, row.params, [p for p, _ in points])
        for entry, (_, advisable) in zip(payload["curve"], points):
            entry["advisable"] = advisable
        now = self.clock()
        payload.update(src=site, dest=dest.key, congestion_control=row.congestion_control or cc, regime=row.regime,
                       warnings=row.warnings, probes=row.probes,
                       fitted_at=row.fitted_at, probed_at=row.probed_at,
                       stale=self.settings.freshness.stale(row.evidence_at, now))
        return payload

    def paths(self, src: Any = None) -> list[dict[str, Any]]:
        """The current fit (on the newest probes) of each (link, control), of the links from ``src`` when it is
        given (None: all), with
        ``reprobe_due``: why the link is due for a probe under that control (advisor.freshness), or None."""
        now = self.clock()
        freshness = self.settings.freshness
        return [
            {"src": row.src, "dest": row.dest, "congestion_control": row.congestion_control, "model": row.model, "regime": row.regime, "params": row.params,
             "fitted_at": row.fitted_at, "probed_at": row.probed_at, "age_s": max(0.0, now - row.evidence_at),
             "stale": freshness.stale(row.evidence_at, now), "reprobe_due": freshness.due(row.evidence_at, row.probed_at, now),
             "observations_used": row.observations_used}
            for row in self.store.current_fits(src=None if src is None else check_site(src))
        ]

    def links(self, src: Any = None) -> list[dict[str, Any]]:
        """Each link (from ``src`` when given): {"src", "dest", "congestion_controls", "evidence_at", "age_s",
        "stale"}, as of its newest evidence (probes or transfers, FitRow.evidence_at) under any control."""
        now = self.clock()
        links: dict[tuple[str, str], dict[str, Any]] = {}
        for row in self.store.current_fits(src=None if src is None else check_site(src)):
            link = links.setdefault((row.src, row.dest), {"src": row.src, "dest": row.dest, "congestion_controls": [],
                                                          "evidence_at": row.evidence_at})
            link["congestion_controls"].append(row.congestion_control)
            link["evidence_at"] = max(link["evidence_at"], row.evidence_at)
        for link in links.values():
            link.update(age_s=max(0.0, now - link["evidence_at"]),
                        stale=self.settings.freshness.stale(link["evidence_at"], now))
        return list(links.values())

    def staleness(self) -> tuple[int, int, float]:
        """(destinations, stale destinations, oldest probe age in seconds) for monitoring."""
        now = self.clock()
        evidence = [row.evidence_at for row in self.store.current_fits()]
        stale = sum(self.settings.freshness.stale(at, now) for at in evidence)
        return len(evidence), stale, max((now - at for at in evidence), default=0.0)

    # -- probes ---------------------------------------------------------------------------

    def check_allowed(self, dest: Destination) -> None:
        """Refuse a destination outside the allow-list as it resolves now (at request time)."""
        self.settings.allowed.check(dest, self.resolver)

    def probe_address(self, dest: Destination) -> str:
        """The IP address a probe of ``dest`` must go to: resolved once here and checked (at run time)."""
        return self.settings.allowed.checked_address(dest, self.resolver)

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
            "error": job.error, "result": None,
        }
        if job.status == "done":
            row = self._current(job.src, job.dest, job.congestion_control or self.settings.congestion_control)
            if row is not None:
                payload["result"] = {"congestion_control": row.congestion_control, "model": row.model, "params": row.params, "regime": row.regime,
                                     "warnings": row.warnings, "probes": row.probes, "fitted_at": row.fitted_at}
        return payload

    # -- sites and their agents --------------------------------------------------------

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
        run_control: str | None = control
        run = self.store.latest_run_points(dest.key, control, src=site)
        if run is None and control == self.settings.congestion_control:
            # As the advice does: runs that did not record their control count as the default's.
            run_control = None
            run = self.store.latest_run_points(dest.key, None, src=site)
        base = [ProbePoint(streams=p["streams"], throughput_bps=p["throughput_bps"], rtt_s=p["rtt_mean_s"],
                           retransmits=p["retransmits"], duration_s=p["duration_s"], mss_bytes=p["mss_bytes"],
                           stream_bps=p["stream_bps"], stream_retransmits=p["stream_retransmits"])
                for p in (run.points if run is not None else ())]

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

        ids = self.store.add_observation(dest, observation, refit, src=site, run_control=run_control,
                                         max_links=self.settings.max_site_links, base_run=run, request=request,
                                         answer=answer)
        self.invalidate(site, dest.key)
        return answer(*ids)
