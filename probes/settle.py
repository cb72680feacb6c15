"""Settle rule: has a probe's per-interval throughput stopped rising or falling, and what is its rate?"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# The ramp (slow start, then recovery from its overshoot) ends at the first interval that
# reaches this fraction of the mean of everything after it.
RAMP_FRACTION = 0.9


@dataclass(frozen=True)
class SettleVerdict:
    """What the interval series says about a probe's rate.

    ``start`` is the index of the first interval after the start-up ramp; ``mean_bps`` and
    ``stderr_bps`` describe the series from there on, the part taken as the settled rate.
    ``drift`` is (last-third mean − middle-third mean) / middle-third mean of that part:
    positive while the rate is still rising (slow start, recovery), negative while it falls.
    """

    settled: bool
    mean_bps: float
    stderr_bps: float | None
    drift: float
    start: int = 0


def ramp_end(interval_bps: Sequence[float], fraction: float = RAMP_FRACTION) -> int:
    """Index of the first interval that reaches ``fraction`` of the mean from it on (at most half the series).

    A probe starts with slow start and a recovery that can take several seconds on long paths;
    the intervals before this index are that ramp and are left out of the rate. No more than
    half the series is ever dropped: a ramp that long means the probe is too short.
    """
    series = np.asarray(interval_bps, dtype=float)
    half = series.size // 2
    for index in range(half):
        if series[index] >= fraction * series[index:].mean():
            return index
    return half


def assess_series(
    interval_bps: Sequence[float],
    *,
    tolerance: float = 0.05,
    z: float = 2.0,
    min_intervals: int = 6,
) -> SettleVerdict:
    """Judge a per-interval throughput series (bits/s, omitted warm-up already removed).

    The start-up ramp (:func:`ramp_end`) is left out first; a ramp that fills the first half
    (no interval there reaches 0.9 of what follows) is still under way: not settled. What follows is cut into thirds
    counted from its end (the first takes any remainder); the rate is settled when the last third's mean is within
    ``tolerance`` (relative) of the middle third's, or when the difference is within ``z``
    standard errors of it (a flat but noisy path is settled; more time would not settle it
    further). A part shorter than ``min_intervals`` is never settled: its thirds are too short
    to tell a trend from noise. ``mean_bps`` and ``stderr_bps`` are those of the whole part after
    the ramp, by batch means (TCP rates are autocorrelated over many seconds on a shared
    bottleneck); the trend test uses batch means too, which stay honest when shares swing slowly.
    """
    if tolerance < 0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if z < 0 or not math.isfinite(z):
        raise ValueError(f"z must be a finite number >= 0, got {z!r}")
    if min_intervals < 3:
        raise ValueError(f"min_intervals must be at least 3, got {min_intervals!r}")
    series = np.asarray_chkfinite(np.asarray(interval_bps, dtype=float))
    if series.ndim != 1:
        raise ValueError("interval_bps must be one-dimensional")
    if np.any(series < 0):
        raise ValueError("interval_bps must not contain negative rates")
    if series.size < 3:
        mean_bps = float(series.mean()) if series.size else 0.0
        stderr_bps = float(series.std(ddof=1) / math.sqrt(series.size)) if series.size >= 2 else None
        return SettleVerdict(settled=False, mean_bps=mean_bps, stderr_bps=stderr_bps, drift=0.0)

    start = ramp_end(series)
    part = series[start:]
    n = part.size
    mean_bps = float(part.mean())
    stderr_bps = math.sqrt(_sem_sq(part))
    if n < 3:
        return SettleVerdict(settled=False, mean_bps=mean_bps, stderr_bps=stderr_bps, drift=0.0, start=start)
    third = n // 3
    middle = part[n - 2 * third : n - third]
    last = part[n - third :]
    m_mid, m_last = float(middle.mean()), float(last.mean())
    drift = (m_last - m_mid) / m_mid if m_mid > 0 else (math.inf if m_last > 0 else 0.0)
    if n < min_intervals:
        return SettleVerdict(settled=False, mean_bps=mean_bps, stderr_bps=stderr_bps, drift=drift, start=start)

    diff = abs(m_last - m_mid)
    se_diff = math.sqrt(_sem_sq(middle) + _sem_sq(last))
    ramping = start >= series.size // 2
    settled = not ramping and (diff <= tolerance * m_mid or diff <= z * se_diff)
    return SettleVerdict(settled=settled, mean_bps=mean_bps, stderr_bps=stderr_bps, drift=drift, start=start)


# Batches for the standard error of a third's mean: more than this many intervals are averaged in
# blocks first, so slow oscillations (TCP shares on a shared bottleneck swing over many seconds)
# widen the error instead of passing for a trend. At or below it, each interval is its own batch.
_BATCHES = 5


def _sem_sq(x: np.ndarray) -> float:
    """Squared standard error of x's mean by batch means."""
    if x.size < 2:
        return 0.0
    batches = min(_BATCHES, x.size)
    means = np.array([chunk.mean() for chunk in np.array_split(x, batches)])
    return float(means.var(ddof=1) / batches)
