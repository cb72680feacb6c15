"""advisor/site_agent.py against a live service (the app on a real socket): nothing a probe's thread raises dies
silently, and a plan that could outlast its claim's lease is refused naming the settings that differ."""

import logging
import time
from dataclasses import replace

import pytest

from advisor.allowlist import AllowList
from advisor.settings import Settings
from advisor.site_agent import SiteAgent, check_plan_fits_lease
from advisor.sites import SiteBudget
from api.client import TameClient
from probes.fake import FakeDriver
from tests.api.conftest import rate


def test_a_probe_thread_that_raises_is_logged_and_its_claim_reported_failed(service_factory, caplog):
    """Its push raises (a bug, say): each time the error is logged with its traceback and the claim reported, so the
    job queues again now, and fails after TAME_MAX_PROBE_ATTEMPTS attempts saying why (before: the round never read
    the thread's outcome, and the job stayed running, unreported, until its lease ran out)."""
    base, client, app = service_factory(start_worker=False)
    settings = app.state.settings
    reported = []

    def push(payload):
        raise RuntimeError("disk on fire")

    with TameClient(base) as remote:
        def report_failure(job_id, error):
            reported.append(error)
            remote.fail_claim("dtn2", job_id, "agent-1", error)

        agent = SiteAgent(remote, "dtn2", "agent-1", SiteBudget(), settings, FakeDriver(rate, rtt_s=0.01), push=push,
                          clock=time.time, report_failure=report_failure)
        attempts = settings.max_probe_attempts
        with caplog.at_level(logging.ERROR, logger="tame"):
            # A round may end before the last report lands (the thread reports as it ends): the next claims it.
            for _ in range(2 * attempts):
                agent.round(["127.0.0.1:5201"])
                if app.state.service.store.job_counts() == {"failed": 1}:
                    break
    assert reported == ["the agent failed: RuntimeError: disk on fire"] * attempts
    logged = [r for r in caplog.records if "ended with an error" in r.getMessage()]
    assert len(logged) == attempts and logged[0].exc_info[0] is RuntimeError
    assert app.state.service.store.job_counts() == {"failed": 1}


def test_a_run_the_service_could_not_take_is_not_probed_again_while_its_lease_lasts(service_factory):
    """The push is not taken now (a 503: the agent keeps the run to send again): the job stays running in the agent's
    name. It is named in the agent's claims until its lease ends, so it is not given back and the link probed again
    and again, outside the site's budget (a review saw 5 probes of one job in a row, and no end)."""
    base, client, app = service_factory(start_worker=False)
    settings = app.state.settings
    pushed = []

    def push(payload):
        pushed.append(payload["job_id"])
        if len(pushed) > 3:
            agent.stop.set()  # probed again and again: enough to show it
        return False  # kept to send again

    driver = FakeDriver(rate, rtt_s=0.01)
    with TameClient(base) as remote:
        agent = SiteAgent(remote, "dtn2", "agent-1", SiteBudget(), settings, driver, push=push, clock=time.time,
                          log=lambda line: None)
        agent.round(["127.0.0.1:5201"])
        probes = sum(1 for call in driver.calls if call[0] == "run")
        for _ in range(2):
            agent.round(["127.0.0.1:5201"])
    assert len(pushed) == 1, pushed
    assert sum(1 for call in driver.calls if call[0] == "run") == probes  # nothing probed since
    job = app.state.service.store.job(pushed[0])
    assert job.status == "running" and job.attempts == 1


def test_an_agent_whose_plan_outlasts_its_lease_names_the_settings_that_differ_and_both_values(service_factory):
    """The lease is the service's plan's worst case for the job, from its TAME_MODEL, TAME_PROBE_MAX_DURATION_S and
    TAME_PROBE_OMIT_S: an agent whose own could make its plan longer probes nothing (the job would go to another
    agent mid-probe). The refusal listed four settings, one of which (TAME_PROBE_DURATION_S) a claimed job does not
    take from the agent at all, and no value: now it names the ones that differ, the agent's value and the
    service's."""
    base, client, app = service_factory(start_worker=False)
    reported = []
    driver = FakeDriver(rate, rtt_s=0.01)
    # 60 s of warm-up a probe here, 5 s at the service: every run of the plan 55 s longer than the lease allows for.
    settings = replace(app.state.settings, omit_s=60.0, n_max=app.state.settings.n_max + 1)
    with TameClient(base) as remote:
        agent = SiteAgent(remote, "dtn2", "agent-1", SiteBudget(), settings, driver, push=lambda payload: True,
                          clock=time.time, report_failure=lambda job_id, error: reported.append(error),
                          log=lambda line: None)
        agent.round(["127.0.0.1:5201"])
    [error] = reported
    # 2752 s against a 1227 s lease: each of the plan's 28 runs counts 55 s more warm-up (2 levels, 2 attempts, 7
    # lengths 1 s to 60 s), the rest (the idle RTT's 20 s, 20 s of slack a run) alike.
    assert error == ("this agent's probe plan may take 2752 s, longer than the 1227 s lease its claim holds: its "
                     "TAME_PROBE_OMIT_S is 60, the service's 5: run the agent with the service's value"), error
    assert not [call for call in driver.calls if call[0] == "run"]


