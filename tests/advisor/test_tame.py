import math

import numpy as np
import pytest
from numpy.testing import assert_allclose

from advisor.tame import NO_MARGIN, ImpactMargin, fractional_multiplier_for, predicted_curve, tame_parallel_tcp
from models.parallel import ProbePoint, fit_lu

A, B = 1e-16, 4e-16  # BW_n = n / sqrt(A n^2 + B): 44.7 Mbit/s at n = 1, capacity 100 Mbit/s


def rate(n):
    return n / math.sqrt(A * n * n + B)


PROBES = [ProbePoint(1, rate(1)), ProbePoint(10, rate(10))]
# These tests check Lu's closed forms (eq. 5-16) and TameParallelTCP's search on them exactly.
LU = "lu"


def test_n_star_closed_form():
    # impact(n) = I  <=>  n^2 = b'(1/(1-I)^2 - 1)/a'. For I = 0.5: n^2 = 4 * (4 - 1) = 12, n* = 3.4641
    advice = tame_parallel_tcp(PROBES, max_impact=0.5, model=LU, margin=NO_MARGIN, fractional_margin=NO_MARGIN)
    assert_allclose(advice.tcp_equivalent_streams, math.sqrt(12), atol=1e-4)
    assert advice.num_flows == 3
    # remainder r = 0.4641 -> FM = 1/r^2 = 4.642
    assert_allclose(advice.fractional_multiplier, 1 / (math.sqrt(12) - 3) ** 2, rtol=1e-3)
    assert_allclose(advice.max_nondisruptive_throughput_bps, rate(3), rtol=1e-9)
    # impact(3) = 1 - sqrt(4/13) = 0.4453
    assert_allclose(advice.cross_traffic_impact, 1 - math.sqrt(4 / 13), rtol=1e-9)
    assert advice.cross_traffic_impact <= 0.5
    assert advice.regime == "congested" and advice.warnings == []
    # The transfer opens 3 standard streams and one fractional stream for the remainder.
    assert advice.opened_streams() == (3, advice.fractional_multiplier)


def test_budget_below_one_stream_gives_one_stream_and_a_warning():
    # impact(1) = 1 - sqrt(4/5) = 0.1056 > 0.05; n* = sqrt(4 * (1/0.95^2 - 1)) = 0.65737
    advice = tame_parallel_tcp(PROBES, max_impact=0.05, model=LU, margin=NO_MARGIN, fractional_margin=NO_MARGIN)
    assert advice.num_flows == 1
    assert_allclose(advice.tcp_equivalent_streams, math.sqrt(4 * (1 / 0.95**2 - 1)), atol=1e-4)
    # r = n* when n* < 1: FM = 1/0.65737^2 = 2.3141
    assert_allclose(advice.fractional_multiplier, 2.3141, rtol=1e-3)
    assert any("even one stream" in w for w in advice.warnings)
    # Below one stream the fractional stream is the whole transfer.
    assert advice.opened_streams() == (0, advice.fractional_multiplier)


def test_fractional_stream_is_held_against_its_own_margin():
    # Whole streams by Lu's bare rule (n* = 3.4641 at budget 0.5); the fractional stream's remainder is
    # held against impact + absolute <= 0.5, i.e. n^2 = 4 (1/(1 - (0.5 - absolute))^2 - 1).
    def advice_with(absolute, budget=0.5):
        return tame_parallel_tcp(PROBES, max_impact=budget, model=LU, margin=NO_MARGIN,
                                 fractional_margin=ImpactMargin(0.0, absolute))

    advice = advice_with(0.02)  # impact <= 0.48: n = 3.2853
    assert advice.num_flows == 3
    assert_allclose(advice.tcp_equivalent_streams, math.sqrt(4 * (1 / 0.52**2 - 1)), atol=1e-4)
    assert_allclose(advice.fractional_multiplier, 1 / (math.sqrt(4 * (1 / 0.52**2 - 1)) - 3) ** 2, rtol=1e-3)
    # impact <= 0.4: n = 2.667, below the whole streams: no fractional stream, the whole streams stay.
    advice = advice_with(0.1)
    assert (advice.num_flows, advice.tcp_equivalent_streams, advice.fractional_multiplier) == (3, 3.0, None)
    assert advice.opened_streams() == (3, None)
    # Below one stream (budget 0.05, n* = 0.657 bare): impact <= 0.03 gives n = 0.50125, FM 3.98.
    advice = advice_with(0.02, budget=0.05)
    assert_allclose(advice.tcp_equivalent_streams, math.sqrt(4 * (1 / 0.97**2 - 1)), atol=1e-4)
    assert advice.opened_streams() == (0, advice.fractional_multiplier)
    # impact <= 0.0001 gives n = 0.028: the gentlest fractional stream offered (r = 0.05, FM 400), not one
    # standard stream.
    advice = advice_with(0.0499, budget=0.05)
    assert advice.tcp_equivalent_streams == 0.05
    assert_allclose(advice.fractional_multiplier, 400.0)
    assert advice.opened_streams() == (0, advice.fractional_multiplier)


