"""Settle rule: has a probe's per-interval throughput stopped rising or falling?"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class SettleVerdict:
    """What the interval series says about a probe's rate.

    ``mean_bps`` and ``stderr_bps`` describe the last two thirds of the series, the part taken
    as the settled rate. ``drift`` is (last-third mean − middle-third mean) / middle-third mean:
    positive while the rate is still rising (slow start, recovery), negative while it falls.
    """

    settled: bool
    mean_bps: float
    stderr_bps: float | None
    drift: float


def assess_series(
    interval_bps: Sequence[float],
    *,
    tolerance: float = 0.05,
    z: float = 2.0,
    min_intervals: int = 6,
) -> SettleVerdict:
    """Judge a per-interval throughput series (bits/s, omitted warm-up already removed).

    The series is cut into thirds counted from its end (the first takes any remainder); the rate is settled when the last third's mean is within
    ``tolerance`` (relative) of the middle third's, or when the difference is within ``z``
    standard errors of it (a flat but noisy path is settled; more time would not settle it
    further). A series shorter than ``min_intervals`` is never settled: its thirds are too short
    to tell a trend from noise. The first third is left out of both: it holds the start-up the
    probe is trying to get past. ``stderr_bps`` treats intervals as independent; TCP rates are
    autocorrelated over a few RTTs, so with 1 s intervals on paths of RTT well under 1 s this is
    close, and on longer RTTs it understates the uncertainty. The trend test itself uses batch
    means, which stay honest when shares swing slowly.
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
    n = series.size
    if n < 3:
        mean_bps = float(series.mean()) if n else 0.0
        stderr_bps = float(series.std(ddof=1) / math.sqrt(n)) if n >= 2 else None
        return SettleVerdict(settled=False, mean_bps=mean_bps, stderr_bps=stderr_bps, drift=0.0)

    third = n // 3
    middle = series[n - 2 * third : n - third]
    last = series[n - third :]
    window = series[n - 2 * third :]
    mean_bps = float(window.mean())
    stderr_bps = float(window.std(ddof=1) / math.sqrt(window.size))

    m_mid, m_last = float(middle.mean()), float(last.mean())
    drift = (m_last - m_mid) / m_mid if m_mid > 0 else (math.inf if m_last > 0 else 0.0)
    if n < min_intervals:
        return SettleVerdict(settled=False, mean_bps=mean_bps, stderr_bps=stderr_bps, drift=drift)

    diff = abs(m_last - m_mid)
    se_diff = math.sqrt(_sem_sq(middle) + _sem_sq(last))
    settled = diff <= tolerance * m_mid or diff <= z * se_diff
    return SettleVerdict(settled=settled, mean_bps=mean_bps, stderr_bps=stderr_bps, drift=drift)


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
