"""What one probe's own measurements say about its streams: limited by losses, or by something else?

A stream that is limited by congestion losses runs at about the Reno rate for the loss rate it
sees: Padhye et al.'s, which counts retransmission timeouts (Lu 2004 eq. 2; Mathis's eq. 1
where losses are rare); one limited by its window, the receiver or the application runs well
below it, or sees no losses at all. Probes in the second state add throughput without taking
it from anyone: the path is not congested at that parallelism.
"""

from __future__ import annotations

from models.parallel import ProbePoint
from models.single_flow import BITS_PER_BYTE, congestion_cycle_s, padhye_throughput_bps

# A stream at this fraction of its Reno rate or above is taken as loss-limited; the benchmark's
# probe table (python -m benchmarks.accuracy) shows the fractions its probes reach on ns-2.
LOSS_LIMITED_FRACTION = 0.5
# Padhye's T0: the smallest retransmission timeout RFC 6298 allows, seconds. A longer real RTO
# only lowers the Reno rate, so this errs towards calling streams loss-limited.
TIMEOUT_S = 1.0
# "No losses" only says the streams are not loss-limited when the probe's streams together
# spanned this many of the congestion cycles a loss-limited stream at the same rate would go
# through: each such cycle ends in a loss, and n streams go through n cycles in one cycle's time.
MIN_LOSSLESS_CYCLES = 3.0
# A probe's streams' loss counts tell random drops from synchronised ones only when each stream
# expects this many losses on average (the usual floor for a chi-square test of counts).
MIN_EXPECTED_LOSSES_PER_STREAM = 5.0
# Loss rates are capped here for the Reno rate: timeouts can retransmit more segments than
# got through, which makes the ratio of the two meaningless as a probability.
_MAX_LOSS_RATE = 0.5


def loss_rate(point: ProbePoint) -> float | None:
    """Retransmitted segments per segment delivered during the probe (fraction), or None if unknown."""
    if point.retransmits is None or not point.duration_s or not point.mss_bytes:
        return None
    segments = point.throughput_bps * point.duration_s / (BITS_PER_BYTE * point.mss_bytes)
    return min(point.retransmits / segments, _MAX_LOSS_RATE) if segments > 0 else None


def reno_fraction(point: ProbePoint) -> float | None:
    """Measured per-stream rate / Padhye's Reno rate at the probe's loss rate and RTT; 0 with no losses, None if unknown."""
    p = loss_rate(point)
    if p is None or not point.rtt_s:
        return None
    if p == 0:
        return 0.0
    per_stream = point.throughput_bps / point.streams
    return per_stream / float(padhye_throughput_bps(point.mss_bytes, point.rtt_s, p, max(TIMEOUT_S, point.rtt_s)))


def loss_limited(point: ProbePoint) -> bool | None:
    """True if the probe's streams ran at their Reno rate, False if clearly below it, None if the probe cannot tell.

    A probe without losses tells only if its streams together went through
    :data:`MIN_LOSSLESS_CYCLES` congestion cycles (:func:`models.single_flow.congestion_cycle_s`
    per stream, times the streams): loss-limited streams would have lost a segment in each; fewer
    may just have been lucky.
    """
    fraction = reno_fraction(point)
    if fraction is None:
        return None
    if fraction > 0:
        return fraction >= LOSS_LIMITED_FRACTION
    cycle_s = congestion_cycle_s(point.throughput_bps / point.streams, point.rtt_s, point.mss_bytes)
    return False if point.streams * point.duration_s >= MIN_LOSSLESS_CYCLES * cycle_s else None


def loss_dispersion(point: ProbePoint) -> float | None:
    """Index of dispersion of the streams' loss counts around one loss rate shared by all (chi-square / dof), or None.

    If every packet is dropped with the same probability, whatever stream it belongs to (random
    drops: a RED queue), each stream's count is a Poisson count around the probe's loss rate x its
    own segments and the index is about 1 (more when the shared rate wanders). A small drop-tail
    buffer shared by few flows drops in bursts that hit every flow about once per congestion
    event, whatever its rate (global synchronisation): the counts come out more even than Poisson
    counts, and the index well below 1. None without per-stream counts and rates for two or more
    streams that moved data, or with fewer than :data:`MIN_EXPECTED_LOSSES_PER_STREAM` losses a stream.
    """
    pairs = [(k, r) for k, r in zip(point.stream_retransmits, point.stream_bps) if r > 0]
    if len(pairs) < 2 or len(point.stream_retransmits) != len(point.stream_bps):
        return None
    losses = sum(k for k, _ in pairs)
    if losses < MIN_EXPECTED_LOSSES_PER_STREAM * len(pairs):
        return None
    total_bps = sum(r for _, r in pairs)
    chi_square = sum((k - losses * r / total_bps) ** 2 / (losses * r / total_bps) for k, r in pairs)
    return float(chi_square / (len(pairs) - 1))