def test_full_budget_is_capped_at_n_max():
    advice = tame_parallel_tcp(PROBES, max_impact=1.0, n_max=16, model=LU, margin=NO_MARGIN)
    assert advice.num_flows == 16 and advice.tcp_equivalent_streams == 16
    assert advice.fractional_multiplier is None and advice.opened_streams() == (16, None)


def test_zero_budget():
    advice = tame_parallel_tcp(PROBES, max_impact=0.0, model=LU, margin=NO_MARGIN)
    assert advice.num_flows == 1 and advice.tcp_equivalent_streams == 0.0
    assert advice.fractional_multiplier is None and advice.opened_streams() == (1, None)


def test_fractional_multiplier_rules():
    assert fractional_multiplier_for(3.02) is None  # remainder under 0.05
    assert fractional_multiplier_for(0.02) is None  # FM = 2500 > 1000
    assert_allclose(fractional_multiplier_for(2.5), 4.0)


def test_fractional_multiplier_of_a_remainder_is_the_same_whatever_the_whole_streams():
    # n* = k + r opens k standard streams and one tame stream carrying r, so its FM depends on r alone: 1/r^2 by the
    # FM^-1/2 theory, 400 for the smallest remainder offered (MIN_FRACTION, 0.05). In binary floating point 2.05 - 2
    # is 0.04999999999999982, and n* = 2.05 (3.05, 4.05, ...) offered no fractional stream where 0.05 and 1.05 did.
    for k in range(0, 65):
        assert fractional_multiplier_for(k + 0.05) == 400.0, k
        assert fractional_multiplier_for(k + 0.4) == 6.25, k
        assert fractional_multiplier_for(k + 0.0499) is None, k
        for rtt_s, control in ((0.04, "cubic"), (0.01, "bbr")):
            assert fractional_multiplier_for(k + 0.05, rtt_s, control) == fractional_multiplier_for(0.05, rtt_s, control)


def test_uncongested_advice_is_capped_at_highest_probe():
    advice = tame_parallel_tcp([ProbePoint(1, 10e6), ProbePoint(10, 120e6)], max_impact=0.1, model=LU, margin=NO_MARGIN)
    assert advice.regime == "uncongested"
    assert advice.num_flows == 10 and advice.cross_traffic_impact == 0.0
    assert advice.warnings


def test_saturated_path_advises_the_lowest_level_without_nan():
    advice = tame_parallel_tcp([ProbePoint(1, 90e6), ProbePoint(10, 85e6)], max_impact=0.1, model=LU, margin=NO_MARGIN)
    assert advice.regime == "saturated" and advice.num_flows == 1
    assert all(math.isfinite(v) for v in (advice.max_nondisruptive_throughput_bps, advice.cross_traffic_impact))


def test_buffer_advice_uses_idle_rtt_and_capacity():
    # capacity 1/sqrt(a') = 100 Mbit/s, RTT 40 ms -> BDP 500 kB; 95 % over 3 streams = 158,333 bytes
    advice = tame_parallel_tcp(PROBES, max_impact=0.5, idle_rtt_s=0.04, model=LU, margin=NO_MARGIN)
    assert advice.per_stream_buffer_bytes == 158333


def test_invalid_budget_and_model():
    with pytest.raises(ValueError, match="max_impact"):
        tame_parallel_tcp(PROBES, max_impact=1.5, model=LU, margin=NO_MARGIN)
    with pytest.raises(ValueError, match="unknown model"):
        tame_parallel_tcp(PROBES, max_impact=0.1, model="nope")


