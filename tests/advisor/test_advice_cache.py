"""The advice cache under concurrent reads: an expired entry is reloaded by one thread, the rest are
served the previous entry, and a write by another process shows up after the cache's max age."""

import math

from advisor.destinations import parse_destination
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from tests.api.conftest import Clock
from probes.result import ProbeResult
from tests.together import run_together

A, B = 1e-16, 4e-16
DEST = "127.0.0.1:5201"


def rate(n):
    return n / math.sqrt(A * n * n + B)


def counting(store, name):
    """Count calls of store.NAME (the real method still runs)."""
    calls = []
    real = getattr(store, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    setattr(store, name, wrapper)
    return calls


def service_on(path, clock):
    store = Store.open(f"sqlite:///{path}", clock=clock)
    return AdviceService(store, Settings(model="lu"), clock=clock, resolver=lambda host: ["127.0.0.1"])


def ingest(service, throughput_scale=1.0):
    results = [ProbeResult(dest=DEST, streams=n, throughput_bps=rate(n) * throughput_scale, duration_s=10.0,
                           omit_s=0.0, sender_bps=None)
               for n in (1, 10)]
    service.ingest_run(parse_destination(DEST), 0.04, results, service.clock(), source="test")


def read_together(service, threads=16):
    return run_together(lambda i, _: service.advice(DEST, 0.3), threads)


def test_an_expired_entry_is_reloaded_once_not_by_every_reader(tmp_path):
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)
    first = service.advice(DEST, 0.3)
    loads = counting(service.store, "current_fit")
    checks = counting(service.store, "current_fit_id")
    clock.now += service.settings.cache_max_age_s + 1
    answers = read_together(service)
    # Nothing changed in the store: one cheap check, no reload and no refit, for sixteen readers.
    assert loads == [] and len(checks) == 1
    assert all(a["num_flows"] == first["num_flows"] for a in answers)

    # Another process (its own Store on the same file) writes a new fit.
    other = service_on(tmp_path / "s.sqlite3", clock)
    ingest(other, throughput_scale=3.0)
    other.store.close()
    clock.now += service.settings.cache_max_age_s + 1
    answers = read_together(service)
    assert len(loads) == 1, "the new fit is loaded by one reader, not by each"
    newest = service.advice(DEST, 0.3)
    assert newest["fitted_at"] >= first["fitted_at"] and newest["max_nondisruptive_throughput_bps"] > \
        first["max_nondisruptive_throughput_bps"]
    assert {a["max_nondisruptive_throughput_bps"] for a in answers} <= {
        first["max_nondisruptive_throughput_bps"], newest["max_nondisruptive_throughput_bps"]}
    service.store.close()


def test_the_fast_path_serves_an_expired_entry_while_one_thread_refreshes_it(tmp_path):
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)
    service.advice(DEST, 0.3)
    checks = counting(service.store, "current_fit_id")
    clock.now += service.settings.cache_max_age_s + 1
    # Expired: still answered from memory, and one background refresh is started, not one per reader.
    hits = [service.cached_entry(DEST, 0.3) for _ in range(50)]
    assert all(hit is not None and hit[0].payload["dest"] == DEST for hit in hits)
    refreshing = service._refreshing[(service.settings.site, DEST, 0.3, service.settings.congestion_control)]
    with refreshing:  # waits for the refresh to end
        pass
    assert len(checks) == 1
    entry = service.cached_entry(DEST, 0.3)[0]
    assert entry.loaded_at == clock.now and entry is hits[0][0]  # nothing changed: the same entry, renewed
    # An entry whose refreshes have failed for a while is left to the route, which reports why.
    service.store.close()
    clock.now += service.settings.cache_max_age_s + 10
    assert service.cached_entry(DEST, 0.3) is None
