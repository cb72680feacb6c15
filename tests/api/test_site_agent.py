"""advisor/site_agent.py against a live service (the app on a real socket): nothing a probe's thread raises dies
silently."""

import logging
import time

from advisor.site_agent import SiteAgent
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
