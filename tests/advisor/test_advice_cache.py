"""The advice cache under concurrent reads: an entry is re-read by one thread, not by every reader, and a
write by another process is served no later than the cache's max age after it committed, or marked stale
while a slow store holds its re-read (a failing store gives its error, never older advice)."""

import math
import threading
import time

import pytest

from advisor.destinations import parse_destination
from advisor.errors import StoreError
from advisor.advice_cache import _LAGGING_LIMIT_S
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


def ingest(service, throughput_scale=1.0, dest=DEST):
    results = [ProbeResult(dest=dest, streams=n, throughput_bps=rate(n) * throughput_scale, duration_s=10.0,
                           omit_s=0.0, sender_bps=None)
               for n in (1, 10)]
    service.ingest_run(parse_destination(dest), 0.04, results, service.clock(), source="test")


def refreshes_done(service, timeout_s=10.0):
    """Wait until no background refresh is queued or running (they run on the service's own threads)."""
    deadline = time.monotonic() + timeout_s
    while service._refresh_pending:
        assert time.monotonic() < deadline, "a background refresh did not end"
        time.sleep(0.005)


def read_together(service, threads=16):
    return run_together(lambda i, _: service.advice(DEST, 0.3), threads)


def test_an_entry_past_the_bound_is_reloaded_once_not_by_every_reader(tmp_path):
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)
    first = service.advice(DEST, 0.3)
    loads = counting(service.store, "current_fit")
    checks = counting(service.store, "current_fit_ids")
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
    # Past the bound nobody is served the entry from before the write: the others waited for the reload.
    assert {a["max_nondisruptive_throughput_bps"] for a in answers} == {newest["max_nondisruptive_throughput_bps"]}
    service.store.close()


def test_the_fast_path_serves_an_entry_due_for_a_re_read_while_one_thread_refreshes_it(tmp_path):
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)
    service.advice(DEST, 0.3)
    checks = counting(service.store, "current_fit_ids")
    clock.now += 0.75 * service.settings.cache_max_age_s
    # Due (past half the bound): still answered from memory, and one background refresh is started, not one per reader.
    hits = [service.cached_entry(DEST, 0.3) for _ in range(50)]
    assert all(hit is not None and hit[0].dest == DEST for hit in hits)
    refreshes_done(service)
    assert len(checks) == 1
    entry = service.cached_entry(DEST, 0.3)[0]
    assert entry.loaded_at == clock.now and entry is hits[0][0]  # nothing changed: the same entry, renewed
    # An entry past the bound is left to the route, which reports why.
    clock.now += service.settings.cache_max_age_s + 0.01
    assert service.cached_entry(DEST, 0.3) is None
    service.store.close()


def test_past_the_bound_a_slow_re_read_is_served_around_marked_stale_and_a_failing_one_reported(tmp_path):
    clock = Clock()
    bound = Settings().cache_max_age_s
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)
    first = service.advice(DEST, 0.3)
    other = service_on(tmp_path / "s.sqlite3", clock)
    ingest(other, throughput_scale=3.0)  # committed now, by another process
    other.store.close()

    # The store is slow: the background re-read started at 0.75 of the bound hangs in it.
    real = service.store.current_fit_ids
    entered, release = threading.Event(), threading.Event()

    def slow(dest_key, **link):
        entered.set()
        assert release.wait(30)
        return real(dest_key, **link)

    service.store.current_fit_ids = slow
    clock.now += 0.75 * bound
    assert service.cached_entry(DEST, 0.3)[0].document(first["age_s"], first["stale"]) == first
    assert entered.wait(10)
    clock.now += 0.5 * bound  # 1.25 times the bound since the entry's store read began
    # Past the bound with its re-read still under way: served at once, by the fast path and the route, and
    # marked stale (it may miss a write committed more than the bound ago, as it does here).
    entry, _, stale = service.cached_entry(DEST, 0.3)
    assert stale and entry.document(0.0, True)["max_nondisruptive_throughput_bps"] == \
        first["max_nondisruptive_throughput_bps"]
    lagging = service.advice(DEST, 0.3)
    assert lagging["stale"] is True and lagging["fitted_at"] == first["fitted_at"]
    release.set()
    refreshes_done(service)
    answer = service.advice(DEST, 0.3)
    assert answer["stale"] is False and answer["max_nondisruptive_throughput_bps"] > \
        first["max_nondisruptive_throughput_bps"]

    # Past the bound with no re-read under way (nobody read it for a while): the reader waits for one.
    service.store.current_fit_ids = slow
    entered.clear()
    release.clear()
    clock.now += 2 * bound
    assert service.cached_entry(DEST, 0.3) is None
    answers = []
    reader = threading.Thread(target=lambda: answers.append(service.advice(DEST, 0.3)))
    reader.start()
    assert entered.wait(10)
    reader.join(0.2)
    assert reader.is_alive() and answers == [], "the reader must wait for the store, not be served the old entry"
    release.set()
    reader.join(30)
    assert answers[0]["stale"] is False and answers[0]["fitted_at"] == answer["fitted_at"]

    # The store fails: past the bound the reader gets the store's error, not the entry it could not re-read.
    def failing(dest_key, **link):
        raise StoreError("the advice store is down")

    service.store.current_fit_ids = failing
    clock.now += bound + 0.01
    assert service.cached_entry(DEST, 0.3) is None
    with pytest.raises(StoreError):
        service.advice(DEST, 0.3)
    # A background re-read that failed is not served around either: its next reader gets the error.
    service.store.current_fit_ids = real
    service.advice(DEST, 0.3)
    service.store.current_fit_ids = failing
    clock.now += 0.75 * bound
    assert service.cached_entry(DEST, 0.3) is not None  # starts the re-read, which fails
    refreshes_done(service)
    clock.now += 0.5 * bound
    assert service.cached_entry(DEST, 0.3) is None
    with pytest.raises(StoreError):
        service.advice(DEST, 0.3)

    # A re-read that hangs is served around for _LAGGING_LIMIT_S at most, then waited for.
    service.store.current_fit_ids = real
    service.advice(DEST, 0.3)
    service.store.current_fit_ids = slow
    entered.clear()
    release.clear()
    clock.now += 0.75 * bound
    service.cached_entry(DEST, 0.3)
    assert entered.wait(10)
    clock.now += _LAGGING_LIMIT_S - bound  # 0.75 of the bound short of the limit
    assert service.cached_entry(DEST, 0.3)[2] is True
    clock.now += 1.0
    assert service.cached_entry(DEST, 0.3) is None
    release.set()
    refreshes_done(service)
    service.store.close()


