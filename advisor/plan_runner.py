"""The probe plan a job or the agent runs, built from the service's settings."""

from __future__ import annotations

from typing import Sequence

from advisor.settings import Settings
from probes.plan import ProbePlan


def plan_for(settings: Settings, levels: Sequence[int], duration_s: float) -> ProbePlan:
    """ProbePlan for `levels` at `duration_s` seconds each, extended up to the configured cap."""
    return ProbePlan(
        levels=tuple(int(n) for n in levels),
        duration_s=duration_s,
        omit_s=settings.omit_s,
        max_duration_s=max(duration_s, settings.max_probe_duration_s),
    )
