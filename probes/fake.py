"""A deterministic in-memory probe driver, for unit tests of the advisor and the API only."""

from __future__ import annotations

import time
from typing import Callable

from probes.result import ProbeResult


class FakeDriver:
    """Reports ``throughput_of_n(streams)`` bits/s for every probe, after sleeping ``delay_s``.

    It sends no traffic. ``delay_s`` lets tests catch a probe in flight (e.g. to kill the
    process running it); ``idle_rtt_s`` is what :meth:`idle_rtt` reports.
    """

    def __init__(self, throughput_of_n: Callable[[int], float], delay_s: float = 0.0, idle_rtt_s: float | None = 0.01):
        self.throughput_of_n = throughput_of_n
        self.delay_s = delay_s
        self.idle_rtt_s = idle_rtt_s

    def run(self, dest: str, streams: int, duration_s: float, omit_s: float, deadline_s: float) -> ProbeResult:
        if self.delay_s:
            time.sleep(self.delay_s)
        rate = float(self.throughput_of_n(streams))
        return ProbeResult(
            dest=dest, streams=streams, duration_s=duration_s, omit_s=omit_s,
            throughput_bps=rate, sender_bps=rate, retransmits=0,
            rtt_mean_s=self.idle_rtt_s, started_at=time.time(), raw="fake",
        )

    def idle_rtt(self, dest: str, deadline_s: float) -> float | None:
        return self.idle_rtt_s