def test_the_lease_refusal_names_every_setting_that_differs_and_says_when_the_service_gives_none():
    mine = Settings(model="auto", max_probe_duration_s=120.0, omit_s=5.0)
    check_plan_fits_lease(100.0, 105.0, mine, None)  # fits, with the 5 s it leaves for the push
    with pytest.raises(ValueError) as refused:
        check_plan_fits_lease(200.0, 100.0, mine, {"model": "lu", "max_probe_duration_s": 60.0, "omit_s": 5.0})
    assert str(refused.value) == (
        "this agent's probe plan may take 200 s, longer than the 100 s lease its claim holds: its TAME_MODEL is auto, "
        "the service's lu; its TAME_PROBE_MAX_DURATION_S is 120, the service's 60: run the agent with the service's "
        "values")
    with pytest.raises(ValueError, match="though its TAME_MODEL, TAME_PROBE_MAX_DURATION_S, TAME_PROBE_OMIT_S are "
                                         "the service's: run the agent and the service at the same version"):
        check_plan_fits_lease(200.0, 100.0, mine, {"model": "auto", "max_probe_duration_s": 120.0, "omit_s": 5.0})
    with pytest.raises(ValueError, match="run the agent with the service's TAME_MODEL, TAME_PROBE_MAX_DURATION_S, "
                                         "TAME_PROBE_OMIT_S \\(this service does not say its own\\)"):
        check_plan_fits_lease(200.0, 100.0, mine, None)


def test_a_probe_whose_local_name_lookup_does_not_finish_is_handed_back_to_wait_not_failed(service_factory, clock,
                                                                                          monkeypatch, capsys):
    """The agent resolves its claimed job's name itself (advisor.allowlist.system_resolver, here with every lookup slot
    taken, so none finishes): it reported the claim failed, an attempt counted, so a few slow DNS moments at the site
    failed the job. Now it hands the job back with the lookup's error; the service queues it uncounted and keeps it
    from the site's claims for a while (as when its own lookup does not finish), and the agent's next round waits.
    The busy lookups are the agent's own, and what it logs and sends says so (it said "this service's")."""
    import threading

    import advisor.allowlist as allowlist

    base, client, app = service_factory(start_worker=False)
    slots = threading.BoundedSemaphore(1)
    slots.acquire()
    monkeypatch.setattr(allowlist, "_lookup_slots", slots)
    monkeypatch.setattr(allowlist, "RESOLVE_TIMEOUT_S", 0.01)
    reported, waiting = [], []
    driver = FakeDriver(rate, rtt_s=0.01)
    with TameClient(base) as remote:
        agent = SiteAgent(remote, "dtn2", "agent-1", SiteBudget(), app.state.settings, driver,
                          push=lambda payload: True, clock=time.time,
                          report_failure=lambda job_id, error: reported.append(error),
                          hand_back=lambda job_id, lookup_error=None: remote.release_claim(
                              "dtn2", job_id, "agent-1", lookup_error),
                          log=waiting.append)
        assert agent.round(["localhost:5201"]) == 1
        [job_id] = agent.claimed
        job = app.state.service.store.job(job_id)
        assert (job.status, job.attempts) == ("queued", 0), job
        busy = ("dest host 'localhost' was not looked up: this agent's 8 name lookups were all busy for 0.01 s: try "
                "again later, or give its address")
        assert f"tame agent: dtn2 -> localhost:5201: {busy}; handed back\n" in capsys.readouterr().err
        assert job.error == f"not started: at agent-1: {busy}; re-queued, tried again in 5 s"
        assert agent.round(["localhost:5201"]) == 0  # the job waits: not claimed, nothing looked up or probed
        assert "the first is tried again in 5 s" in waiting[-1], waiting
        clock.advance(5)
        slots.release()
        assert agent.round(["localhost:5201"]) == 1
    assert reported == []
    probed = app.state.service.store.job(job.id)  # its run not pushed here (push: a no-op): it stays the agent's
    assert (probed.status, probed.attempts) == ("running", 1), probed
    assert {call[1] for call in driver.calls if call[0] == "run"} == {"127.0.0.1:5201"}


