"""Per-flow fair share of a saturated bottleneck: BW_n = C n / (n + M), impact(n) = n / (n + M).

Lu et al. 2004 assume every flow through the bottleneck, ours and the cross traffic's, sees the
same RTT and loss rate and so the same throughput (section IV.A after eq. 4, section V.A). Taken
literally on a saturated link of usable capacity C with m competing flows, our n streams get
C n / (n + m) and each competing flow C / (n + m). If the usable capacity itself grows with the
number of flows as C N / (N + k) (a small drop-tail buffer is used better by more flows), both
formulas keep their shape with M = m + k, and the impact on a competing flow is
1 - (C / (n + M)) / (C / M) = n / (n + M). Two parameters, C (bits/s) and M (effective
competing flows), fitted from two or more probes on 1/BW_n = 1/C + (M/C) (1/n), which is linear.

With three or more probes one curve of two parameters need not pass through them all; a fit may
then carry the probes themselves (``level_streams``, ``level_bps``) and follow the fair share
through each adjacent pair of them (:func:`piecewise_fair_share_bps`), so that it is exact at
every probe, as Lu's two-probe solution is at its two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from models.parallel import (
    CONGESTED, SATURATED, UNCONGESTED, ParallelFit, ProbePoint, _level_warnings, _validated, _with_residuals,
    validated_streams,
)

# The fair share's own form misses the ground truth by about this fraction of throughput (ns-2, Lu's
# scenarios, fitted to the ground truth's own runs at its probe levels: median 0.035,
# benchmarks/results/full/): the least a probe's relative error can be taken to be, however many
# losses it counted.
FORM_ERROR = 0.035

# A saturated fit is given at least this many effective competing flows: with fewer the fit would
# claim one stream already takes nearly the whole link, which the probes cannot show.
MIN_COMPETING_FLOWS = 0.05


def piecewise_fair_share_bps(streams, level_streams, level_bps) -> np.ndarray:
    """Aggregate throughput, bits/s, through measured (streams, bits/s) levels by the fair share of each adjacent pair.

    Between two levels 1/BW is linear in 1/n (the fair share BW = C n / (n + M) through both);
    beyond the highest level the highest pair's curve goes on, held flat at the highest level when
    that pair's capacity is not finite (throughput grew faster than the fair share allows); below
    the lowest level, n x its per-stream rate. ``level_streams`` strictly increasing, two or more.
    """
    n = np.asarray(streams, dtype=float)
    xs = np.asarray(level_streams, dtype=float)
    ys = np.asarray(level_bps, dtype=float)
    inv_n = 1.0 / np.maximum(n, np.finfo(float).tiny)
    inv_x, inv_y = 1.0 / xs, 1.0 / ys
    inner = np.interp(inv_n, inv_x[::-1], inv_y[::-1])
    slope = (inv_y[-1] - inv_y[-2]) / (inv_x[-1] - inv_x[-2])
    intercept = inv_y[-1] - slope * inv_x[-1]
    beyond = inv_y[-1] + slope * (inv_n - inv_x[-1]) if intercept > 0 else np.full_like(inv_n, inv_y[-1])
    inverse = np.where(n > xs[-1], beyond, inner)
    return np.where(n < xs[0], n * ys[0] / xs[0], 1.0 / inverse)


def probe_levels(points: Sequence[ProbePoint]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The probes' distinct stream counts, increasing, and the geometric-mean throughput (bits/s) at each."""
    levels: dict[float, list[float]] = {}
    for point in points:
        levels.setdefault(float(point.streams), []).append(float(point.throughput_bps))
    ordered = sorted(levels)
    return tuple(ordered), tuple(float(np.exp(np.mean(np.log(levels[x])))) for x in ordered)


@dataclass(frozen=True)
class FairShareFit(ParallelFit):
    """BW_n = capacity_bps n / (n + competing_flows); held flat beyond ``flat_beyond_streams`` if set.

    With ``level_streams`` and ``level_bps`` set, the throughput instead follows the fair share
    through each adjacent pair of those measured levels (:func:`piecewise_fair_share_bps`); the
    impact stays n / (n + M) of the one fitted curve.
    """

    record_form = "fair_share"

    link_capacity_bps: float = float("inf")
    competing_flows: float = 0.0
    per_stream_bps: float = 0.0
    flat_beyond_streams: float | None = field(default=None)
    level_streams: tuple[float, ...] = ()
    level_bps: tuple[float, ...] = ()

    def throughput_bps(self, streams):
        """Aggregate throughput of n streams, bits/s (n / (n + M) of C; n x per-stream rate when unsaturated)."""
        n = validated_streams(streams, self.flat_beyond_streams)
        if len(self.level_streams) >= 2:
            result = piecewise_fair_share_bps(n, self.level_streams, self.level_bps)
        elif np.isinf(self.link_capacity_bps):
            result = n * self.per_stream_bps
        else:
            result = self.link_capacity_bps * n / (n + self.competing_flows)
        return result if np.ndim(result) else float(result)

    def impact(self, streams):
        """Relative throughput loss of each competing flow, n / (n + M) (0 when unsaturated)."""
        n = validated_streams(streams)
        if np.isinf(self.link_capacity_bps):
            result = np.zeros_like(n)
        else:
            result = n / (n + self.competing_flows)
        return result if np.ndim(result) else float(result)

    @property
    def capacity_bps(self) -> float | None:
        if np.isinf(self.link_capacity_bps):
            return float(self.throughput_bps(self.flat_beyond_streams)) if self.flat_beyond_streams else None
        return self.link_capacity_bps


