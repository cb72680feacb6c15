"""The probe worker at the boundary: one resolution per job, owners a restart cannot impersonate,
a bounded queue, one probe per address, and progress while a probe runs (issues 30 and 31)."""

import os
import socket
import threading
import time

import pytest

from advisor.allowlist import AllowList
from advisor.destinations import parse_destination
from advisor.errors import QueueFull
from advisor.jobs import _boot_id, _owner_is_dead_here, _start_ticks, process_owner
from advisor.limits import check_owner
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from advisor.worker import JobProgress, ProbeWorker
from probes.errors import ServerBusy
from probes.fake import FakeDriver
from probes.plan import PlanEvent
from tests.api.conftest import rate
from tests.sites import SITE


def make(tmp_path, resolver, driver, allowed="127.0.0.1/32", **settings):
    store = Store.open(f"sqlite:///{tmp_path}/tame.sqlite3")
    settings = Settings(database_url=store.db.url, allowed=AllowList.parse(allowed), model="lu",
                        default_levels=(1, 10), default_duration_s=1.0, **settings)
    service = AdviceService(store, settings, resolver=resolver)
    return store, service, ProbeWorker(service, driver, poll_s=0.05)


class Changing:
    """A resolver whose answer changes: ``answers[i]`` for the i-th call, the last one after that."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), 0

    def __call__(self, host):
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return answer


# -- defect 1: resolve once, check that address, probe exactly it ------------------------------

def test_the_probes_go_to_the_address_checked_not_the_name(tmp_path):
    # Checked at request time and at run time as 127.0.0.1; any later resolution would say 127.0.0.2.
    resolver = Changing(["127.0.0.1"], ["127.0.0.1"], ["127.0.0.2"])
    driver = FakeDriver(rate, rtt_s=0.01)
    store, service, worker = make(tmp_path, resolver, driver)
    job, _ = service.request_probe("repointed.test:5300")
    assert worker.run_once()
    assert store.job(job.id).status == "done"
    assert {call[1] for call in driver.calls} == {"127.0.0.1:5300"}
    assert resolver.calls == 2
    with store.db.transaction() as tx:
        assert tx.execute("SELECT address FROM probe_runs WHERE job_id = ?", (job.id,)).fetchone()[0] == "127.0.0.1"
    store.close()


def test_a_name_re_pointed_outside_the_list_before_the_job_runs_fails_unprobed(tmp_path):
    driver = FakeDriver(rate, rtt_s=0.01)
    store, service, worker = make(tmp_path, Changing(["127.0.0.1"], ["127.0.0.2"]), driver)
    job, _ = service.request_probe("repointed.test")
    assert worker.run_once()
    final = store.job(job.id)
    assert final.status == "failed" and "DestinationNotAllowed" in final.error and "127.0.0.2" in final.error
    assert driver.calls == []
    store.close()


# -- defect 3: an owner is a process, not a pid -------------------------------------------------

def test_an_owner_is_alive_only_as_the_process_that_wrote_it():
    me = process_owner()
    host, pid, boot, ticks, _ = me.split(":")
    assert (host, int(pid), boot, int(ticks)) == (socket.gethostname(), os.getpid(), _boot_id(), _start_ticks(os.getpid()))
    assert not _owner_is_dead_here(me)
    # Our pid (as PID 1 is after a restart in a PID namespace) with another start time: a reused pid.
    assert _owner_is_dead_here(f"{host}:{pid}:{boot}:{int(ticks) + 1}:x")
    assert _owner_is_dead_here(f"{host}:1:{boot}:{_start_ticks(1) + 1}:x")
    # An earlier boot of this host: every process of it is gone.
    assert _owner_is_dead_here(f"{host}:{pid}:00000000-0000-0000-0000-000000000000:{ticks}:x")
    # Another host's owner is left to its lease.
    assert not _owner_is_dead_here(f"other-{host}:{pid}:{boot}:{int(ticks) + 1}:x")


def test_an_owner_is_a_name_the_service_accepts_even_from_the_longest_host_name(monkeypatch):
    """tame agent registers, claims and pushes its runs under process_owner(): the service's check of an agent's name
    (advisor.limits.check_owner) must take it. Linux host names are at most 64 bytes (HOST_NAME_MAX); pids at most
    7 digits; the boot id is a 36-character UUID; start ticks fit 20 digits: 64 + 7 + 36 + 20 + 8 + 4 colons = 139."""
    me = process_owner()
    assert check_owner(me) == me
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 64)
    longest = process_owner()
    assert check_owner(longest) == longest and len(longest) <= 139


def test_a_job_owned_by_a_reused_pid_is_re_queued_at_once(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/tame.sqlite3")
    job, _ = store.enqueue_job(parse_destination("127.0.0.1"), [1, 10], 1.0, src=SITE)
    host, pid, boot, ticks, _ = process_owner().split(":")
    store.claim_job(f"{host}:1:{boot}:{_start_ticks(1) + 1}:gone", lambda job: 3600, limit=1, src=SITE)
    assert store.recover_jobs(3) == 1
    assert store.job(job.id).status == "queued"
    # The same process (same start time) keeps its job.
    store.claim_job(f"{host}:{pid}:{boot}:{ticks}:alive", lambda job: 3600, limit=1, src=SITE)
    assert store.recover_jobs(3) == 0
    assert store.job(job.id).status == "running"
    store.close()


# -- defect 7: a bounded queue, one probe per address --------------------------------------------

def test_the_queue_is_bounded_in_total(tmp_path):
    store, service, _ = make(tmp_path, lambda host: ["127.0.0.1"], FakeDriver(rate), allowed="127.0.0.0/8",
                             max_queued_probes=3)
    for n in range(1, 4):
        service.request_probe(f"127.0.0.{n}")
    # The destination's own active job is still answered when the queue is full.
    assert not service.request_probe("127.0.0.1")[1]
    with pytest.raises(QueueFull, match="full") as raised:
        service.request_probe("127.0.0.4")
    assert raised.value.retry_after_s >= 1
    assert store.job_counts() == {"queued": 3}
    store.close()


def test_a_queued_job_to_a_busy_address_waits_for_it(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/tame.sqlite3")
    first, _ = store.enqueue_job(parse_destination("a.test"), [1, 10], 1.0, src=SITE)
    second, _ = store.enqueue_job(parse_destination("b.test"), [1, 10], 1.0, src=SITE)
    assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE).id == first.id
    assert store.pin_address(first.id, "h:1:a", "127.0.0.1", 1e12)
    assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE).id == second.id
    assert not store.pin_address(second.id, "h:1:a", "127.0.0.1", 1e12)
    store.release_job(second.id, "h:1:a", "waiting", "127.0.0.1")
    assert (store.job(second.id).status, store.job(second.id).attempts) == ("queued", 0)
    # Not claimed while its address is probed, then claimed once the probe ends.
    assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE) is None
    store.fail_job(first.id, "done with it")
    assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE).id == second.id
    store.close()


class Overlap(FakeDriver):
    """Records the most probes it ever ran at once per destination."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock, self.now, self.most = threading.Lock(), {}, {}

    def run(self, dest, *args, **kwargs):
        with self.lock:
            self.now[dest] = self.now.get(dest, 0) + 1
            self.most[dest] = max(self.most.get(dest, 0), self.now[dest])
        try:
            return super().run(dest, *args, **kwargs)
        finally:
            with self.lock:
                self.now[dest] -= 1


