"""Fu & Indulska's aggregate model of n parallel TCP connections and the fractional multiplier."""

from __future__ import annotations

import numpy as np

from models.single_flow import BITS_PER_BYTE, _loss, _positive


def fu_indulska_throughput_bps(streams, loss_rate, mss_bytes, rtt_s, increase_factor=1.0, reduction_factor=2.0):
    """Aggregate throughput of n parallel connections; Fu & Indulska eq. (1).

    BW_n = sqrt(m (2 c n - 1) / (2 p)) * MSS / RTT, where the aggregate window opens
    m packets per RTT and a loss cuts the window of one connection by 1/c.

    Parameters
    ----------
    streams : n, number of connections (> 0; may be fractional)
    loss_rate : p, fraction in (0, 1)
    mss_bytes : bytes; rtt_s : seconds
    increase_factor : m, packets per RTT the aggregate window opens
    reduction_factor : c, a loss cuts one connection's window by 1/c (2 for standard TCP)

    Returns
    -------
    float or ndarray, bits/s
    """
    n = _positive("streams", streams)
    m = _positive("increase_factor", increase_factor)
    c = _positive("reduction_factor", reduction_factor)
    if np.any(2 * c * n - 1 <= 0):
        raise ValueError("2 * reduction_factor * streams must exceed 1")
    p = _loss(loss_rate)
    mss = _positive("mss_bytes", mss_bytes)
    rtt = _positive("rtt_s", rtt_s)
    result = np.sqrt(m * (2 * c * n - 1) / (2 * p)) * mss * BITS_PER_BYTE / rtt
    return result if result.ndim else float(result)


def fu_indulska_peak_window_packets(streams, loss_rate, increase_factor=1.0, reduction_factor=2.0):
    """Aggregate window W_n (packets) just before a loss, implied by Fu & Indulska eq. (1).

    Eq. (1) states BW_n = (1/p) MSS / ((W_n / (c m n)) RTT) = sqrt(m(2cn-1)/(2p)) MSS/RTT,
    hence W_n = c m n sqrt(2 / (m (2 c n - 1) p)).
    """
    n = _positive("streams", streams)
    m = _positive("increase_factor", increase_factor)
    c = _positive("reduction_factor", reduction_factor)
    p = _loss(loss_rate)
    result = c * m * n * np.sqrt(2.0 / (m * (2 * c * n - 1) * p))
    return result if result.ndim else float(result)


def fu_indulska_fast_recovery_throughput_bps(
    streams, loss_rate, mss_bytes, rtt_s, emulating_connections=None, increase_factor=1.0, reduction_factor=2.0
):
    """Aggregate throughput including fast recovery; Fu & Indulska eq. (2).

    BW_n = (1/p) MSS / ((1 + (W_n - n_e - 1) / (c m n)) RTT), with W_n from eq. (1)
    (see fu_indulska_peak_window_packets) and n_e the number of real connections used
    (n_e = n for plain parallel TCP).

    Parameters
    ----------
    streams : n; loss_rate : p in (0, 1); mss_bytes : bytes; rtt_s : seconds;
    emulating_connections : n_e (defaults to n); increase_factor : m; reduction_factor : c.

    Returns
    -------
    float or ndarray, bits/s
    """
    n = _positive("streams", streams)
    n_e = n if emulating_connections is None else _positive("emulating_connections", emulating_connections)
    m = _positive("increase_factor", increase_factor)
    c = _positive("reduction_factor", reduction_factor)
    p = _loss(loss_rate)
    mss = _positive("mss_bytes", mss_bytes)
    rtt = _positive("rtt_s", rtt_s)
    window = fu_indulska_peak_window_packets(n, p, m, c)
    rounds = 1.0 + (window - n_e - 1.0) / (c * m * n)
    if np.any(rounds <= 0):
        raise ValueError("loss_rate too high for eq. (2): the window never exceeds the emulating connections")
    result = (1.0 / p) * mss * BITS_PER_BYTE / (rounds * rtt)
    return result if np.ndim(result) else float(result)


def fractional_multiplier(streams, increase_factor):
    """Fractional multiplier FM = n / m; Fu & Indulska section 3.1 (Hacker's fractional method)."""
    n = _positive("streams", streams)
    m = _positive("increase_factor", increase_factor)
    result = n / m
    return result if result.ndim else float(result)


def fractional_stream_share(multiplier):
    """Throughput of a stream opening 1/FM packets per RTT, relative to a standard stream.

    By Fu & Indulska eq. (1) at a shared loss rate, throughput scales with sqrt(m), so a
    stream with m = 1/FM moves sqrt(1/FM) of a standard stream's rate (a fraction, > 0).
    """
    fm = _positive("multiplier", multiplier)
    result = np.sqrt(1.0 / fm)
    return result if result.ndim else float(result)


def multiplier_for_share(share):
    """FM of one fractional stream that moves `share` (fraction > 0) of a standard stream: 1/share^2."""
    r = _positive("share", share)
    result = 1.0 / r**2
    return result if result.ndim else float(result)
