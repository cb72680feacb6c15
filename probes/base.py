"""The one interface every probe driver implements."""

from __future__ import annotations

from typing import Protocol

from probes.result import ProbeResult


class ProbeDriver(Protocol):
    """Runs a transfer at ``streams`` parallel streams to ``dest`` and reports it.

    ``duration_s`` is the measured time after ``omit_s`` seconds of warm-up. ``attempt`` > 0
    asks for the same probe again at another time (the plan does so when some streams carried
    nothing): on a live network any later run is another time, so a real driver ignores it; a
    simulator gives each attempt conditions of its own. ``congestion_control`` names the control
    the streams run under (None: the driver's own, else the kernel's default); the result's
    ``congestion_control`` says which one they used, as the driver reports it.
    Implementations raise a :class:`probes.errors.ProbeError` subclass and keep
    nothing on failure; nothing they do may outlive ``deadline_s``.
    """

    def run(
        self,
        dest: str,
        streams: int,
        duration_s: float,
        omit_s: float,
        deadline_s: float,
        attempt: int = 0,
        congestion_control: str | None = None,
    ) -> ProbeResult: ...

    def idle_rtt(self, dest: str, deadline_s: float) -> float | None:
        """Round-trip time to ``dest`` with no probe traffic, in seconds (None if unknown)."""
        ...
