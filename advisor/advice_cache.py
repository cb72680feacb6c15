"""The advice cache: advice entries kept in memory per (src, canonical dest, max_impact, congestion control), at most
_CACHE_LIMIT of them (the least recently read goes first); a write this process makes drops the entries of its link
(see _GENERATION_STRIPES), and for writes made by other processes sharing the database, an entry is never served
older than ``settings.cache_max_age_s`` (see _REFRESH_AHEAD). A read finding its link due for a probe queues one.

:class:`AdviceCache` holds the cache and the advice reads through it (advice, advice_entry, cached_entry, batch);
:class:`advisor.service.AdviceService`, the one object callers use, inherits them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from advisor.alternatives import alternatives, budget_met
from advisor.destinations import parse_destination
from advisor.errors import (AdvisorError, BatchTooLarge, DestinationNotAllowed, InvalidRequest, RetryLater,
                            UnknownDestination)
from advisor.limits import check_max_impact
from advisor.opening import how_to_open
from advisor.settings import Settings
from advisor.store import Store

# The advice service's logger (log lines show its name, and operators filter on it): the cache's lines are the
# service's.
log = logging.getLogger("advisor.service")

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


class AdviceCache:
    """The advice cache and the reads through it, a part of :class:`advisor.service.AdviceService` (which gives it
    ``store``, ``settings``, ``clock``, ``controls``, and the fits read and advised (``_load``, ``_advise_row``), the
    checks of a request's site and control (``site``, ``control``) and ``request_probe``)."""

    store: Store
    settings: Settings
    clock: Callable[[], float]
    controls: Callable[[], Sequence[str]]

    def __init__(self) -> None:
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
        # Store reads of the cache (for /metrics): "unchanged" kept an entry, "reloaded" rebuilt one.
        self._cache_reads = {"unchanged": 0, "reloaded": 0}

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
        freshness = self.settings.freshness
        return entry, freshness.age_s(entry.evidence_at, now), lagging or freshness.stale(entry.evidence_at, now)

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