def test_a_claim_the_agents_own_allow_list_refuses_says_the_agent_refused_it(service_factory, capsys):
    """The service allows 127.0.0.1 and queues its probe; the site's agent allows only 10.0.0.0/8 (its own
    TAME_ALLOWED_DESTINATIONS) and refuses the claim. What it logs and reports said "not allowed on this service",
    sending the operator to the service's list, which allows it."""
    base, client, app = service_factory(start_worker=False)
    own = replace(app.state.settings, allowed=AllowList.parse("10.0.0.0/8"))
    reported = []
    with TameClient(base) as remote:
        agent = SiteAgent(remote, "dtn2", "agent-1", SiteBudget(), own, FakeDriver(rate, rtt_s=0.01),
                          push=lambda payload: True, clock=time.time,
                          report_failure=lambda job_id, error: reported.append(error))
        assert agent.round(["127.0.0.1:5201"]) == 1  # the round ends once its probes' threads have
    refused = ("probes to 127.0.0.1 are not allowed on this agent; ask the operator to add it to "
               "TAME_ALLOWED_DESTINATIONS")
    assert reported == [refused]
    assert f"tame agent: dtn2 -> 127.0.0.1:5201: {refused}\n" in capsys.readouterr().err


def test_a_site_agent_leaves_out_the_adaptive_level_its_claim_re_uses_and_the_service_stores_the_copy(service_factory):
    """The claim's job says which probe of the link's last probing it re-uses ("reuses_probe"): the agent measures
    the fixed levels only, and the service fits and stores its run with a marked copy of that probe; the probe after
    measures the whole plan again (advisor.store.Store.choose_reuse)."""
    # Short probes, so the plan (with its adaptive probe) fits the site's default budget.
    base, client, app = service_factory(start_worker=False, model="auto", max_probe_duration_s=2.0)
    store = app.state.service.store
    driver = FakeDriver(rate, rtt_s=0.01)
    pushed, failures = [], []

    def probes_of(job_id):
        with store.db.transaction() as tx:
            return [tuple(r) for r in tx.execute(
                "SELECT p.id, p.streams, p.reused_from FROM probe_results p JOIN probe_jobs j "
                "ON j.probe_run_id = p.probe_run_id WHERE j.id = ? ORDER BY p.id", (job_id,)).fetchall()]

    with TameClient(base) as remote:
        def push(payload):
            pushed.append(payload["job_id"])
            return bool(remote.push_probe_run(payload))

        agent = SiteAgent(remote, "dtn2", "agent-1", SiteBudget(), app.state.settings, driver, push=push,
                          clock=time.time, log=lambda line: None, report_failure=lambda job_id, error: failures.append(error))
        measured = []
        for _ in range(3):
            since = len(driver.calls)
            if measured:  # the link is fresh: ask for a refresh, as GET /v1/advice does once it goes stale
                response = client.post("/v1/probes", json={"src": "dtn2", "dest": "127.0.0.1:5201"})
                assert response.status_code == 202, response.text
            assert agent.round(["127.0.0.1:5201"]) == 1
            measured.append(list(dict.fromkeys(call[2] for call in driver.calls[since:] if call[0] == "run")))
    assert failures == []
    first, second, third = pushed
    assert measured[0][:2] == [1, 10] and len(measured[0]) == 3
    adaptive = measured[0][2]
    [reused] = [row_id for row_id, streams, _ in probes_of(first) if streams == adaptive]
    assert measured[1] == [1, 10]
    assert [(streams, reused_from) for _, streams, reused_from in probes_of(second)] == [
        (1, None), (10, None), (adaptive, reused)]
    assert client.get(f"/v1/probes/{second}").json()["reuses_probe"] == reused
    assert measured[2] == measured[0]
    assert client.get(f"/v1/probes/{third}").json()["reuses_probe"] is None
    assert [store.job(job_id).status for job_id in pushed] == ["done"] * 3
