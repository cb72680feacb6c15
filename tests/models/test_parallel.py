import math

import numpy as np
import pytest
from numpy.testing import assert_allclose

from models.buffer import per_stream_buffer_bytes
from models.errors import FitError
from models.parallel import (
    CONGESTED,
    SATURATED,
    UNCONGESTED,
    ProbePoint,
    fit_full_order2,
    fit_linear,
    fit_lu,
    lu_partial_order2_params,
    relative_throughput_change,
)

# A path with a' = 1e-16 and b' = 4e-16 (s/bit)^2: BW_n = n / sqrt(1e-16 n^2 + 4e-16).
# BW_1 = 1/sqrt(5e-16) = 44.72 Mbit/s; BW_10 = 10/sqrt(1.04e-14) = 98.06 Mbit/s; capacity 1/sqrt(a') = 100 Mbit/s.
A, B = 1e-16, 4e-16


def lu_rate(n):
    return n / math.sqrt(A * n * n + B)


def test_two_exact_probes_give_back_a_and_b():
    fit = fit_lu([ProbePoint(1, lu_rate(1)), ProbePoint(10, lu_rate(10))])
    assert fit.regime == CONGESTED
    assert_allclose([fit.params["a_prime"], fit.params["b_prime"]], [A, B], rtol=1e-9)
    assert_allclose(fit.capacity_bps, 1e8, rtol=1e-9)
    assert_allclose(fit.throughput_bps([5, 30]), [lu_rate(5), lu_rate(30)], rtol=1e-9)


def test_closed_form_matches_eq_10_11():
    # a' = (100/BW10^2 - 1/BW1^2) / 99 = (1.04e-14 - 5e-16) / 99 = 1e-16; b' = 5e-16 - 1e-16 = 4e-16
    a, b = lu_partial_order2_params(1, lu_rate(1), 10, lu_rate(10))
    assert_allclose([a, b], [A, B], rtol=1e-9)


def test_impact_partial_order2_closed_form():
    # impact(n) = 1 - sqrt(b'/(a' n^2 + b')): n = 2 -> 1 - sqrt(4/8) = 0.29289; n = 0 -> 0
    fit = fit_lu([ProbePoint(1, lu_rate(1)), ProbePoint(10, lu_rate(10))])
    assert_allclose(fit.impact(2), 1 - math.sqrt(0.5), rtol=1e-9)
    assert fit.impact(0) == 0.0
    assert np.all(np.diff(fit.impact(np.arange(0, 64))) > 0)


def test_relative_change_eq16():
    # going from p' = 1 to p' = 4: every competing flow runs at sqrt(1/4) = half speed
    assert_allclose(relative_throughput_change(1.0, 4.0), 0.5)


def test_least_squares_with_more_probes_than_parameters():
    # Three exact probes of the same path: the least-squares fit is still exact.
    fit = fit_lu([ProbePoint(n, lu_rate(n)) for n in (1, 5, 10)])
    assert_allclose([fit.params["a_prime"], fit.params["b_prime"]], [A, B], rtol=1e-9)
    assert_allclose(fit.residuals, 0, atol=1e-9)


def test_least_squares_averages_noisy_repeats():
    # Repeats at n = 10 at +-2 %: the fit passes between them, residuals of opposite sign.
    points = [ProbePoint(1, lu_rate(1)), ProbePoint(10, lu_rate(10) * 1.02), ProbePoint(10, lu_rate(10) * 0.98)]
    fit = fit_lu(points)
    assert fit.residuals[1] < 0 < fit.residuals[2]
    assert_allclose(fit.throughput_bps(10), lu_rate(10), rtol=0.002)


