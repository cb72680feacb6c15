"""Socket-buffer advice after Rao & Feng: parallel windows should sum to just under the bottleneck BDP."""

from __future__ import annotations

import math

from models.single_flow import _positive

DEFAULT_BDP_MARGIN = 0.05


def per_stream_buffer_bytes(capacity_bps: float, rtt_s: float, streams: int, margin: float = DEFAULT_BDP_MARGIN) -> int:
    """Per-stream socket buffer so the streams' windows sum to (1 - margin) x BDP; Rao & Feng section 3.

    Rao & Feng show that a flow window just above the bottleneck BDP makes the congestion window
    oscillate and can cost ~25 % of throughput, while one just below it gives a smooth flow at
    the bottleneck rate; for parallel TCP the sum of the flow windows plays that role.

    Parameters
    ----------
    capacity_bps : bottleneck capacity estimate, bits/s
    rtt_s : round-trip time, seconds (the idle RTT, not one inflated by queueing)
    streams : number of parallel streams (>= 1)
    margin : fraction in [0, 1) kept below the BDP

    Returns
    -------
    int, bytes per stream (at least one 1500-byte packet)
    """
    capacity = float(_positive("capacity_bps", capacity_bps))
    rtt = float(_positive("rtt_s", rtt_s))
    if int(streams) != streams or streams < 1:
        raise ValueError(f"streams must be an integer >= 1, got {streams!r}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin!r}")
    bdp_bytes = capacity * rtt / 8.0
    return max(1500, int(math.floor(bdp_bytes * (1.0 - margin) / streams)))
