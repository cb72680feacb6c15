"""An observation refits the link on the newest probe run, read before its write transaction: a run pushed in between
must not be hidden behind a refit on the older one (a real SQLite store; the push lands in that window). The refit is
computed before the write transaction: other writers go on meanwhile, and one that stores an observation of the same
link in between is in the refit."""

import threading
import time

import pytest

from advisor.destinations import parse_destination
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from tests.advisor.test_advice_cache import DEST, Clock, ingest, service_on


def test_a_run_pushed_while_an_observation_refits_is_not_hidden_behind_older_probes(tmp_path):
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)  # run 1
    control = service.settings.congestion_control
    store: Store = service.store
    real = store.latest_run_points

    def then_a_run_arrives(*args, **kwargs):
        read = real(*args, **kwargs)  # the refit's base: run 1
        clock.now += 1
        ingest(service, throughput_scale=3.0)  # run 2, with its own fit, committed before the observation's write
        return read

    store.latest_run_points = then_a_run_arrives
    pushed_fit = None
    try:
        got = service.observe(DEST, 4, 1e8)
        store.latest_run_points = real
        pushed_fit = store.current_fit(DEST, control, or_unrecorded=True, src=service.settings.site)
        # The observation is kept; it did not refit on run 1 over run 2's newer fit.
        assert got["accepted"] is True and got["refit"] is False
        assert pushed_fit.observations_used == 0
        # The next observation refits on run 2.
        again = service.observe(DEST, 4, 1e8)
        assert again["refit"] is True
        refit = store.current_fit(DEST, control, or_unrecorded=True, src=service.settings.site)
        assert refit.probed_at == pushed_fit.probed_at and refit.observations_used >= 1
    finally:
        store.latest_run_points = real
        store.close()


def two_services(url, clock):
    """Two services on one store, each with its own connections, as two replicas are."""
    return tuple(AdviceService(Store.open(url, clock=clock), Settings(model="lu"), clock=clock,
                               resolver=lambda host: ["127.0.0.1"]) for _ in range(2))


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_other_writers_go_on_while_an_observation_refits_and_one_between_is_in_the_refit(tmp_path, request, backend):
    url = f"sqlite:///{tmp_path}/s.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    slow, other = two_services(url, Clock())
    ingest(slow)
    control = slow.settings.congestion_control
    fitting, go_on = threading.Event(), threading.Event()
    real = slow.build_fit

    def paused(*args, **kwargs):
        if not fitting.is_set():  # the first refit only: the one computed before the write transaction
            fitting.set()
            assert go_on.wait(30)
        return real(*args, **kwargs)

    slow.build_fit = paused
    answers = {}
    first = threading.Thread(target=lambda: answers.setdefault("slow", slow.observe(DEST, 4, 1e8)))
    first.start()
    try:
        assert fitting.wait(30)
        # While the first observation's refit is computed, another writer stores an observation of the same link,
        # with its own refit, and queues a probe of another destination: neither waits for the first.
        between = threading.Thread(target=lambda: answers.setdefault("other", (
            other.observe(DEST, 8, 2e8), other.store.enqueue_job(parse_destination("127.0.0.9:5201"), [1, 10], 1.0,
                                                                 client="10.0.0.2", src=other.settings.site))))
        between.start()
        between.join(10)
        assert not between.is_alive(), "a writer waited for an observation's refit"
        assert answers["other"][0]["refit"] is True
    finally:
        go_on.set()
        first.join(30)
    try:
        assert answers["slow"]["refit"] is True
        fit = other.store.current_fit(DEST, control, or_unrecorded=True, src=other.settings.site)
        # The first observation's fit is the newest and it counts the one stored in between: computed again.
        assert fit.observations_used == 2
    finally:
        slow.store.close()
        other.store.close()


def test_writers_in_one_process_to_one_link_compute_each_refit_once(tmp_path):
    # Transfers to one busy destination reported at once to one service: each observation's refit, computed before
    # its write transaction, must not be undone by the one stored before it and computed again inside the write lock
    # (four writers: 7 to 10 fits for 4 observations, 40 % fewer transfers a second and longer write locks in
    # python -m benchmarks.observation_writes --links 1). They take turns on the link instead.
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)
    real = service.build_fit
    fits = []

    def slow(*args, **kwargs):
        fits.append(kwargs.get("observations_used"))
        time.sleep(0.05)  # a fit takes its 13-30 ms; here long enough that the writers' refits overlap
        return real(*args, **kwargs)

    service.build_fit = slow
    start = threading.Barrier(4)
    answers = []

    def writer():
        start.wait(10)
        answers.append(service.observe(DEST, 4, 1e8))

    threads = [threading.Thread(target=writer) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(answers) == 4 and all(a["refit"] for a in answers)
        assert sorted(fits) == [1, 2, 3, 4], fits
        fit = service.store.current_fit(DEST, service.settings.congestion_control, or_unrecorded=True,
                                        src=service.settings.site)
        assert fit.observations_used == 4
    finally:
        service.store.close()


@pytest.mark.postgres
def test_two_replicas_refitting_one_link_at_once_leave_a_fit_that_counts_both(pg_url):
    # Two processes (replicas) each store an observation of one link; each one's refit checks its window before the
    # other's observation commits. The fit stored last must count both, not leave out the other's.
    slow, other = two_services(pg_url, Clock())
    ingest(slow)
    # The link's first observation under its control records the control (link_controls) under a row lock of its
    # own; the two below come after one.
    slow.observe(DEST, 2, 5e7)
    control = slow.settings.congestion_control
    fitted, go_on = threading.Event(), threading.Event()

    def pause(step):
        if step == "observation refit":  # its window checked, its fit not yet written
            fitted.set()
            assert go_on.wait(30)

    slow.store._step = pause
    first = threading.Thread(target=lambda: slow.observe(DEST, 4, 1e8))
    first.start()
    try:
        assert fitted.wait(30)
        second = threading.Thread(target=lambda: other.observe(DEST, 8, 2e8))
        second.start()
        second.join(3)  # it waits for the first's commit (or, as before, stored its fit leaving the first out)
    finally:
        go_on.set()
        first.join(30)
    second.join(30)
    try:
        fit = other.store.current_fit(DEST, control, or_unrecorded=True, src=other.settings.site)
        assert fit.observations_used == 3
    finally:
        slow.store.close()
        other.store.close()