def test_two_names_of_one_host_are_never_probed_at_once(tmp_path):
    driver = Overlap(rate, rtt_s=0.01, delay_s=0.3)
    store, service, worker = make(tmp_path, lambda host: ["127.0.0.1"], driver, max_concurrent_probes=2)
    jobs = [service.request_probe(name)[0] for name in ("one.test", "two.test", "127.0.0.1")]
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while any(store.job(j.id).status not in ("done", "failed") for j in jobs):
            assert time.monotonic() < deadline, [store.job(j.id) for j in jobs]
            time.sleep(0.05)
    finally:
        worker.stop()
    assert [store.job(j.id).status for j in jobs] == ["done"] * 3
    assert driver.most == {"127.0.0.1:5201": 1}
    store.close()


# -- issue 30: progress while a probe runs -------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_rises_with_the_time_a_probe_has_run():
    clock = Clock()
    progress = JobProgress(clock)
    progress.on_event(PlanEvent("idle_rtt", "d", total=2, expected_s=20.0))
    progress.on_event(PlanEvent("idle_rtt_done", "d", total=2))
    progress.on_event(PlanEvent("probe", "d", 1, 30.0, 1, 2, expected_s=35.0))
    assert progress.snapshot()[0] == 0.0
    clock.now += 14.0
    fraction, detail = progress.snapshot()
    # 14 s of 35 into the first of two levels: 0.99 * (14 / 35) / 2.
    assert fraction == pytest.approx(0.99 * 0.4 / 2, abs=1e-4)
    assert detail == {"phase": "probe", "level": 1, "index": 1, "of": 2, "attempt": 1, "elapsed_s": 14.0,
                      "expected_s": 35.0}
    # Not settled after 35 s: run again for 60 s, so the level now expects 35 + 65 s.
    clock.now += 21.0
    progress.on_event(PlanEvent("extend", "d", 1, 60.0, 1, 2, expected_s=65.0))
    assert progress.snapshot()[1]["expected_s"] == 100.0
    progress.on_event(PlanEvent("probe_done", "d", 1, 60.0, 1, 2))
    progress.on_event(PlanEvent("probe", "d", 10, 30.0, 2, 2, expected_s=35.0))
    clock.now += 35.0 * 2  # overran: the level's share is never passed
    fraction, detail = progress.snapshot()
    assert 0.99 * 0.5 < fraction < 0.99 and (detail["index"], detail["level"]) == (2, 10)


