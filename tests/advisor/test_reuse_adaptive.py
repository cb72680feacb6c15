"""A queued probe re-uses the adaptive probe of its link's last probing (advisor.store.Store.choose_reuse): the local
worker and a site's agent measure the fixed levels only, the run keeps a marked copy of the probe it re-uses, the
fit rests on all three, and the probe after measures the whole plan again. On a real SQLite file and PostgreSQL."""

import dataclasses

import pytest

from advisor.allowlist import AllowList
from advisor.destinations import parse_destination
from advisor.plan_runner import level_chooser, plan_for
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from advisor.worker import ProbeWorker
from probes.fake import FakeDriver
from probes.plan import run_plan
from tests.api.conftest import Clock, rate

DEST = "127.0.0.1:5201"


def make(url, clock, model="auto", **settings):
    store = Store.open(url, clock=clock)
    settings = Settings(database_url=url, allowed=AllowList.parse("127.0.0.1/32"), model=model,
                        default_levels=(1, 10), default_duration_s=1.0, congestion_control="cubic", **settings)
    service = AdviceService(store, settings, clock=clock, resolver=lambda host: ["127.0.0.1"],
                            controls=lambda: ["reno", "cubic"])
    driver = FakeDriver(rate, rtt_s=0.01)
    return store, service, ProbeWorker(service, driver, poll_s=0.05), driver


def probe(service, worker, driver, control=None):
    """Queue a probe of DEST and run it: (the finished job, the levels the driver measured, in order)."""
    before = len(driver.calls)
    job, created = service.request_probe(DEST, congestion_control=control)
    assert created and worker.run_once()
    done = service.store.job(job.id)
    assert done.status == "done", done.error
    return done, list(dict.fromkeys(call[2] for call in driver.calls[before:] if call[0] == "run"))


def run_probes(store, job=None, run_id=None):
    """(streams, reused_from) of each probe of job's run (or of run ``run_id``), in the order stored."""
    with store.db.transaction() as tx:
        return [tuple(r) for r in tx.execute(
            "SELECT streams, reused_from FROM probe_results WHERE probe_run_id = ? ORDER BY id",
            (job.probe_run_id if run_id is None else run_id,)).fetchall()]


def adaptive_id(store, job):
    with store.db.transaction() as tx:
        return tx.execute("SELECT id FROM probe_results WHERE probe_run_id = ? AND streams NOT IN (1, 10)",
                          (job.probe_run_id,)).fetchone()[0]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    return f"sqlite:///{tmp_path}/tame.sqlite3" if request.param == "sqlite" else request.getfixturevalue("pg_url")


def test_refreshes_alternate_between_the_whole_plan_and_its_fixed_levels(url):
    clock = Clock()
    store, service, worker, driver = make(url, clock)
    first, measured = probe(service, worker, driver)
    assert measured[:2] == [1, 10] and len(measured) == 3 and first.reuse_probe_id is None
    adaptive = measured[2]
    reused = adaptive_id(store, first)

    clock.advance(3600.0)
    second, measured = probe(service, worker, driver)
    assert measured == [1, 10]
    assert second.reuse_probe_id == reused
    assert service.probe_status(second.id)["reuses_probe"] == reused
    assert run_probes(store, second) == [(1, None), (10, None), (adaptive, reused)]
    assert sorted(p["streams"] for p in service.advice(DEST, 0.1)["probes"]) == [1, 10, adaptive]

    clock.advance(3600.0)
    third, measured = probe(service, worker, driver)
    assert measured == [1, 10, adaptive] and third.reuse_probe_id is None
    assert service.probe_status(third.id)["reuses_probe"] is None
    assert all(reused_from is None for _, reused_from in run_probes(store, third))
    store.close()


@pytest.mark.parametrize("max_age_s, later_s", [(600.0, 601.0), (0.0, 0.0)])
def test_a_probing_older_than_the_setting_or_with_it_0_is_measured_again(url, max_age_s, later_s):
    clock = Clock()
    store, service, worker, driver = make(url, clock, reuse_adaptive_max_age_s=max_age_s)
    probe(service, worker, driver)
    clock.advance(later_s)
    again, measured = probe(service, worker, driver)
    assert len(measured) == 3 and again.reuse_probe_id is None
    store.close()


def test_a_probe_under_another_control_measures_its_whole_plan(url):
    clock = Clock()
    store, service, worker, driver = make(url, clock)
    probe(service, worker, driver)
    clock.advance(1.0)
    # Fresh enough, but no probing under reno yet.
    other, measured = probe(service, worker, driver, control="reno")
    assert len(measured) == 3 and other.reuse_probe_id is None
    store.close()