def test_predicted_curve_matches_model():
    curve = predicted_curve(fit_lu(PROBES), n_max=31)
    assert [p.streams for p in curve] == list(range(1, 32))
    assert_allclose([p.throughput_bps for p in curve], [rate(n) for n in range(1, 32)], rtol=1e-9)
    assert np.all(np.diff([p.impact for p in curve]) > 0)


def test_advise_from_plan_uses_probe_rtts_and_idle_rtt():
    from advisor.tame import advise_from_plan
    from probes.result import PlanResult, ProbeResult

    probes = tuple(
        ProbeResult(dest="h", streams=n, duration_s=10, omit_s=2, throughput_bps=rate(n), sender_bps=rate(n) * 1.01,
                    rtt_mean_s=0.05)
        for n in (1, 10)
    )
    advice = advise_from_plan(PlanResult(dest="h", idle_rtt_s=0.04, probes=probes), max_impact=0.5, model=LU, margin=NO_MARGIN)
    assert advice.num_flows == 3 and advice.per_stream_buffer_bytes == 158333  # idle RTT wins over 50 ms
    advice = advise_from_plan(PlanResult(dest="h", idle_rtt_s=None, probes=probes), max_impact=0.5, model=LU, margin=NO_MARGIN)
    # no idle RTT: 100 Mbit/s x 50 ms = 625,000 B; 95 % / 3 = 197,916
    assert advice.per_stream_buffer_bytes == 197916


def test_latent_losses_up_to_a_full_link_advise_the_streams_that_fill_it():
    # The test bed's loss-limited path (100 Mbit/s, 40 ms, 0.1 % random loss, nobody else): one stream 10.6 Mbit/s,
    # ten 95.5 at the same loss rate, forty 95.6 losing more (benchmarks/results/testbed.md). Ten streams fill the
    # link without taking from anyone (the loss rate did not grow), so the advice is ten, not the one stream the
    # fair share of competing flows allowed before latent losses were read.
    def probe(n, bps, p):
        return ProbePoint(n, bps, rtt_s=0.04, retransmits=p * bps * 30 / 8000, duration_s=30, mss_bytes=1000)

    advice = tame_parallel_tcp([probe(1, 10.64e6, 0.001), probe(10, 95.53e6, 0.001), probe(40, 95.62e6, 0.0065)], 0.1)
    assert advice.num_flows == 10 and advice.cross_traffic_impact == 0.0
    assert advice.model == "auto"


def test_rounding_noise_is_no_impact_for_the_margin():
    from advisor.tame import DEFAULT_MARGIN
    # A knee's clean line reads 2.2e-16 at 1.52 streams (rounding): no margin's +0.02 on top of that.
    assert DEFAULT_MARGIN.bound(2.2e-16) == 2.2e-16
    assert DEFAULT_MARGIN.bound(0.0) == 0.0
    assert DEFAULT_MARGIN.bound(0.1) == pytest.approx(0.1 * 1.15 + 0.02)


# Fits whose stored bounds the budgets below sit on: the review's probe run (1 stream 42 Mbit/s, 10 streams
# 88: bounds 0.69936, 0.80668 and 0.92047 at 2, 3 and 5 streams), Lu's path above and others of each form.
NEAR_BOUND_FITS = {
    "review auto": ("auto", [ProbePoint(1, 42e6), ProbePoint(10, 88e6)]),
    "lu": (LU, PROBES),
    "auto on lu's path": ("auto", PROBES),
    "knee": ("auto", [ProbePoint(1, 44.72e6), ProbePoint(10, 100e6), ProbePoint(31, 100.64e6)]),
    "slow start": ("auto", [ProbePoint(1, 10e6), ProbePoint(10, 60e6)]),
}
# Exactly on a bound, and 1e-12, 1e-9 and 1e-7 either side: before, budgets up to ~1e-7 below a bound at k
# streams got k from the advice and k - 1 from the view.
NEAR_BOUND_OFFSETS = (0.0, -1e-12, 1e-12, -1e-9, 1e-9, -1e-7, 1e-7)


