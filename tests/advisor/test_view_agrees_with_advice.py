"""The schedulers' SQL view gives GET /v1/advice's stream count for every fit form and budget.

A real SQLite file holds each fit as the service stores it; the view is read with the README's
query, the advice through AdviceService.advice (what the HTTP route answers).
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from advisor.destinations import parse_destination
from advisor.fitcodec import fit_from_stored, fit_from_legacy_record, fit_to_record
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from advisor.tame import DEFAULT_MARGIN, held_impact
from models.auto import MODEL as AUTO, KneeFit, with_flow_rates, with_levels
from models.fair_share import FairShareFit
from models.parallel import CONGESTED, SATURATED, UNCONGESTED, ProbePoint
from tests.sites import SITE

DEST = parse_destination("127.0.0.1:5201")
SCHEDULER_QUERY = ("SELECT coalesce(max(streams), 1) FROM current_advice "
                   "WHERE dest = ? AND impact_bound <= ?")


def log_uniform(low, high):
    return st.floats(math.log10(low), math.log10(high)).map(lambda x: 10.0 ** x)


def polynomial(model, names, regime=CONGESTED):
    coefficient = {"a_prime": log_uniform(1e-19, 1e-14), "b_prime": log_uniform(1e-18, 1e-13),
                   "c_prime": log_uniform(1e-19, 1e-14), "exponent": st.floats(0.5, 3.0)}
    return st.fixed_dictionaries({n: coefficient[n] for n in names}).map(
        lambda params: fit_from_legacy_record(model, params, regime, [1.0, 5.0, 10.0]))


def fair_share(model="fair_share", regime=CONGESTED):
    return st.builds(lambda c, m: FairShareFit(model=model, params={"capacity_bps": c, "competing_flows": m},
                                               regime=regime, probe_streams=(1.0, 10.0, 31.0),
                                               link_capacity_bps=c, competing_flows=m),
                     log_uniform(1e6, 1e11), log_uniform(0.05, 60.0))


def knee():
    def build(share, per_stream, linear_until, plateau_after, shared):
        linear_until = float(linear_until)
        plateau = 0.0 if plateau_after is None else linear_until + plateau_after
        params = {"per_stream_bps": per_stream, "linear_until_streams": linear_until,
                  "plateau_until_streams": plateau,
                  **{f"congested_{k}": v for k, v in shared.params.items()}}
        return KneeFit(model=AUTO, params=params, regime=CONGESTED, probe_streams=(1.0, 10.0, 40.0),
                       per_stream_bps=per_stream, linear_until_streams=linear_until,
                       plateau_until_streams=plateau, congested=shared)
    return st.builds(build, st.just(None), log_uniform(1e5, 3e10), st.integers(1, 10),
                     st.none() | st.integers(0, 30), fair_share(AUTO))


def with_measured_rates(form, first, steps):
    """A fair share made ``form`` (with_flow_rates or with_levels) by rates at 1, 10 and 31 streams, each the
    one before times a step."""
    def build(shared, rate, factors):
        return form(shared, (1.0, 10.0, 31.0), tuple(rate * np.cumprod([1.0, *factors])))
    return st.builds(build, fair_share(AUTO), first, st.lists(steps, min_size=2, max_size=2))


def uncongested():
    return st.builds(lambda rate: FairShareFit(model=AUTO, params={"per_stream_bps": rate}, regime=UNCONGESTED,
                                               probe_streams=(1.0, 10.0), per_stream_bps=rate,
                                               flat_beyond_streams=10.0),
                     log_uniform(1e5, 1e10))


FORMS = {
    "lu": polynomial("lu", ["a_prime", "b_prime"]),
    "lu saturated": polynomial("lu", ["a_prime", "b_prime"], SATURATED),
    "linear": polynomial("linear", ["a_prime", "b_prime"]),
    "full2": polynomial("full2", ["a_prime", "b_prime", "c_prime"]),
    "yildirim": polynomial("yildirim", ["a_prime", "b_prime", "exponent"]),
    "fair_share": fair_share(),
    "knee": knee(),
    # Mathis rates that fall as streams are added; probe rates that rise or fall.
    "timeout regime": with_measured_rates(with_flow_rates, log_uniform(1e4, 1e8), st.floats(0.05, 1.0)),
    "fair share through its probes": with_measured_rates(with_levels, log_uniform(1e5, 1e9), st.floats(0.5, 5.0)),
    "uncongested": uncongested(),
}


def store_fit(service, fitted):
    # Stored as the service stores a probe run's fit, then read back as the service reads it.
    rebuilt = fit_from_stored(**fit_to_record(fitted))
    points = [ProbePoint(streams=n, throughput_bps=float(fitted.throughput_bps(n))) for n in fitted.probe_streams]
    new_fit = service.stored_fit(rebuilt, points, idle_rtt_s=0.04, probed_at=service.clock())
    service.store.record_run(DEST, source="test", idle_rtt_s=0.04, results=[], started_at=service.clock(),
                             fit=new_fit, src=SITE)
    service.drop_cache()
    return rebuilt


def scheduler_streams(store, budget):
    with store.db.transaction() as tx:
        return tx.execute(SCHEDULER_QUERY, (DEST.key, budget)).fetchone()[0]


def stored_curve(store):
    with store.db.transaction() as tx:
        return tx.execute("SELECT c.streams, c.impact, c.impact_bound FROM curve_points c "
                          "JOIN current_fits f ON f.id = c.fit_id WHERE f.dest = ? ORDER BY c.streams",
                          (DEST.key,)).fetchall()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_view_gives_the_api_answer_for_every_budget(tmp_path, form):
    store = Store.open(f"sqlite:///{tmp_path / 'advice.sqlite3'}")
    service = AdviceService(store, Settings(model=AUTO), resolver=lambda host: ["127.0.0.1"])

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(fitted=FORMS[form], budgets=st.lists(st.floats(0.01, 1.0), min_size=10, max_size=10))
    def check(fitted, budgets):
        store_fit(service, fitted)
        curve = stored_curve(store)
        impacts, bounds = np.array([row[1] for row in curve]), np.array([row[2] for row in curve])
        # A predicted impact never falls as streams are added, in the stored curve the view reads.
        assert np.all(np.diff(impacts) >= 0) and np.all(np.diff(bounds) >= 0), impacts
        for budget in budgets:
            api = service.advice(DEST.key, budget)["num_flows"]
            assert scheduler_streams(store, budget) == api, (budget, curve)

    try:
        check()
    finally:
        store.close()


# Exactly on a stored bound and a hair either side: random budgets almost never land within 1e-7 below a bound,
# where the advice once counted a whole stream the view did not.
NEAR_BOUND_OFFSETS = (0.0, -1e-12, 1e-12, -1e-9, 1e-9, -1e-7, 1e-7)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_view_gives_the_api_answer_on_and_beside_every_stored_bound(tmp_path, form):
    store = Store.open(f"sqlite:///{tmp_path / 'advice.sqlite3'}")
    service = AdviceService(store, Settings(model=AUTO), resolver=lambda host: ["127.0.0.1"])

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(fitted=FORMS[form], data=st.data())
    def check(fitted, data):
        store_fit(service, fitted)
        with store.db.transaction() as tx:
            bounds = [b for (b,) in tx.execute("SELECT impact_bound FROM current_advice WHERE dest = ? ORDER BY streams",
                                               (DEST.key,)).fetchall()]
        if not bounds:  # no whole stream advisable: the view answers 1 whatever the budget
            return
        near = st.tuples(st.sampled_from(bounds), st.sampled_from(NEAR_BOUND_OFFSETS)).map(sum).filter(
            lambda b: 0.0 <= b <= 1.0)
        for budget in data.draw(st.lists(near, min_size=8, max_size=8)):
            advice = service.advice(DEST.key, budget)
            view = scheduler_streams(store, budget)
            assert view == advice["num_flows"], (budget, bounds)
            # n* as opened never reaches the first whole count over the budget.
            assert advice["tcp_equivalent_streams"] < view + 1, (budget, advice["tcp_equivalent_streams"])

    try:
        check()
    finally:
        store.close()


def test_knee_impact_held_past_its_plateau():
    # The case from the field: one stream at 24.3 Gbit/s, 17.7 at 10 streams with its plateau ending there,
    # so the knee's own impact fell from 0.92 at 9 streams to 0 at 10 (link conservation starting from 0).
    shared = FairShareFit(model=AUTO, params={"capacity_bps": 1.77e10, "competing_flows": 0.05},
                          regime=CONGESTED, probe_streams=(1.0, 10.0, 40.0), link_capacity_bps=1.77e10,
                          competing_flows=0.05)
    fitted = KneeFit(model=AUTO, params={}, regime=CONGESTED, probe_streams=(1.0, 10.0, 40.0),
                     per_stream_bps=2.43e10, linear_until_streams=1.0, plateau_until_streams=10.0,
                     congested=shared)
    n = np.arange(1, 12)
    assert float(fitted.impact(10)) == 0.0 < float(fitted.impact(9))
    held = np.asarray(held_impact(fitted, n))
    assert np.all(np.diff(held) >= 0)
    # From 9 streams on, the held impact is at least what 9 streams cost: 1 - (1.77e10 / 9) / 2.43e10 = 0.919.
    assert held[8] >= 0.919 and held[9] >= held[8]


def test_migration_holds_curves_stored_before(tmp_path):
    # A curve stored before impacts were held, with the knee's dip at 4 streams (0.52, 0.68, 0.0, 0.17
    # at n = 2..5 in the field): migration 0004 holds it to its running maximum.
    store = Store.open(f"sqlite:///{tmp_path / 'advice.sqlite3'}")
    try:
        service = AdviceService(store, Settings(model=AUTO), resolver=lambda host: ["127.0.0.1"])
        store_fit(service, FairShareFit(model=AUTO, params={"capacity_bps": 1e9, "competing_flows": 2.0},
                                        regime=CONGESTED, probe_streams=(1.0, 10.0), link_capacity_bps=1e9,
                                        competing_flows=2.0))
        dipping = {1: 0.0, 2: 0.52, 3: 0.68, 4: 0.0, 5: 0.17}
        with store.db.transaction(write=True) as tx:
            for n, impact in dipping.items():
                tx.execute("UPDATE curve_points SET impact = ?, impact_bound = ? WHERE streams = ?",
                           (impact, impact, n))
            tx.execute("DELETE FROM schema_migrations WHERE version = 4")
        assert store.db.migrate() == [4]
        held = {n: impact for n, impact, _ in stored_curve(store) if n <= 5}
        assert held == {1: 0.0, 2: 0.52, 3: 0.68, 4: 0.68, 5: 0.68}
        assert scheduler_streams(store, 0.6) == 2
    finally:
        store.close()


def test_migrated_knee_curve_gives_the_api_answer(tmp_path):
    # Found by review: a knee stored before fit records were kept (1, 10 and 31 streams at 44.7, 100 and 100.6 Mbit/s)
    # and read after today's migrations. Its own impact rises to 0.756 at 9 streams and past it towards
    # 10, then falls to 0 at 10 (the plateau's end); held at whole counts only, 10..41 keep 0.756
    # (bound 0.8898), so budgets 0.89-0.915 read 41-46 streams in the view and 9 from the API. And at 1.52
    # streams its impact is 2.2e-16 (rounding on the clean line), which the grid holds and whole counts
    # miss: budgets 0-0.02 read 2 streams in the view and 1 from the API.
    store = Store.open(f"sqlite:///{tmp_path / 'advice.sqlite3'}")
    try:
        service = AdviceService(store, Settings(model=AUTO), resolver=lambda host: ["127.0.0.1"])
        shared = FairShareFit(model=AUTO, params={"capacity_bps": 100640215.02732614,
                                                  "competing_flows": 0.2633284055301953},
                              regime=CONGESTED, probe_streams=(1.0, 10.0, 31.0),
                              link_capacity_bps=100640215.02732614, competing_flows=0.2633284055301953)
        params = {"per_stream_bps": 44721359.54999581, "linear_until_streams": 1.0, "plateau_until_streams": 10.0,
                  **{f"congested_{k}": v for k, v in shared.params.items()}}
        fitted = KneeFit(model=AUTO, params=params, regime=CONGESTED, probe_streams=(1.0, 10.0, 31.0),
                         per_stream_bps=44721359.54999581, linear_until_streams=1.0, plateau_until_streams=10.0,
                         congested=shared)
        store_fit(service, fitted)
        with store.db.transaction(write=True) as tx:
            # As it was stored before records: the fit's own impact, no record.
            for n in range(1, 65):
                impact = float(fitted.impact(float(n)))
                tx.execute("UPDATE curve_points SET impact = ?, impact_bound = ? WHERE streams = ?",
                           (impact, float(DEFAULT_MARGIN.bound(impact)), n))
            tx.execute("UPDATE fits SET record_json = NULL")
            tx.execute("DELETE FROM schema_migrations WHERE version IN (4, 9)")
        # 0004 holds it over whole counts in SQL; 0009 writes it again from the fit, over the search grid.
        assert store.db.migrate() == [4, 9]
        service.drop_cache()
        for budget in np.round(np.arange(0.0, 1.0001, 0.005), 3):
            assert scheduler_streams(store, float(budget)) == service.advice(DEST.key, float(budget))["num_flows"], budget
    finally:
        store.close()


def test_view_gives_the_api_answer_per_congestion_control(tmp_path):
    # Two controls' fits of one destination, stored in turn: each control's rows in the view give its own advice.
    store = Store.open(f"sqlite:///{tmp_path / 'advice.sqlite3'}")
    service = AdviceService(store, Settings(model=AUTO, congestion_control="bbr"), resolver=lambda host: ["127.0.0.1"])
    query = ("SELECT coalesce(max(streams), 1) FROM current_advice WHERE dest = ? AND congestion_control = ? "
             "AND impact_bound <= ?")

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(fits=st.tuples(FORMS["knee"], FORMS["fair_share"]), budgets=st.lists(st.floats(0.01, 1.0), min_size=5, max_size=5))
    def check(fits, budgets):
        for control, fitted in zip(("bbr", "cubic"), fits):
            rebuilt = fit_from_stored(**fit_to_record(fitted))
            points = [ProbePoint(streams=n, throughput_bps=float(fitted.throughput_bps(n))) for n in fitted.probe_streams]
            store.record_run(DEST, source="test", idle_rtt_s=0.04, results=[], started_at=service.clock(),
                             fit=service.stored_fit(rebuilt, points, 0.04, service.clock(), congestion_control=control),
                             congestion_control=control, src=SITE)
        service.drop_cache()
        for budget in budgets:
            for control in ("bbr", "cubic"):
                with store.db.transaction() as tx:
                    view = tx.execute(query, (DEST.key, control, budget)).fetchone()[0]
                assert view == service.advice(DEST.key, budget, control)["num_flows"], (control, budget)

    try:
        check()
    finally:
        store.close()


# The staleness a scheduler reading SQL works out (docs/advice-service.md): the newest evidence behind the current fit,
# its transfers' when it was refitted on some, against the service's TAME_TTL_S.
STALE_QUERY = ("SELECT ? - CASE WHEN observations_used > 0 AND fitted_at > probed_at THEN fitted_at ELSE probed_at END "
               "> ? FROM current_fits WHERE src = ? AND dest = ? AND congestion_control = ?")


def test_the_documented_sql_gives_the_api_s_staleness(tmp_path):
    from tests.api.conftest import Clock

    clock = Clock()
    store = Store.open(f"sqlite:///{tmp_path / 'advice.sqlite3'}", clock=clock)
    ttl = 600.0
    service = AdviceService(store, Settings(model="lu", congestion_control="cubic", ttl_s=ttl), clock=clock,
                            resolver=lambda host: ["127.0.0.1"])
    from probes.result import ProbeResult

    results = [ProbeResult(dest=DEST.key, streams=n, throughput_bps=1e9 * n / (n + 4), duration_s=10.0, omit_s=0.0,
                           sender_bps=None, congestion_control="cubic") for n in (1, 10)]

    def both():
        service.drop_cache()
        with store.db.transaction() as tx:
            view = bool(tx.execute(STALE_QUERY, (clock(), ttl, SITE, DEST.key, "cubic")).fetchone()[0])
        return view, service.advice(DEST.key, 0.3, "cubic", src=SITE)["stale"]

    try:
        service.ingest_run(DEST, 0.04, results, clock(), source="test", congestion_control="cubic", src=SITE)
        seen = []
        for step in (0, 599, 2, 300):  # fresh, at the TTL, past it; then a transfer refits it: fresh again
            clock.advance(step)
            if step == 300:
                service.observe(DEST.key, 4, 5e8, congestion_control="cubic", src=SITE)
            seen.append(both())
        clock.advance(601)
        seen.append(both())
        assert seen == [(False, False), (False, False), (True, True), (False, False), (True, True)]
    finally:
        store.close()