def test_a_running_job_reports_progress_before_it_ends(tmp_path):
    driver = FakeDriver(rate, rtt_s=0.01, delay_s=1.0)
    store, service, _ = make(tmp_path, lambda host: ["127.0.0.1"], driver)
    worker = ProbeWorker(service, driver, poll_s=0.05, progress_interval_s=0.05)
    job, _ = service.request_probe("127.0.0.1")
    worker.start()
    try:
        seen = []
        deadline = time.monotonic() + 60
        while (status := service.probe_status(job.id))["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            if status["status"] == "running" and status["progress"] > 0:
                seen.append(status)
            time.sleep(0.02)
    finally:
        worker.stop()
    assert service.probe_status(job.id)["status"] == "done"
    # Progress rose inside the first probe, before it ended (the old worker wrote only at each probe's end).
    first = [s for s in seen if s["progress"] < 0.99 / 2]
    assert first, f"no progress above 0 was seen during the first probe: {seen[:3]}"
    detail = first[-1]["progress_detail"]
    assert (detail["phase"], detail["index"], detail["of"], detail["level"], detail["attempt"]) == ("probe", 1, 2, 1, 1)
    assert detail["elapsed_s"] > 0 and detail["expected_s"] >= service.settings.omit_s + 1.0
    assert service.probe_status(job.id)["progress_detail"] is None
    store.close()


@pytest.mark.postgres
def test_the_job_rules_hold_on_postgres(pg_url):
    store = Store.open(pg_url)
    try:
        first, _ = store.enqueue_job(parse_destination("a.test"), [1, 10], 1.0, max_queued=2, src=SITE)
        second, _ = store.enqueue_job(parse_destination("b.test"), [1, 10], 1.0, max_queued=2, src=SITE)
        with pytest.raises(QueueFull):
            store.enqueue_job(parse_destination("c.test"), [1, 10], 1.0, max_queued=2, src=SITE)
        assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE).id == first.id
        assert store.pin_address(first.id, "h:1:a", "127.0.0.1", 1e12)
        assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE).id == second.id
        assert not store.pin_address(second.id, "h:1:a", "127.0.0.1", 1e12)
        store.release_job(second.id, "h:1:a", "waiting", "127.0.0.1")
        assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE) is None
        store.set_progress(first.id, "h:1:a", 0.25, {"phase": "probe", "index": 1})
        assert store.job(first.id).progress_detail == {"phase": "probe", "index": 1}
        store.record_run(parse_destination("a.test"), source="probe", idle_rtt_s=None, results=[], started_at=0.0,
                         fit=None, job_id=first.id, job_error="no probes", address="127.0.0.1", src=SITE)
        with store.db.transaction() as tx:
            assert tx.execute("SELECT address FROM probe_runs WHERE job_id = ?", (first.id,)).fetchone()[0] == "127.0.0.1"
        assert store.claim_job("h:1:a", lambda job: 100, limit=2, src=SITE).id == second.id
    finally:
        store.close()