def test_a_run_that_measured_the_level_itself_keeps_no_copy(url):
    """An agent that does not know "reuses_probe" (an older one) measures the whole plan for a job that re-uses: the
    run is fitted on what it measured, and no copy is added beside it."""
    clock = Clock()
    store, service, worker, driver = make(url, clock)
    first, measured = probe(service, worker, driver)
    clock.advance(60.0)
    job, _ = service.request_probe(DEST)
    job = service.settle_reuse(store.claim_job("old-agent", lambda job: 600.0, 1, src=job.src), "old-agent")
    assert job.reuse_probe_id == adaptive_id(store, first)
    plan = run_plan(driver, DEST, plan_for(service.settings, job.levels, job.duration_s, "cubic"),
                    next_level=level_chooser("auto", service.settings.n_max))
    service.ingest_run(parse_destination(DEST), plan.idle_rtt_s, plan.probes, clock(), source="push", job_id=job.id,
                       congestion_control="cubic", job=job)
    done = store.job(job.id)
    assert run_probes(store, done) == [(n, None) for n in measured]
    assert done.reuse_probe_id is None and service.probe_status(job.id)["reuses_probe"] is None  # none was re-used
    store.close()


def queued_after_a_full_probing(url, clock):
    """(store, service, the id of its adaptive probe, a probe of DEST queued an hour after one full probing)."""
    store, service, worker, driver = make(url, clock)
    first, _ = probe(service, worker, driver)
    reused = adaptive_id(store, first)
    clock.advance(3600.0)
    queued, created = service.request_probe(DEST)
    assert created
    return store, service, reused, queued


def test_a_choice_left_by_an_earlier_attempt_is_cleared_for_a_model_without_an_adaptive_probe(url):
    clock = Clock()
    store, _, reused, job = queued_after_a_full_probing(url, clock)
    with store.db.transaction(write=True) as tx:  # as an attempt under `auto` that was released left it
        tx.execute("UPDATE probe_jobs SET reuse_probe_id = ? WHERE id = ?", (reused, job.id))
    lu_store, lu, lu_worker, _ = make(url, clock, model="lu")
    assert lu_worker.run_once()
    done = store.job(job.id)
    assert done.status == "done", done.error
    assert done.reuse_probe_id is None and lu.probe_status(job.id)["reuses_probe"] is None
    assert run_probes(store, done) == [(1, None), (10, None)]
    lu_store.close()
    store.close()


def test_a_probe_chosen_under_one_control_is_not_fitted_into_a_run_under_another(url):
    clock = Clock()
    store, service, reused, queued = queued_after_a_full_probing(url, clock)
    job = dataclasses.replace(store.job(queued.id), reuse_probe_id=reused)  # chosen under cubic
    reno = FakeDriver(rate, rtt_s=0.01, congestion_control="reno")
    results = [reno.run(DEST, n, 1.0, 0.0, 10.0) for n in (1, 10)]  # the probes report reno
    run, error = service.ingest_run(parse_destination(DEST), 0.01, results, clock(), "test",
                                    congestion_control="cubic", job=job)
    assert run.congestion_control == "reno" and "used reno" in error
    assert run_probes(store, run_id=run.id) == [(1, None), (10, None)]
    store.close()


def claimed(store, service, queued, owner="agent-a"):
    """``queued`` claimed by ``owner`` and its reuse settled."""
    job = store.claim_job(owner, lambda job: 600.0, 1, src=queued.src)
    assert job is not None and job.id == queued.id
    return service.settle_reuse(job, owner)


def fixed_levels(control="cubic"):
    driver = FakeDriver(rate, rtt_s=0.01, congestion_control=control)
    return [driver.run(DEST, n, 1.0, 0.0, 10.0) for n in (1, 10)]


def test_a_reused_probe_removed_as_the_run_is_stored_is_left_out_of_its_fit_and_its_job(url):
    clock = Clock()
    store, service, reused, queued = queued_after_a_full_probing(url, clock)
    job = claimed(store, service, queued)
    assert job.reuse_probe_id == reused
    read = store.probe_point

    def read_then_removed(probe_id):  # retention removes the probe just after the fit read it
        point = read(probe_id)
        with store.db.transaction(write=True) as tx:
            tx.execute("DELETE FROM probe_results WHERE id = ?", (probe_id,))
        return point

    store.probe_point = read_then_removed
    run, error = service.ingest_run(parse_destination(DEST), 0.01, fixed_levels(), clock(), "push", job_id=job.id,
                                    congestion_control="cubic", job_owner="agent-a", job=job)
    assert error is None
    assert run_probes(store, run_id=run.id) == [(1, None), (10, None)]
    assert sorted(p["streams"] for p in service.advice(DEST, 0.1)["probes"]) == [1, 10]  # the fit as the run holds
    done = store.job(job.id)
    assert done.status == "done" and done.reuse_probe_id is None
    store.close()


