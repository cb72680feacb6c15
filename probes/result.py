"""What one probe measured: the shape every driver (iperf3, ns-2, fake) returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class StreamRtt:
    """Smoothed RTT statistics of one stream, in seconds."""

    mean_s: float
    min_s: float
    max_s: float


@dataclass(frozen=True)
class ProbeResult:
    """One transfer at a fixed number of parallel streams.

    Throughputs are bits/s (decimal); times are seconds; ``started_at`` is Unix time.
    ``throughput_bps`` is measured at the receiver; once a probe plan has judged the result
    (:func:`probes.plan.judge`) it is the rate after the start-up ramp, and
    ``window_throughput_bps`` keeps the whole measured window's rate. ``throughput_stderr_bps``
    is the standard error of the settled rate estimated from the per-interval series
    (None when the driver has no series). ``settled`` is False when the rate was
    still rising or falling at the end of the probe, or the probe was too short for its
    streams' congestion cycles. ``stream_bps`` holds each stream's receiver rate over the
    measured window (empty when the driver does not report streams apart), and
    ``stream_retransmits`` each stream's retransmitted segments over it, in the same order (empty
    when the driver does not report them for every stream).
    ``interval_bps`` is the per-interval rate after the driver's warm-up, measured at
    ``interval_side``: "receiver" (bytes delivered) or "sender" (bytes the application wrote,
    which swings with the send buffer on a full link).
    """

    dest: str
    streams: int
    duration_s: float
    omit_s: float
    throughput_bps: float
    sender_bps: float
    retransmits: int | None = None
    rtt_mean_s: float | None = None
    rtt_min_s: float | None = None
    rtt_max_s: float | None = None
    stream_rtts: tuple[StreamRtt, ...] = ()
    mss_bytes: int | None = None
    congestion_control: str | None = None
    started_at: float = 0.0
    throughput_stderr_bps: float | None = None
    settled: bool = True
    interval_bps: tuple[float, ...] = ()
    interval_side: str = "receiver"
    window_throughput_bps: float | None = None
    stream_bps: tuple[float, ...] = ()
    stream_retransmits: tuple[int, ...] = ()
    raw: str = field(default="", repr=False)


@dataclass(frozen=True)
class PlanResult:
    """All probes of one plan run against one destination."""

    dest: str
    idle_rtt_s: float | None
    probes: tuple[ProbeResult, ...]

    @property
    def congestion_controls(self) -> set[str]:
        """The congestion controls its probes report (the driver's reading; empty when none reported one)."""
        return reported_controls(self.probes)


def reported_controls(probes: Sequence[ProbeResult]) -> set[str]:
    """The congestion controls ``probes`` report (empty when none reported one)."""
    return {p.congestion_control for p in probes if p.congestion_control}
