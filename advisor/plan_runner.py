"""Runs the probe levels of one job through a driver.

Stand-in for ``probes.plan.run_plan`` until the probe layer's plan module is merged: this is
the one place to swap (``run_levels`` keeps the same shape: driver, dest, levels -> PlanResult).
"""

from __future__ import annotations

from typing import Callable, Sequence

from probes.base import ProbeDriver
from probes.result import PlanResult

# Time allowed beyond a probe's nominal length (process start-up, connection, result exchange).
DEADLINE_SLACK_S = 30.0
IDLE_RTT_DEADLINE_S = 10.0


def plan_deadline_s(levels: Sequence[int], duration_s: float, omit_s: float) -> float:
    """Longest a whole plan may take: every level's probe plus slack, plus the idle RTT measurement."""
    return IDLE_RTT_DEADLINE_S + len(levels) * (duration_s + omit_s + DEADLINE_SLACK_S)


def run_levels(driver: ProbeDriver, dest: str, levels: Sequence[int], duration_s: float, omit_s: float,
               progress: Callable[[float], None] | None = None) -> PlanResult:
    """Idle RTT, then one probe per level in order; raises the driver's ProbeError on failure."""
    idle_rtt_s = driver.idle_rtt(dest, deadline_s=IDLE_RTT_DEADLINE_S)
    results = []
    for index, streams in enumerate(levels):
        results.append(driver.run(dest, int(streams), duration_s, omit_s,
                                  deadline_s=duration_s + omit_s + DEADLINE_SLACK_S))
        if progress is not None:
            progress((index + 1) / len(levels))
    return PlanResult(dest=dest, idle_rtt_s=idle_rtt_s, probes=tuple(results))
