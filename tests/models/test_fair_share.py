import numpy as np
import pytest
from numpy.testing import assert_allclose

from models.errors import FitError
from models.fair_share import (
    FORM_ERROR, MIN_COMPETING_FLOWS, fit_fair_share, loss_count_weights, piecewise_fair_share_bps, probe_levels,
)
from models.parallel import CONGESTED, SATURATED, UNCONGESTED, ProbePoint


def test_two_probes_recover_capacity_and_competing_flows():
    # C = 100 Mb/s shared with M = 9 flows: BW_1 = 100/10 = 10 Mb/s, BW_10 = 100 * 10/19 Mb/s.
    fit = fit_fair_share([ProbePoint(1, 10e6), ProbePoint(10, 100e6 * 10 / 19)])
    assert fit.regime == CONGESTED
    assert_allclose((fit.params["capacity_bps"], fit.params["competing_flows"]), (100e6, 9.0), rtol=1e-9)
    # n = 9: 100 * 9/18 = 50 Mb/s; each competing flow drops from C/9 to C/18: impact 1/2.
    assert_allclose(fit.throughput_bps(9), 50e6, rtol=1e-9)
    assert_allclose(fit.impact(np.array([0.0, 9.0])), [0.0, 0.5], rtol=1e-9)
    assert_allclose(fit.capacity_bps, 100e6, rtol=1e-9)
    assert_allclose(fit.residuals, [0.0, 0.0], atol=1e-9)


def test_three_probes_least_squares_is_exact_on_model_data():
    # C = 40 Mb/s, M = 3: BW_n = 40 n / (n + 3) -> 10, 20, 30 Mb/s at n = 1, 3, 9.
    fit = fit_fair_share([ProbePoint(1, 10e6), ProbePoint(3, 20e6), ProbePoint(9, 30e6)])
    assert_allclose((fit.params["capacity_bps"], fit.params["competing_flows"]), (40e6, 3.0), rtol=1e-9)


def test_superlinear_growth_is_uncongested_and_held_flat():
    # BW_10 = 55 Mb/s > 10 x BW_1 = 50 Mb/s: 1/BW = a + b/n gives a < 0, no bottleneck seen.
    fit = fit_fair_share([ProbePoint(1, 5e6), ProbePoint(10, 55e6)])
    assert fit.regime == UNCONGESTED
    # Per-stream rate: geometric mean of 5 and 5.5 Mb/s = sqrt(27.5) Mb/s; flat beyond 10 streams.
    assert_allclose(fit.throughput_bps(20), 10 * np.sqrt(27.5) * 1e6)
    assert fit.impact(20) == 0.0


def test_no_gain_from_more_streams_is_saturated():
    # BW_1 = BW_10: slope M/C = 0, so M is floored and C is the best probe.
    fit = fit_fair_share([ProbePoint(1, 50e6), ProbePoint(10, 50e6)])
    assert fit.regime == SATURATED
    assert fit.params["competing_flows"] == MIN_COMPETING_FLOWS
    assert fit.warnings


def test_needs_two_levels():
    with pytest.raises(FitError):
        fit_fair_share([ProbePoint(4, 10e6), ProbePoint(4, 11e6)])


def test_piecewise_fair_share_goes_through_each_level_and_follows_each_pair():
    levels, rates = (1.0, 10.0, 31.0), (12e6, 55e6, 120e6)
    assert_allclose(piecewise_fair_share_bps(levels, levels, rates), rates, rtol=1e-12)
    # Between and beyond: the fair share through the adjacent (or the highest) pair, exact at both.
    for (n1, r1), (n2, r2), n in (((1, 12e6), (10, 55e6), 4), ((10, 55e6), (31, 120e6), 20),
                                  ((10, 55e6), (31, 120e6), 64)):
        pair = fit_fair_share([ProbePoint(n1, r1), ProbePoint(n2, r2)])
        assert_allclose(piecewise_fair_share_bps(n, levels, rates), pair.throughput_bps(n), rtol=1e-9)
    # Below the lowest level: n x its per-stream rate.
    assert_allclose(piecewise_fair_share_bps(0.5, levels, rates), 6e6)


def test_piecewise_fair_share_holds_flat_where_the_top_pair_has_no_capacity():
    # 10 -> 31 streams more than tripled the rate: the top pair's 1/BW would cross zero beyond 31.
    levels, rates = (1.0, 10.0, 31.0), (12e6, 40e6, 140e6)
    assert_allclose(piecewise_fair_share_bps([31, 64, 1000], levels, rates), [140e6] * 3)


def test_probe_levels_merge_repeated_levels_by_geometric_mean():
    points = [ProbePoint(10, 4e6), ProbePoint(1, 1e6), ProbePoint(10, 9e6)]
    levels, rates = probe_levels(points)
    assert levels == (1.0, 10.0)
    assert_allclose(rates, (1e6, 6e6), rtol=1e-12)


def test_loss_count_weights_are_the_inverse_variance_of_each_probes_rate():
    points = [ProbePoint(1, 10e6, retransmits=25), ProbePoint(10, 50e6, retransmits=400)]
    # 1 / (1 / (4 k) + FORM_ERROR^2): a rate from 25 losses is known to 10 %, from 400 to 2.5 %.
    assert_allclose(loss_count_weights(points), [1 / (0.01 + FORM_ERROR ** 2), 1 / (0.000625 + FORM_ERROR ** 2)])
    # A probe without losses (or without the count) has no such variance: no weights at all.
    assert loss_count_weights([*points, ProbePoint(31, 60e6, retransmits=0)]) is None
    assert loss_count_weights([*points, ProbePoint(31, 60e6)]) is None


def _fair_share_probes(low_factor: float, counts=(20, 400, 2000)) -> list[ProbePoint]:
    # C = 150 Mbit/s shared with M = 15 flows, probed at 1, 10 and 31 streams; the one-stream probe
    # reads low_factor x its share (few losses: a noisy rate).
    exact = {n: 150e6 * n / (n + 15) for n in (1, 10, 31)}
    return [ProbePoint(n, exact[n] * (low_factor if n == 1 else 1.0), retransmits=k)
            for n, k in zip((1, 10, 31), counts)]


def test_weighted_fair_share_leans_on_the_probes_that_counted_more_losses():
    points = _fair_share_probes(1.35)
    plain, weighted = fit_fair_share(points), fit_fair_share(points, weighted=True)
    # The one-stream probe 35 % high makes the curve look more saturated: M = 9.2 unweighted.
    assert plain.competing_flows < 10
    # Weighted by 20 losses against 400 and 2000 (weights 73, 540 and 741 with the form's 3.5 %) it
    # counts for less, and M moves a third of the way back (11.1).
    assert plain.competing_flows < weighted.competing_flows < 15
    assert abs(weighted.competing_flows - 15) < 0.75 * abs(plain.competing_flows - 15)
    assert any("weighted by their loss counts" in w and "20 at 1 stream" in w for w in weighted.warnings)
    assert not any("weighted" in w for w in plain.warnings)
    # Exact probes give the same fit either way.
    exact = _fair_share_probes(1.0)
    assert_allclose(fit_fair_share(exact, weighted=True).competing_flows, 15.0, rtol=1e-9)


def test_weighted_fair_share_needs_three_probes_that_all_lost_segments():
    points = _fair_share_probes(1.35, counts=(0, 400, 2000))
    assert fit_fair_share(points, weighted=True).competing_flows == fit_fair_share(points).competing_flows
    two = _fair_share_probes(1.35)[:2]
    assert fit_fair_share(two, weighted=True).competing_flows == fit_fair_share(two).competing_flows