class BusyOnce(FakeDriver):
    """An iperf3 server still busy with a killed worker's test for the first call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.busy = 1

    def idle_rtt(self, dest, deadline_s):
        if self.busy:
            self.busy -= 1
            raise ServerBusy("the server is busy running a test")
        return super().idle_rtt(dest, deadline_s)


def test_a_re_queued_job_waits_out_a_server_still_busy_with_its_killed_attempt(tmp_path):
    driver = BusyOnce(rate, rtt_s=0.01)
    store, service, _ = make(tmp_path, lambda host: ["127.0.0.1"], driver)
    worker = ProbeWorker(service, driver, busy_retry_waits_s=(0.01,))
    job, _ = service.request_probe("127.0.0.1")
    store.claim_job("h:1:gone", lambda job: 3600, limit=1, src=SITE)
    store.recover_jobs(3, owner_is_dead=lambda owner: True)
    assert worker.run_once()
    final = store.job(job.id)
    assert (final.status, final.attempts) == ("done", 2), final.error
    # A first attempt that finds the server busy is another client's test: it fails as before.
    driver.busy = 1
    again, _ = service.request_probe("127.0.0.1:5202")
    assert worker.run_once()
    assert store.job(again.id).status == "failed" and "ServerBusy" in store.job(again.id).error
    store.close()


# -- a name lookup that did not finish is no failed probe ------------------------------------------

def test_a_job_whose_name_lookup_does_not_finish_waits_uncounted_and_is_not_looked_up_meanwhile(tmp_path):
    # The worker failed such a job at once (a LookupTimedOut or LookupsBusy is an AdvisorError: fail_job), so one slow
    # DNS moment lost the probe asked for. Now it goes back to the queue, no attempt counted, and waits the refusal's
    # retry_after_s (twice as long each time more) before the worker claims it again; nothing is looked up meanwhile.
    from advisor.errors import LookupsBusy, LookupTimedOut
    from tests.api.conftest import Clock

    clock = Clock()
    refusals = []
    looked_up = []

    def resolver(host):
        looked_up.append(host)
        if refusals:
            raise refusals.pop(0)
        return ["127.0.0.1"]

    store = Store.open(f"sqlite:///{tmp_path}/tame.sqlite3", clock=clock)
    settings = Settings(database_url=store.db.url, allowed=AllowList.parse("127.0.0.1/32"), model="lu",
                        default_levels=(1, 10), default_duration_s=1.0)
    driver = FakeDriver(rate, rtt_s=0.01)
    worker = ProbeWorker(AdviceService(store, settings, clock=clock, resolver=resolver), driver, poll_s=0.05)
    try:
        job, _ = worker.service.request_probe("slow.test:5300")
        refusals[:] = [LookupTimedOut("dest host 'slow.test' did not resolve within 5 s: try again later, or give "
                                      "its address", retry_after_s=5.0),
                       LookupsBusy("dest host 'slow.test' was not looked up: ...", retry_after_s=5.0)]
        looked_up.clear()
        for wait_s in (5.0, 10.0):
            assert worker.run_once()
            waiting = store.job(job.id)
            assert (waiting.status, waiting.attempts) == ("queued", 0), waiting
            assert waiting.error.endswith(f"; re-queued, tried again in {wait_s:g} s"), waiting.error
            clock.advance(wait_s - 0.01)
            assert not worker.run_once()  # not claimed yet, nor looked up
            assert len(looked_up) == (1 if wait_s == 5.0 else 2)
            clock.advance(0.01)
        assert worker.run_once()
        done = store.job(job.id)
        assert (done.status, done.attempts) == ("done", 1), done
        assert {call[1] for call in driver.calls if call[0] == "run"} == {"127.0.0.1:5300"}
    finally:
        store.close()
