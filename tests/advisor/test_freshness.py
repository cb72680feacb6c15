"""Transfers keep a link's advice fresh, but only until its newest probe is TAME_PROBE_MAX_AGE_S old: then every path
that decides a probe is due (GET advice, /v1/paths, a site's registration, the local `tame agent`) asks for one, and
the advice is served, not stale, meanwhile. A real SQLite file and an injected clock (no test sleeps)."""

import pytest

from advisor.commands.agent import _enqueue_due
from advisor.destinations import parse_destination
from advisor.errors import ConfigError
from advisor.freshness import PROBE_MAX_AGE, STALE, Freshness
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.site_desk import fresh_destinations
from advisor.sites import SiteBudget
from advisor.store import Store
from probes.result import ProbeResult
from tests.api.conftest import Clock, rate
from tests.sites import SITE

DEST = parse_destination("127.0.0.1:5201")
TTL_S, MAX_AGE_S = 600.0, 1800.0
CONTROL = "cubic"


def test_due_is_stale_past_the_ttl_and_probe_max_age_past_the_probe_bound():
    policy = Freshness(ttl_s=TTL_S, probe_max_age_s=MAX_AGE_S)
    # (evidence_at, probed_at) at now = 10_000: fresh, stale, fresh by a transfer but probed too long ago.
    assert policy.due(9_500.0, 9_500.0, 10_000.0) is None
    assert policy.due(9_399.0, 9_399.0, 10_000.0) == STALE
    assert policy.due(9_900.0, 8_200.0, 10_000.0) is None  # probed exactly MAX_AGE_S ago: not past it
    assert policy.due(9_900.0, 8_199.0, 10_000.0) == PROBE_MAX_AGE
    assert not policy.stale(9_900.0, 10_000.0)


def test_the_probe_max_age_is_read_from_the_environment_and_checked():
    assert Settings().freshness.probe_max_age_s == 24 * 3600.0  # 24 TTLs of the default hour
    assert Settings.from_env({"TAME_TTL_S": "600"}).freshness == Freshness(600.0, 24 * 600.0)
    assert Settings.from_env({"TAME_TTL_S": "600", "TAME_PROBE_MAX_AGE_S": "7200"}).freshness == Freshness(600.0, 7200.0)
    for env, says in (({"TAME_PROBE_MAX_AGE_S": "a day"}, "not a number"),
                      ({"TAME_PROBE_MAX_AGE_S": "0"}, "between"),
                      ({"TAME_PROBE_MAX_AGE_S": "-60"}, "between"),
                      ({"TAME_PROBE_MAX_AGE_S": "1e12"}, "between"),
                      ({"TAME_PROBE_MAX_AGE_S": "nan"}, "not a number"),
                      ({"TAME_TTL_S": "3600", "TAME_PROBE_MAX_AGE_S": "600"}, "at least TAME_TTL_S")):
        with pytest.raises(ConfigError, match="TAME_PROBE_MAX_AGE_S") as raised:
            Settings.from_env(env)
        assert says in str(raised.value), (env, raised.value)


def _probe(service, src):
    results = [ProbeResult(dest=DEST.key, streams=n, duration_s=1.0, omit_s=0.0, throughput_bps=rate(n), sender_bps=None)
               for n in (1, 10)]
    _, error = service.ingest_run(DEST, 0.01, results, started_at=service.clock(), source="probe",
                                  congestion_control=CONTROL, src=src)
    assert error is None


def _row(service, src):
    (row,) = service.paths(src)
    return row


def test_transfers_keep_a_link_fresh_until_its_newest_probe_is_too_old(tmp_path):
    clock = Clock()
    url = f"sqlite:///{tmp_path}/tame.sqlite3"
    store = Store.open(url, clock=clock)
    settings = Settings(database_url=url, model="lu", ttl_s=TTL_S, probe_max_age_s=MAX_AGE_S, congestion_control=CONTROL,
                        site=SITE)
    service = AdviceService(store, settings, clock=clock, resolver=lambda host: ["127.0.0.1"],
                            controls=lambda: [CONTROL, "reno"])
    budget = SiteBudget(probe_seconds_per_hour=3600.0)
    try:
        probed_at = clock()
        for src in (SITE, "dtn2"):
            _probe(service, src)
        # A transfer every half TTL: the advice never goes stale, and until the probes are MAX_AGE_S old nothing
        # is due on any path.
        while clock() + TTL_S / 2 <= probed_at + MAX_AGE_S:
            clock.advance(TTL_S / 2)
            for src in (SITE, "dtn2"):
                assert service.observe(DEST.key, 4, rate(4), src=src)["refit"] is True
            advice = service.advice(DEST.key, 0.1)
            assert advice["stale"] is False and advice["probed_at"] == probed_at
            assert _row(service, SITE)["reprobe_due"] is None and _row(service, "dtn2")["reprobe_due"] is None
            assert service.register_site("dtn2", budget, [DEST.key])["queued"] == 0
            _enqueue_due(service, [DEST.key])
            assert store.job_counts() == {}
        # Past the bound: a transfer refits both links again, their advice is as fresh as it, yet a probe is due.
        clock.advance(probed_at + MAX_AGE_S + 1 - clock())
        for src in (SITE, "dtn2"):
            assert service.observe(DEST.key, 4, rate(4), src=src)["refit"] is True
            row = _row(service, src)
            assert (row["stale"], row["age_s"], row["reprobe_due"]) == (False, 0.0, PROBE_MAX_AGE)
            assert DEST.key not in fresh_destinations(service.paths(src), CONTROL, CONTROL)
        # GET advice serves it, not stale, and queues the local link's probe.
        advice = service.advice(DEST.key, 0.1)
        assert advice["stale"] is False and advice["observations_used"] > 0
        job = store.active_job(DEST.key, CONTROL, src=SITE)
        assert job is not None and job.status == "queued"
        # The local agent's round finds it due (and its probe queued already); the site's registration queues its own.
        assert DEST.key not in fresh_destinations(service.paths(SITE), CONTROL, CONTROL)
        _enqueue_due(service, [DEST.key])
        assert service.register_site("dtn2", budget, [DEST.key])["queued"] == 1
        assert store.job_counts() == {"queued": 2}
        # A new probe ends it.
        for src in (SITE, "dtn2"):
            _probe(service, src)
            assert _row(service, src)["reprobe_due"] is None
            assert fresh_destinations(service.paths(src), CONTROL, CONTROL) == {DEST.key}
    finally:
        store.close()