def view_streams(curve, budget):
    # The schedulers' query, SELECT coalesce(max(streams), 1) FROM current_advice WHERE impact_bound <= B,
    # on the curve the store keeps (the view holds its advisable rows).
    return max([point.streams for point, advisable in curve if advisable and point.impact_bound <= budget], default=1)


@pytest.mark.parametrize("name", sorted(NEAR_BOUND_FITS))
def test_whole_streams_are_the_views_answer_on_and_beside_every_bound(name):
    from advisor.tame import DEFAULT_FRACTIONAL_MARGIN, DEFAULT_MARGIN, advise, held_impact, stored_curve
    from models.registry import fit

    model, probes = NEAR_BOUND_FITS[name]
    fitted = fit(model, probes)
    curve = stored_curve(fitted, 64)
    bounds = sorted({point.impact_bound for point, advisable in curve[:40] if advisable})
    budgets = sorted({b + d for b in bounds for d in NEAR_BOUND_OFFSETS if 0.0 <= b + d <= 1.0})
    assert len(budgets) > 20, bounds
    for budget in budgets:
        advice = advise(fitted, budget, 64)
        assert advice.num_flows == view_streams(curve, budget), budget
        n_star = advice.tcp_equivalent_streams
        # n* never reaches the first whole count over the budget, nor falls below the whole streams opened.
        assert n_star < advice.num_flows + 1, (budget, n_star)
        if view_streams(curve, budget) >= 1 and curve[0][0].impact_bound <= budget:
            assert n_star >= advice.num_flows, (budget, n_star)
        # Its remainder is held against the fractional margin, and all of it against the whole streams' one
        # (the gentlest fractional stream, MIN_FRACTION, is offered below one stream whatever it costs).
        if n_star > advice.num_flows or 0.05 < n_star < 1:
            held = float(held_impact(fitted, n_star))
            assert float(DEFAULT_FRACTIONAL_MARGIN.bound(held)) <= budget, (budget, n_star)
            assert float(DEFAULT_MARGIN.bound(held)) <= budget, (budget, n_star)


def test_review_budgets_a_hair_below_a_bound_get_the_streams_below_it():
    # The review's cases: GET /v1/advice answered 2, 3 and 5 streams where the view answered 1, 2 and 4.
    from advisor.tame import advise, stored_curve
    from models.registry import fit

    fitted = fit("auto", [ProbePoint(1, 42e6), ProbePoint(10, 88e6)])
    curve = stored_curve(fitted, 64)
    assert_allclose([curve[k - 1][0].impact_bound for k in (2, 3, 5)], [0.69936, 0.80668, 0.92047], atol=1e-5)
    for budget, streams in ((0.6993594, 1), (0.80667582, 2), (0.92047169, 4)):
        advice = advise(fitted, budget)
        assert advice.num_flows == streams == view_streams(curve, budget), budget
        assert advice.tcp_equivalent_streams < streams + 1


def test_search_stops_on_the_budgets_side_of_the_crossing():
    from advisor.tame import largest_parallelism_within

    # Lu's path: impact(n) = 1 - sqrt(B / (A n^2 + B)) = I  <=>  n = sqrt(4 (1 / (1 - I)^2 - 1)). Budgets on
    # the impact at 2, 3 and 5 streams and a hair either side: the search answers the largest n whose impact
    # is within the budget, never one past the crossing.
    fitted = fit_lu(PROBES)
    for k in (2, 3, 5):
        at_k = float(fitted.impact(float(k)))
        for budget in (at_k, np.nextafter(at_k, 0.0), at_k - 1e-12, at_k - 1e-9, at_k + 1e-12):
            n = largest_parallelism_within(fitted, budget, 64)
            assert float(fitted.impact(n)) <= budget, (k, budget, n)
            assert_allclose(n, math.sqrt(4 * (1 / (1 - budget) ** 2 - 1)), atol=1e-9)
            assert (n >= k) == (at_k <= budget), (k, budget, n)


def test_n_star_is_published_rounded_down():
    from advisor.tame import published_streams

    # Rounded to nearest, 2.99996 would read 3 (a whole stream over the budget) and 1.76698 1.767 (past the
    # fractional stream's bound): the published n* is never above the one found.
    assert published_streams(2.99996) == 2.9999
    assert published_streams(1.76698) == 1.7669
    assert published_streams(math.nextafter(3.0, 0.0)) == 2.9999
    assert published_streams(3.0) == 3.0 and published_streams(2.54214) == 2.5421 and published_streams(0.0) == 0.0
    for n in np.random.default_rng(7).uniform(0, 64, 2000):
        assert n - 1e-4 < published_streams(float(n)) <= n


