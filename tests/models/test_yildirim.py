import numpy as np
import pytest
from numpy.testing import assert_allclose

from models.errors import FitError
from models.parallel import CONGESTED, ProbePoint
from models.yildirim import fit_yildirim, yildirim_params


def _rate(n, a, b, c):
    return n / np.sqrt(a * n**c + b)


def test_three_exact_probes_give_back_a_b_and_the_exponent():
    # p' = 1e-16 n^1.6 + 4e-16: three probes on the curve pin all three parameters.
    a, b, c = 1e-16, 4e-16, 1.6
    fit = fit_yildirim([ProbePoint(n, _rate(n, a, b, c)) for n in (1, 5, 10)])
    assert fit.regime == CONGESTED
    assert_allclose((fit.params["a_prime"], fit.params["b_prime"], fit.params["exponent"]), (a, b, c), rtol=1e-5)
    assert_allclose(fit.throughput_bps(30), _rate(30, a, b, c), rtol=1e-5)
    assert_allclose(fit.residuals, 0.0, atol=1e-6)


def test_exponent_two_is_lus_model():
    # With c = 2 the form is Lu's a' n^2 + b': capacity 1/sqrt(a'), impact 1 - sqrt(b'/(a' n^2 + b')).
    a, b = 1e-16, 4e-16
    fit = fit_yildirim([ProbePoint(n, _rate(n, a, b, 2.0)) for n in (1, 4, 10)])
    assert_allclose(fit.params["exponent"], 2.0, rtol=1e-5)
    assert_allclose(fit.capacity_bps, 1e8, rtol=1e-4)
    # n = 2: p' = 4e-16 + 4e-16 = 8e-16, so impact = 1 - sqrt(4/8) = 1 - 0.7071.
    assert_allclose(fit.impact(2), 1 - np.sqrt(0.5), rtol=1e-4)


def test_more_probes_fit_by_least_squares():
    # Four probes with +-2 % errors: the fitted curve stays within the errors at the probes.
    a, b, c = 2e-16, 1e-15, 1.4
    noise = (0.02, -0.02, 0.01, -0.01)
    points = [ProbePoint(n, _rate(n, a, b, c) * (1 + e)) for n, e in zip((1, 3, 10, 20), noise)]
    fit = fit_yildirim(points)
    assert np.max(np.abs(fit.residuals)) < 0.03
    assert 1.0 <= fit.params["exponent"] <= 4.0


def test_linear_growth_falls_back_to_lu_and_says_so():
    # Throughput in proportion to n: p' is constant, a' = 0 for every exponent, so c is not defined.
    fit = fit_yildirim([ProbePoint(1, 1e6), ProbePoint(4, 4e6), ProbePoint(8, 8e6)])
    assert fit.model == "yildirim"
    assert set(fit.params) == {"a_prime", "b_prime"}
    assert any("exponent" in w for w in fit.warnings)


def test_exponent_is_kept_in_range():
    # Probes that would need c > 4 (a collapse after the peak) are fitted at the bound.
    a, b, c = 1e-19, 1e-14, 5.0
    _, _, fitted_c = yildirim_params([1, 5, 10], [_rate(n, a, b, c) for n in (1, 5, 10)])
    assert fitted_c == pytest.approx(4.0)


def test_needs_three_levels():
    with pytest.raises(FitError, match="3 different stream counts"):
        fit_yildirim([ProbePoint(1, 1e6), ProbePoint(10, 5e6), ProbePoint(10, 5.1e6)])