def test_a_queued_refresh_keeps_no_reader_waiting_nor_makes_its_key_stale(tmp_path):
    # Keys share _REFRESH_STRIPES locks; a refresh waiting for one of the two refresh threads must not hold its
    # key's, or a reader of any other key on that lock waits behind the whole queue (and the store's slowness).
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    other = "127.0.0.1:5202"
    ingest(service)
    ingest(service, dest=other)
    site, cc = service.settings.site, service.settings.congestion_control
    lock = lambda dest, budget: service._refresh_lock((site, dest, budget, cc))  # noqa: E731
    budgets = [i / 100_000 for i in range(1, 100_000)]  # enough that one lands on any given lock
    busy = [budgets[0], next(b for b in budgets if lock(DEST, b) is not lock(DEST, budgets[0]))]  # both threads'
    queued = next(b for b in budgets if lock(other, b) not in {lock(DEST, b) for b in busy})
    missed = next(b for b in budgets if b != queued and lock(other, b) is lock(other, queued))
    for budget in busy:
        service.advice(DEST, budget)
    service.advice(other, queued)

    # The store is slow for DEST: its two refreshes take both refresh threads, and other's waits in the queue.
    real = service.store.current_fit_ids
    entered, release = threading.Semaphore(0), threading.Event()

    def slow(dest_key, **link):
        if dest_key == DEST:
            entered.release()
            assert release.wait(30)
        return real(dest_key, **link)

    service.store.current_fit_ids = slow
    clock.now += 0.75 * service.settings.cache_max_age_s
    try:
        for budget in busy:
            assert service.cached_entry(DEST, budget) is not None
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
        assert service.cached_entry(other, queued) is not None  # due: its refresh is queued
        answers = []
        reader = threading.Thread(target=lambda: answers.append(service.advice(other, missed)))
        reader.start()
        reader.join(2)
        assert answers and answers[0]["dest"] == other, "a miss waited for a queued refresh of another key"
        # Past the bound: DEST's two re-reads are asking the slow store, so DEST is answered at once, marked stale;
        # other's re-read is only queued (the store was never asked), so its reader reads it itself, fresh.
        clock.now += 0.5 * service.settings.cache_max_age_s
        assert all(service.cached_entry(DEST, budget)[2] is True for budget in busy)
        assert service.advice(DEST, busy[0])["stale"] is True
        assert service.cached_entry(other, queued) is None
        assert service.advice(other, queued)["stale"] is False
        assert service.cached_entry(other, queued)[2] is False
    finally:
        release.set()
    refreshes_done(service)
    # The queued refresh still ran once the threads were free, and found the entry its reader had renewed.
    assert service.cached_entry(other, queued)[0].loaded_at == clock.now
    service.store.close()


@pytest.mark.postgres
def test_a_write_committed_after_a_newer_one_is_not_missed(pg_url):
    # On PostgreSQL two writes to one destination get their fit ids in one order and may commit in the
    # other; a re-read between the two commits must not leave the later-committed one unseen.
    clock = Clock()
    bound = Settings().cache_max_age_s

    def service():
        store = Store.open(pg_url, clock=clock)
        return AdviceService(store, Settings(model="lu", congestion_control="cubic"), clock=clock,
                             resolver=lambda host: ["127.0.0.1"])

    def run(writer, control, scale):
        results = [ProbeResult(dest=DEST, streams=n, throughput_bps=rate(n) * scale, duration_s=10.0, omit_s=0.0,
                               sender_bps=None) for n in (1, 10)]
        writer.ingest_run(parse_destination(DEST), 0.04, results, clock(), source="test", congestion_control=control)

    reader, slow, fast = service(), service(), service()
    try:
        run(fast, "cubic", 1.0)
        run(fast, "bbr", 1.0)
        first = reader.advice(DEST, 0.3, "cubic")
        fitted, go_on = threading.Event(), threading.Event()

        def pause(step):
            if step == "job":  # its fit is written, not committed
                fitted.set()
                assert go_on.wait(30)

        slow.store._step = pause
        late = threading.Thread(target=run, args=(slow, "cubic", 3.0))
        late.start()
        assert fitted.wait(30)
        run(fast, "bbr", 2.0)  # a newer fit id, committed first
        clock.now += bound + 0.01
        # The cubic fit is not committed yet: the same advice, rebuilt (bbr's changed).
        assert reader.advice(DEST, 0.3, "cubic")["max_nondisruptive_throughput_bps"] == \
            first["max_nondisruptive_throughput_bps"]
        go_on.set()
        late.join(30)
        clock.now += bound + 0.01
        now = reader.advice(DEST, 0.3, "cubic")
        assert now["max_nondisruptive_throughput_bps"] > first["max_nondisruptive_throughput_bps"]
    finally:
        for s in (reader, slow, fast):
            s.store.close()
