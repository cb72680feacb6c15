"""Single-flow TCP throughput formulas and Hacker's bound for n flows (quoted in Lu et al. 2004)."""

from __future__ import annotations

import numpy as np

BITS_PER_BYTE = 8.0


def _positive(name: str, value) -> np.ndarray:
    arr = np.asarray_chkfinite(value, dtype=float)
    if np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return arr


def _loss(value) -> np.ndarray:
    arr = np.asarray_chkfinite(value, dtype=float)
    if np.any((arr <= 0) | (arr >= 1)):
        raise ValueError(f"loss_rate must be in (0, 1), got {value!r}")
    return arr


def mathis_throughput_bps(mss_bytes, rtt_s, loss_rate, acked_per_ack: float = 1.0):
    """Mathis et al. steady-state TCP Reno throughput; Lu 2004 eq. (1).

    BW = MSS / (RTT * sqrt(2 b p / 3)).

    Parameters
    ----------
    mss_bytes : float or array, bytes
    rtt_s : float or array, seconds
    loss_rate : float or array, fraction in (0, 1)
    acked_per_ack : float, packets acknowledged per ACK (b; 1 without delayed ACKs)

    Returns
    -------
    float or ndarray, bits/s
    """
    mss = _positive("mss_bytes", mss_bytes)
    rtt = _positive("rtt_s", rtt_s)
    p = _loss(loss_rate)
    b = float(_positive("acked_per_ack", acked_per_ack))
    result = mss * BITS_PER_BYTE / (rtt * np.sqrt(2.0 * b * p / 3.0))
    return result if result.ndim else float(result)


def padhye_throughput_bps(mss_bytes, rtt_s, loss_rate, timeout_s, acked_per_ack: float = 1.0):
    """Padhye et al. TCP Reno throughput with retransmission timeouts; Lu 2004 eq. (2).

    BW = MSS / (RTT sqrt(2bp/3) + T0 min(1, 3 sqrt(3bp/8)) p (1 + 32 p^2)).

    Parameters
    ----------
    mss_bytes : bytes; rtt_s : seconds; loss_rate : fraction in (0, 1);
    timeout_s : retransmission timeout T0, seconds; acked_per_ack : b.

    Returns
    -------
    float or ndarray, bits/s
    """
    mss = _positive("mss_bytes", mss_bytes)
    rtt = _positive("rtt_s", rtt_s)
    p = _loss(loss_rate)
    t0 = _positive("timeout_s", timeout_s)
    b = float(_positive("acked_per_ack", acked_per_ack))
    denominator = rtt * np.sqrt(2.0 * b * p / 3.0) + t0 * np.minimum(1.0, 3.0 * np.sqrt(3.0 * b * p / 8.0)) * p * (
        1.0 + 32.0 * p**2
    )
    result = mss * BITS_PER_BYTE / denominator
    return result if result.ndim else float(result)


def hacker_upper_bound_bps(mss_bytes, rtt_s, loss_rates) -> float:
    """Hacker et al. upper bound on n uncongested parallel flows; Lu 2004 eq. (3).

    BW_n <= MSS / RTT * sum_i 1 / sqrt(p_i), one loss rate per flow.

    Parameters
    ----------
    mss_bytes : bytes; rtt_s : seconds; loss_rates : sequence of fractions in (0, 1), one per flow.

    Returns
    -------
    float, bits/s
    """
    mss = float(_positive("mss_bytes", mss_bytes))
    rtt = float(_positive("rtt_s", rtt_s))
    p = _loss(np.atleast_1d(loss_rates))
    return float(mss * BITS_PER_BYTE / rtt * np.sum(1.0 / np.sqrt(p)))


def congestion_cycle_s(rate_per_stream_bps: float, rtt_s: float, mss_bytes: float) -> float:
    """Seconds of one Reno congestion-avoidance cycle: W/2 round trips, W = rate x RTT / MSS segments.

    The sawtooth behind Mathis et al.'s formula (Lu 2004 eq. 1): the window grows by one segment
    per round trip from W/2 to W, then halves. A loss-limited stream's rate swings over this
    period and takes a few of them to reach its share, so a measurement shorter than a few
    cycles sees a phase of the sawtooth rather than the rate.

    Parameters
    ----------
    rate_per_stream_bps : one stream's throughput, bits/s (> 0)
    rtt_s : round-trip time, seconds (> 0)
    mss_bytes : segment size, bytes (> 0)

    Returns
    -------
    float, seconds
    """
    rate = float(_positive("rate_per_stream_bps", rate_per_stream_bps))
    rtt = float(_positive("rtt_s", rtt_s))
    mss = float(_positive("mss_bytes", mss_bytes))
    window_segments = rate * rtt / (BITS_PER_BYTE * mss)
    return window_segments / 2.0 * rtt
