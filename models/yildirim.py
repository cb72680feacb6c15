"""Yildirim et al.'s generalisation of Lu's model: p'_n = a' n^c + b' with the exponent c fitted too.

E. Yildirim, D. Yin, T. Kosar, "Prediction of optimal parallelism level in wide area data
transfers", IEEE TPDS 22(12), 2011: BW_n = n / sqrt(a' n^c + b') (their eq. 4) needs three probes.
Lu's partial order-2 model is the case c = 2. The curve peaks where c > 2 and grows without
bound where c < 2, so the exponent is kept inside a physical range.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from models.parallel import (
    CONGESTED, PolynomialFit, ProbePoint, _level_warnings, _validated, _with_residuals, fit_lu,
)

# The exponent is searched in this range: below 1 the aggregate would keep growing faster than
# sqrt(n) for ever; above 4 one extra stream would collapse the transfer. Both are outside what
# Yildirim et al. report for real paths (c between about 1 and 3).
EXPONENT_RANGE = (1.0, 4.0)


def _fit_for_exponent(n: np.ndarray, y: np.ndarray, c: float) -> tuple[float, float, float]:
    """Non-negative a', b' minimising the relative error of p' for a fixed c; returns (a', b', sse)."""
    from scipy.optimize import nnls  # as in models.parallel: not at the top, for the CLI's start

    design = np.stack([n**c, np.ones_like(n)], axis=1) / y[:, None]
    scale = np.linalg.norm(design, axis=0)
    solution, residual = nnls(design / scale, np.ones_like(y))
    a, b = solution / scale
    return float(a), float(b), float(residual**2)


def yildirim_params(streams, throughput_bps) -> tuple[float, float, float]:
    """a' ((s/bit)^2), b' ((s/bit)^2) and c of p'_n = a' n^c + b' by least squares on relative error.

    Parameters
    ----------
    streams : probe levels n (> 0), at least three distinct
    throughput_bps : measured aggregate throughputs, bits/s (> 0)

    Returns
    -------
    (a', b', c) with a', b' >= 0 and c in EXPONENT_RANGE (exact for three probes the form can fit).
    """
    n = np.asarray_chkfinite(streams, dtype=float)
    y = (n / np.asarray_chkfinite(throughput_bps, dtype=float)) ** 2
    low, high = EXPONENT_RANGE
    # The error is not always unimodal in c: a coarse grid picks the basin, then a bounded search.
    grid = np.linspace(low, high, 61)
    sse = [_fit_for_exponent(n, y, c)[2] for c in grid]
    best = int(np.argmin(sse))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    from scipy.optimize import minimize_scalar

    found = minimize_scalar(lambda c: _fit_for_exponent(n, y, c)[2], bounds=(lo, hi), method="bounded",
                            options={"xatol": 1e-6})
    c = float(found.x) if found.fun <= sse[best] else float(grid[best])
    a, b, _ = _fit_for_exponent(n, y, c)
    return a, b, c


def fit_yildirim(points: Sequence[ProbePoint]) -> PolynomialFit:
    """Yildirim et al.'s p'_n = a' n^c + b' from three or more probes (see module docstring).

    When the probes leave a' or b' at zero (no congestion seen, or no gain from more streams),
    the form cannot say more than Lu's two-term fit: falls back to it and says so in ``warnings``.
    """
    n, bw = _validated(points, 3, "yildirim")
    a, b, c = yildirim_params(n, bw)
    if a <= 0 or b <= 0:
        lu = fit_lu(points)
        return replace(lu, model="yildirim", warnings=lu.warnings + (
            "the probes do not fix the exponent of a' n^c + b' (no congestion seen, or more streams "
            "were no faster); used Lu's partial order-2 fit instead",))
    fit = PolynomialFit(
        model="yildirim",
        params={"a_prime": a, "b_prime": b, "exponent": c},
        regime=CONGESTED,
        probe_streams=tuple(float(x) for x in n),
        warnings=tuple(_level_warnings(n)),
        exponents=(c, 0),
        coefficients=(a, b),
    )
    return _with_residuals(fit, n, bw)