def test_calibration_warnings_name_an_fm_and_an_rtt_past_what_the_law_was_measured_over():
    from advisor.tame import calibration_warnings
    from models.tame_share import AGGREGATE_LAWS, LAWS, RTT_REACH

    law = LAWS["cubic"]
    first, last = law.base_share[0][0], law.base_share[-1][0]
    assert calibration_warnings(10.0, "cubic", first) == []
    assert calibration_warnings(10.0, "cubic", first / RTT_REACH * 1.001) == []  # just inside the reach
    short, = calibration_warnings(10.0, "cubic", first / RTT_REACH * 0.99)
    long, = calibration_warnings(10.0, "cubic", last * RTT_REACH * 1.01)
    for said in (short, long):
        assert "outside the RTTs" in said and "/".join(f"{r * 1000:.0f}" for r, _ in law.base_share) in said
    fm_and_rtt = calibration_warnings(law.max_calibrated_fm * 2, "cubic", 1.0)
    assert len(fm_and_rtt) == 2 and f"past the FM {law.max_calibrated_fm:g}" in fm_and_rtt[0]
    # the aggregate form is held against its own law's RTTs and FMs
    agg = AGGREGATE_LAWS["cubic"]
    assert calibration_warnings(agg.max_calibrated_fm, "cubic", agg.base_share[0][0], aggregate=True) == []
    assert len(calibration_warnings(agg.max_calibrated_fm + 1, "cubic", 0.002, aggregate=True)) == 2
    # unmeasured controls (theory), no tame stream, or an unknown RTT: nothing to hold them against
    assert calibration_warnings(500.0, "bbr", 1.0) == []
    assert calibration_warnings(None, "cubic", 1.0) == []
    assert calibration_warnings(10.0, "cubic", None) == []
    assert calibration_warnings(10.0, "cubic", math.inf) == calibration_warnings(10.0, "cubic", math.nan) == []


def test_window_floor_warning_when_n_streams_cannot_go_as_low_as_n_star_asks():
    from advisor.tame import WINDOW_FLOOR_REACH, most_aggregate_streams, window_floor_warning
    from models.tame_share import window_floor_bps

    rtt = 0.0183
    per_stream = window_floor_bps(1, rtt)
    assert_allclose(per_stream, 2 * 1448 * 8 / rtt)  # two full segments a round trip
    n_star_bps = 13.03e6  # 2 cubic streams' goodput on the 50 Mbit/s bed at 10 ms (tame-cc-aggregate-10ms.md)
    # 8 streams' floor (10.1 Mbit/s) is 0.78 of it: no warning; 16 streams' (20.3 Mbit/s) is past it
    assert window_floor_bps(8, rtt) < WINDOW_FLOOR_REACH * n_star_bps <= window_floor_bps(9, rtt)
    assert window_floor_warning(8, rtt, 2.0, n_star_bps) is None
    said = window_floor_warning(16, rtt, 2.0, n_star_bps)
    assert said.startswith("16 tame streams at RTT 18.3 ms send at least about 20.3 Mbit/s")
    assert said.endswith("open at most 8 streams")
    # too few streams left to carry n*: the fractional form
    assert window_floor_warning(16, rtt, 9.0, n_star_bps).endswith("open the fractional form (no --streams)")
    # not even one stream's floor (1.27 Mbit/s) is below 0.8 of n*'s 1.5 Mbit/s: neither form goes that low
    assert window_floor_warning(3, rtt, 2.0, 1.5e6).endswith(
        "not even one stream goes that low at this RTT: any TCP transfer here sends at least 0.84 of n*'s share")
    # no RTT or no throughput: nothing to hold them against
    for rtt_s, bps in ((None, n_star_bps), (0.0, n_star_bps), (math.inf, n_star_bps), (math.nan, n_star_bps),
                       (rtt, 0.0), (rtt, math.nan), (rtt, math.inf)):
        assert window_floor_warning(16, rtt_s, 2.0, bps) is None
        assert most_aggregate_streams(rtt_s, bps) is None