def loss_count_weights(points: Sequence[ProbePoint]) -> np.ndarray | None:
    """Inverse-variance weight of each probe's rate from its loss count, or None unless every probe lost segments.

    A loss-limited rate goes as p^-1/2 (Mathis, Lu eq. 1) and a loss rate read from k loss events is known
    to 1/sqrt(k) (a Poisson count), so the rate is known to a relative 1/(2 sqrt(k)); with the form's own
    error :data:`FORM_ERROR` added, the variance is 1/(4k) + FORM_ERROR^2 and the weight its inverse.
    """
    counts = [p.retransmits for p in points]
    if any(not k or k < 0 for k in counts):
        return None
    return np.array([1.0 / (1.0 / (4.0 * k) + FORM_ERROR ** 2) for k in counts])


def fair_share_params(streams, throughput_bps, weights=None) -> tuple[float, float]:
    """Intercept 1/C (s/bit) and slope M/C (s/bit) of 1/BW_n = 1/C + (M/C)/n by least squares on relative error.

    Parameters
    ----------
    streams : probe levels n (> 0)
    throughput_bps : measured aggregate throughputs, bits/s (> 0)
    weights : optional inverse variance of each probe's relative error (> 0); equal when None

    Returns
    -------
    (alpha, beta): alpha = 1/C, beta = M/C; either may be <= 0 for degenerate probes.
    """
    n = np.asarray_chkfinite(streams, dtype=float)
    bw = np.asarray_chkfinite(throughput_bps, dtype=float)
    y = 1.0 / bw
    # Each row divided by its own y, so every probe counts by its relative error.
    root_weights = np.ones_like(y) if weights is None else np.sqrt(np.asarray_chkfinite(weights, dtype=float))
    design = np.stack([np.ones_like(n), 1.0 / n], axis=1) / y[:, None] * root_weights[:, None]
    scale = np.linalg.norm(design, axis=0)
    solution, *_ = np.linalg.lstsq(design / scale, root_weights, rcond=None)
    alpha, beta = solution / scale
    return float(alpha), float(beta)


def fit_fair_share(points: Sequence[ProbePoint], weighted: bool = False) -> FairShareFit:
    """Fair-share model of a saturated bottleneck from two or more probes (see module docstring).

    Regimes: "congested" (C and M > 0), "uncongested" (throughput grew at least in proportion to n:
    no bottleneck seen; n x the per-stream rate up to the highest probe, flat beyond, impact 0),
    "saturated" (more streams were no faster: M is floored at MIN_COMPETING_FLOWS).

    ``weighted``: with three or more probes that all lost segments, each probe counts by its
    :func:`loss_count_weights` (a probe with few losses, such as one stream on a lightly loaded link,
    counts less), when the equal-weight fit is congested and the weighted one is too; otherwise
    every probe counts the same.
    """
    n, bw = _validated(points, 2, "fair_share")
    alpha, beta = fair_share_params(n, bw)
    warnings = _level_warnings(n)
    weights = loss_count_weights(points) if weighted and len(points) >= 3 else None
    if weights is not None and alpha > 0 and beta / alpha >= MIN_COMPETING_FLOWS:
        w_alpha, w_beta = fair_share_params(n, bw, weights)
        if w_alpha > 0 and w_beta / w_alpha >= MIN_COMPETING_FLOWS:
            alpha, beta = w_alpha, w_beta
            warnings.append("probes weighted by their loss counts (" + ", ".join(
                f"{p.retransmits} at {p.streams:g} stream{'' if p.streams == 1 else 's'}" for p in points) + ")")
    high = float(n.max())
    common = dict(model="fair_share", probe_streams=tuple(float(x) for x in n))
    if alpha <= 0:
        per_stream = float(np.exp(np.mean(np.log(bw / n))))
        warnings.append(
            f"no bottleneck seen up to {high:g} streams (throughput grew in proportion to the streams): "
            f"predictions are held flat beyond {high:g} streams and impact is taken as 0"
        )
        fit = FairShareFit(params={"per_stream_bps": per_stream}, regime=UNCONGESTED, warnings=tuple(warnings),
                           per_stream_bps=per_stream, flat_beyond_streams=high, **common)
    else:
        capacity = 1.0 / alpha
        competing = beta * capacity
        regime = CONGESTED
        if competing < MIN_COMPETING_FLOWS:
            regime = SATURATED
            competing = MIN_COMPETING_FLOWS
            capacity = float(np.max(bw))
            warnings.append(
                f"more streams did not raise throughput: the path is already full at {n.min():g} streams, "
                "so extra streams only take from other traffic"
            )
        fit = FairShareFit(params={"capacity_bps": capacity, "competing_flows": competing}, regime=regime,
                           warnings=tuple(warnings), link_capacity_bps=capacity, competing_flows=competing, **common)
    return _with_residuals(fit, n, bw)