def pushed(service, job, levels, asked="cubic", owner="agent-a"):
    """An agent's run of claimed ``job`` at ``levels``, its probes under cubic, ``asked`` the control asked for."""
    driver = FakeDriver(rate, rtt_s=0.01, congestion_control="cubic")
    results = [driver.run(DEST, n, 1.0, 0.0, 10.0) for n in levels]
    return service.ingest_run(parse_destination(DEST), 0.01, results, service.clock(), "push", job_id=job.id,
                              congestion_control=asked, job_owner=owner, job=job)


@pytest.mark.parametrize("earlier", ["a 3 s probe", "a pushed run with no job", "a probe of other levels",
                                     "a failed probe"])
def test_only_a_done_probing_of_the_same_plan_is_re_used(url, earlier):
    clock = Clock()
    store, service, worker, driver = make(url, clock)
    if earlier == "a 3 s probe":
        job, _ = service.request_probe(DEST, duration_s=3.0)
        assert worker.run_once() and store.job(job.id).status == "done"
    elif earlier == "a pushed run with no job":  # as a scheduler's own measurement at the plan's levels and one more
        results = [driver.run(DEST, n, 1.0, 0.0, 10.0) for n in (1, 10, 4)]
        service.ingest_run(parse_destination(DEST), 0.01, results, clock(), "push", congestion_control="cubic")
    elif earlier == "a probe of other levels":  # (1, 4) measured with 10: holds (1, 10) and one more, 4
        queued, _ = service.request_probe(DEST, levels=[1, 4])
        pushed(service, claimed(store, service, queued), (1, 4, 10))
        assert store.job(queued.id).status == "done"
    else:  # asked for reno, probed under cubic: kept as cubic's, its job failed
        queued, _ = service.request_probe(DEST, congestion_control="reno")
        run, error = pushed(service, claimed(store, service, queued), (1, 10, 4), asked="reno")
        assert run.congestion_control == "cubic" and store.job(queued.id).status == "failed", error
    clock.advance(60.0)
    again, measured = probe(service, worker, driver)
    assert len(measured) == 3 and again.reuse_probe_id is None
    store.close()


def end_attempt(store, clock, job, how):
    """End agent-a's attempt at claimed ``job`` as ``how`` says, through the store's own path for it."""
    if how == "released":
        store.release_attempt(job.id, "agent-a", job.src, "agent stopping")
    elif how == "failed once":
        store.fail_attempt(job.id, "agent-a", job.src, "iperf3 refused", max_attempts=3)
    elif how == "lease lapsed":
        clock.advance(601.0)
        assert store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    elif how == "its last attempt failed":
        store.fail_attempt(job.id, "agent-a", job.src, "iperf3 refused", max_attempts=1)
    elif how == "refused":
        store.refuse_attempt(job.id, "agent-a", job.src, "no longer allowed")
    else:
        assert how == "given up by the worker"
        store.fail_job(job.id, "ProbeError: iperf3 refused")


@pytest.mark.parametrize("how", ["released", "failed once", "lease lapsed"])
def test_a_job_back_in_the_queue_shows_no_reuse_and_a_late_run_of_its_attempt_re_uses_as_chosen(url, how):
    clock = Clock()
    store, service, reused, queued = queued_after_a_full_probing(url, clock)
    assert claimed(store, service, queued).reuse_probe_id == reused
    end_attempt(store, clock, queued, how)
    assert store.job(queued.id).status == "queued" and service.probe_status(queued.id)["reuses_probe"] is None
    if how == "lease lapsed":  # its agent's spooled run, which left the level out as its claim said
        late = service.claimed_job(queued.id, "agent-a", queued.src, parse_destination(DEST))
        assert late is not None
        run, error = pushed(service, late, (1, 10))
        assert error is None and run_probes(store, run_id=run.id)[-1][1] == reused
        assert service.probe_status(queued.id)["reuses_probe"] == reused
    store.close()


@pytest.mark.parametrize("how", ["its last attempt failed", "refused", "given up by the worker"])
def test_a_job_failed_without_a_run_names_no_reuse(url, how):
    clock = Clock()
    store, service, reused, queued = queued_after_a_full_probing(url, clock)
    assert claimed(store, service, queued).reuse_probe_id == reused
    end_attempt(store, clock, queued, how)
    failed = store.job(queued.id)
    assert failed.status == "failed" and failed.reuse_probe_id is None
    assert service.probe_status(queued.id)["reuses_probe"] is None
    store.close()


def test_only_the_job_s_holder_settles_its_reuse(url):
    clock = Clock()
    store, service, reused, queued = queued_after_a_full_probing(url, clock)
    job = store.claim_job("agent-a", lambda job: 600.0, 1, src=queued.src)
    assert service.settle_reuse(job, "agent-b").reuse_probe_id is None  # not agent-b's job: nothing written
    assert store.job(job.id).reuse_probe_id is None
    assert service.settle_reuse(job, "agent-a").reuse_probe_id == reused
    store.close()
