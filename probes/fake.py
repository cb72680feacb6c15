"""A deterministic in-memory ProbeDriver, for unit tests of the plan and the advisor only.

Integration tests use the real drivers; this one never touches the network. It reads no clock;
it only sleeps ``delay_s`` per probe when a test needs to catch a probe in flight (e.g. to kill it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from probes.errors import ProbeError
from probes.result import ProbeResult, StreamRtt


@dataclass
class FakeDriver:
    """Returns ``throughput_bps(n)`` for n streams, as a 1 s interval series.

    The series rises linearly from ``ramp_start_fraction`` of the final rate over the first
    ``ramp_s`` seconds (after warm-up), a stand-in for slow start and recovery, then stays flat;
    ``noise`` adds seeded relative Gaussian noise. ``rtt_s`` is reported as the idle RTT and
    every stream's RTT. The streams share the rate equally, except that on attempt k
    ``idle_streams_by_attempt[k]`` of them (at most all but one) carry nothing. A probe reports the
    ``congestion_control`` it was asked for, else the driver's ``congestion_control``; names in
    ``unavailable_controls`` fail as the kernel refuses them. ``fail_with`` makes
    every call raise. ``calls`` records ``(method, dest, streams, duration_s, omit_s)`` in order.
    """

    throughput_bps: Callable[[int], float]
    rtt_s: float = 0.05
    ramp_s: float = 0.0
    ramp_start_fraction: float = 0.5
    noise: float = 0.0
    seed: int = 0
    retransmits_per_stream: int = 0
    mss_bytes: int = 1448
    congestion_control: str = "cubic"
    unavailable_controls: tuple[str, ...] = ()
    fail_with: ProbeError | None = None
    delay_s: float = 0.0
    idle_streams_by_attempt: Mapping[int, int] = field(default_factory=dict)
    calls: list[tuple] = field(default_factory=list)

    def run(self, dest: str, streams: int, duration_s: float, omit_s: float, deadline_s: float,
            attempt: int = 0, congestion_control: str | None = None) -> ProbeResult:
        self.calls.append(("run", dest, streams, duration_s, omit_s))
        if self.fail_with is not None:
            raise self.fail_with
        if congestion_control in self.unavailable_controls:
            raise ProbeError(f"unable to set TCP_CONGESTION: {congestion_control!r} is not available here")
        if self.delay_s:
            time.sleep(self.delay_s)
        final = float(self.throughput_bps(streams))
        seconds = max(1, math.ceil(duration_s))
        t = omit_s + np.arange(seconds) + 0.5  # interval midpoints since the start, warm-up included
        if self.ramp_s > 0:
            fraction = self.ramp_start_fraction + (1 - self.ramp_start_fraction) * np.clip(t / self.ramp_s, 0, 1)
        else:
            fraction = np.ones(seconds)
        rng = np.random.default_rng([self.seed, streams, seconds])
        series = final * fraction * (1 + self.noise * rng.standard_normal(seconds))
        series = np.clip(series, 0.0, None)
        mean = float(series.mean())
        idle = min(self.idle_streams_by_attempt.get(attempt, 0), streams - 1)
        running = streams - idle
        return ProbeResult(
            dest=dest,
            streams=streams,
            duration_s=float(seconds),
            omit_s=float(omit_s),
            throughput_bps=mean,
            sender_bps=mean,
            retransmits=self.retransmits_per_stream * streams,
            rtt_mean_s=self.rtt_s,
            rtt_min_s=self.rtt_s,
            rtt_max_s=self.rtt_s,
            stream_rtts=tuple(StreamRtt(self.rtt_s, self.rtt_s, self.rtt_s) for _ in range(streams)),
            mss_bytes=self.mss_bytes,
            congestion_control=congestion_control or self.congestion_control,
            interval_bps=tuple(float(x) for x in series),
            stream_bps=(mean / running,) * running + (0.0,) * idle,
            stream_retransmits=(self.retransmits_per_stream,) * streams,
        )

    def idle_rtt(self, dest: str, deadline_s: float) -> float | None:
        self.calls.append(("idle_rtt", dest, None, None, None))
        if self.fail_with is not None:
            raise self.fail_with
        return self.rtt_s
