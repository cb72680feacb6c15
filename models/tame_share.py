"""How much of a standard stream one stream under the tame congestion control takes: the FM -> share law.

A tame stream grows 1/FM segments a round trip (Hacker et al. 2004's fractional stream). Theory gives its
share of a standard stream's goodput as FM^-1/2 when every flow sees the same random loss rate (the AIMD
square-root law; Fu & Indulska eq. 1) and FM^-1 when losses hit every flow at once (synchronised drop-tail
overflows). A real kernel behind a drop-tail queue sits between the two, and a Reno-based tame stream at
FM 1 is not a CUBIC stream's equal once the RTT is long. So the law is measured, per standard control:

    share(FM, RTT) = s1(RTT) x FM^-k

s1 is a tame stream at FM 1 (Reno) against one standard stream, k one exponent for all RTTs; both fitted by
``python -m benchmarks.tame_cc share`` (drop-tail bfifo-like queue of one BDP, 5 cross flows of the standard
control, FM 1-30; reports in benchmarks/results/tame-cc-share*.md). The RTT is the one the advice carries: the
idle RTT a probe measures on that path with its cross traffic running (``python -m benchmarks.tame_cc rtt``,
benchmarks/results/tame-cc-rtt*.md: a standing queue puts it near twice the delay the bed adds), not the bed's
delay. s1 is interpolated in log RTT between the measured RTTs and held at the end values outside them. Above FM ~30 a tame stream's window sits near its
floor of 2 segments on those paths and its share stops falling, so FMs past MAX_CALIBRATED_FM promise less
than they deliver.

Controls without a measurement (e.g. BBR) get the shared-loss theory, FM^-1/2, and say so (``measured``).
The aggregate form (every stream of ours tame) has laws of its own (AGGREGATE_LAWS, from ``python -m
benchmarks.tame_cc aggregate``).
Pure functions, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_CALIBRATED_FM = 30.0
"""Largest FM the measured fractional-form laws were fitted over (a ShareLaw's default max_calibrated_fm)."""
MIN_WINDOW_SEGMENTS = 2
"""The smallest window a tame stream halves to (segments; the ssthresh floor in probes/bpf/tame_cc.bpf.c)."""
TYPICAL_MSS_BYTES = 1448
"""A segment's payload on an Ethernet path with TCP timestamps (bytes): what a window floor is counted in."""


def window_floor_bps(streams: int, rtt_s: float, mss_bytes: int = TYPICAL_MSS_BYTES) -> float:
    """The least ``streams`` tame streams send at ``rtt_s`` (seconds), bits/s: each keeps MIN_WINDOW_SEGMENTS
    segments a round trip, so no FM scales them below it (the RTT grows as they fill the queue, so they send
    somewhat less than this)."""
    return streams * MIN_WINDOW_SEGMENTS * mss_bytes * 8 / rtt_s


RTT_REACH = 1.25
"""How far past its measured RTTs a law's s1 is taken to hold (factor): RTTs beyond first / RTT_REACH or last x
RTT_REACH are outside what was measured."""


@dataclass(frozen=True)
class ShareLaw:
    """share = s1(RTT) x FM^-k. ``base_share``: (RTT seconds, s1) points in increasing RTT; ``max_calibrated_fm``:
    the largest FM it was fitted over."""

    exponent: float
    base_share: tuple[tuple[float, float], ...]
    measured: bool
    source: str
    max_calibrated_fm: float = MAX_CALIBRATED_FM

    def base(self, rtt_s: float | None) -> float:
        """s1 at ``rtt_s`` (fraction): interpolated in log RTT, held at the ends; when the RTT is unknown, the
        measured point at index len // 2 (the middle one of three, the longer of two)."""
        points = self.base_share
        if rtt_s is None or not math.isfinite(rtt_s) or rtt_s <= 0:
            return points[len(points) // 2][1]
        if rtt_s <= points[0][0]:
            return points[0][1]
        for (r0, s0), (r1, s1) in zip(points, points[1:]):
            if rtt_s <= r1:
                t = math.log(rtt_s / r0) / math.log(r1 / r0)
                return s0 + t * (s1 - s0)
        return points[-1][1]

    def covers_rtt(self, rtt_s: float) -> bool:
        """Whether ``rtt_s`` (seconds) lies within the RTTs s1 was measured at, RTT_REACH either side."""
        return self.base_share[0][0] / RTT_REACH <= rtt_s <= self.base_share[-1][0] * RTT_REACH

    def share(self, fractional_multiplier: float, rtt_s: float | None) -> float:
        """One tame stream's goodput over one standard stream's at ``fractional_multiplier`` (>= 1)."""
        if not fractional_multiplier >= 1:
            raise ValueError(f"fractional_multiplier must be >= 1, got {fractional_multiplier!r}")
        return self.base(rtt_s) * fractional_multiplier ** -self.exponent

    def multiplier_for(self, share: float, rtt_s: float | None) -> float:
        """FM that makes one tame stream take ``share`` (fraction > 0) of a standard stream; 1 when even FM 1
        takes less than ``share`` (s1 < share: the tame stream falls short, it never takes more)."""
        if not share > 0 or not math.isfinite(share):
            raise ValueError(f"share must be a finite fraction > 0, got {share!r}")
        return max(1.0, (self.base(rtt_s) / share) ** (1.0 / self.exponent))


SHARED_LOSS_THEORY = ShareLaw(exponent=0.5, base_share=((1.0, 1.0),), measured=False,
                              source="shared-loss AIMD theory, FM^-1/2 (Fu & Indulska eq. 1); not measured")

LAWS: dict[str, ShareLaw] = {
    # s1 at 10, 40 and 100 ms of added delay, keyed by the RTT the service measured there (tame-cc-rtt.md).
    # Fitted on three repeats per cell (45 runs); s1 above 1 at 10 ms: Reno at FM 1 out-takes cubic there.
    "cubic": ShareLaw(exponent=0.627, base_share=((0.0182, 1.085), (0.0727, 0.828), (0.1802, 0.509)), measured=True,
                      source="benchmarks/results/tame-cc-share-repeats.md"),
    # s1 at 40 and 100 ms of added delay, keyed by the RTT the service measured there (tame-cc-rtt-reno.md).
    "reno": ShareLaw(exponent=0.497, base_share=((0.0646, 0.857), (0.1653, 0.808)), measured=True,
                     source="benchmarks/results/tame-cc-share-reno.md"),
}


# The aggregate form: N tame streams of ours (no standard stream of ours) beside standard cross flows, one tame
# stream's goodput against one of n* standard streams opened in its place. Beside cubic it takes more at an FM than
# the fractional form's tame stream does (beside a standard stream of ours too), so it has a law of its own.
AGGREGATE_LAWS: dict[str, ShareLaw] = {
    # Measured on 50 Mbit/s with 10, 40 and 100 ms added delay (5 cubic cross flows), n* = 2, N = 4-32, keyed by the
    # RTT the service measured on each; runs whose 2-segment window floors bind left out.
    "cubic": ShareLaw(exponent=0.563, base_share=((0.0183, 0.898), (0.0782, 0.822), (0.1764, 0.526)), measured=True,
                      source="benchmarks/results/tame-cc-aggregate-rtts.md", max_calibrated_fm=88.615),
}


def law_for(standard_control: str | None) -> ShareLaw:
    """The law for a tame stream beside standard streams of ``standard_control``, ours among them (the fractional
    form); theory when unmeasured."""
    return LAWS.get(standard_control or "", SHARED_LOSS_THEORY)


def aggregate_law_for(standard_control: str | None) -> ShareLaw:
    """The law for N tame streams, all of ours, beside ``standard_control`` cross flows (the aggregate form); the
    fractional form's where the aggregate form was not measured."""
    return AGGREGATE_LAWS.get(standard_control or "", law_for(standard_control))