def test_linear_model_exact_from_two_probes():
    # p' = a n + b with a = 2e-16, b = 3e-16: BW_n = n / sqrt(a n + b)
    rate = lambda n: n / math.sqrt(2e-16 * n + 3e-16)
    fit = fit_linear([ProbePoint(1, rate(1)), ProbePoint(8, rate(8))])
    assert_allclose([fit.params["a_prime"], fit.params["b_prime"]], [2e-16, 3e-16], rtol=1e-9)
    assert fit.capacity_bps is None  # grows like sqrt(n) without bound


def test_full_order2_exact_from_three_probes():
    rate = lambda n: n / math.sqrt(1e-16 * n * n + 0.5e-16 * n + 4e-16)
    fit = fit_full_order2([ProbePoint(n, rate(n)) for n in (1, 5, 10)])
    assert fit.model == "full2" and len(fit.params) == 3
    assert_allclose(list(fit.params.values()), [1e-16, 0.5e-16, 4e-16], rtol=1e-7)
    # impact(n) = 1 - sqrt(c'/p'(n)): n = 2 -> 1 - sqrt(4/(4 + 1 + 4)) = 1/3
    assert_allclose(fit.impact(2), 1 / 3, rtol=1e-7)


def test_full_order2_falls_back_when_not_physical():
    # Throughput that rises then falls sharply makes p' non-monotone; the fit says so.
    fit = fit_full_order2([ProbePoint(1, 50e6), ProbePoint(5, 40e6), ProbePoint(10, 95e6)])
    assert any("not physical" in w for w in fit.warnings)
    assert np.all(np.isfinite(fit.throughput_bps(np.arange(1, 65))))


def test_uncongested_probes_are_flagged_and_held_flat():
    # 10 streams ran 12x faster than 1 stream: a' from eq. 10 is negative (no congestion seen).
    fit = fit_lu([ProbePoint(1, 10e6), ProbePoint(10, 120e6)])
    assert fit.regime == UNCONGESTED and fit.warnings
    assert fit.params["a_prime"] == 0.0
    assert_allclose(fit.throughput_bps(40), fit.throughput_bps(10))
    assert np.all(fit.impact(np.arange(0, 65)) == 0)


def test_second_probe_slower_is_flagged_saturated_without_nan():
    # b' from eq. 11 is <= 0 exactly when BW(n2) <= BW(n1).
    a, b = lu_partial_order2_params(1, 90e6, 10, 85e6)
    assert b <= 0
    fit = fit_lu([ProbePoint(1, 90e6), ProbePoint(10, 85e6)])
    assert fit.regime == SATURATED
    values = np.concatenate([fit.throughput_bps(np.arange(1, 65)), fit.impact(np.arange(0, 65))])
    assert np.all(np.isfinite(values))
    assert fit.params["b_prime"] > 0


def test_close_probe_levels_warn():
    fit = fit_lu([ProbePoint(4, lu_rate(4)), ProbePoint(5, lu_rate(5))])
    assert any("too close" in w for w in fit.warnings)


@pytest.mark.parametrize("points", [
    [ProbePoint(5, 1e6), ProbePoint(5, 2e6)],
    [ProbePoint(1, 1e6)],
    [],
])
def test_too_few_levels_is_a_fit_error(points):
    with pytest.raises(FitError):
        fit_lu(points)


@pytest.mark.parametrize("bad", [ProbePoint(0, 1e6), ProbePoint(2, 0.0), ProbePoint(2, float("nan"))])
def test_invalid_probe_values(bad):
    with pytest.raises(ValueError):
        fit_lu([ProbePoint(1, 1e6), bad])


def test_rao_feng_buffer_sums_below_bdp():
    # 100 Mbit/s x 40 ms = 500,000 bytes BDP; 95 % over 4 streams = 118,750 bytes each.
    assert per_stream_buffer_bytes(100e6, 0.04, 4) == 118750
    assert per_stream_buffer_bytes(100e6, 0.04, 4) * 4 < 100e6 * 0.04 / 8
    with pytest.raises(ValueError, match="streams"):
        per_stream_buffer_bytes(100e6, 0.04, 0)
