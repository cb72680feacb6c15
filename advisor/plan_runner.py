"""The probe plan a job, the agent or `tame advise` runs, built from the service's settings and model."""

from __future__ import annotations

from typing import Any, Sequence

from advisor.settings import Settings
from advisor.tame import point_from_probe
from models.registry import ADAPTIVE_LEVEL, next_probe_level
from probes.plan import NextLevel, ProbePlan


def plan_for(settings: Settings, levels: Sequence[int], duration_s: float,
             congestion_control: str | None = None, reuses_adaptive: bool = False) -> ProbePlan:
    """ProbePlan for `levels` at `duration_s` seconds each under `congestion_control` (None: the configured
    default), extended up to the configured cap, plus the adaptive probe when the configured model chooses one and
    the plan does not re-use an earlier one (`reuses_adaptive`: a job's reuse_probe_id)."""
    return ProbePlan(
        levels=tuple(int(n) for n in levels),
        duration_s=duration_s,
        omit_s=settings.omit_s,
        max_duration_s=max(duration_s, settings.max_probe_duration_s),
        adaptive_probes=0 if reuses_adaptive else adaptive_probes(settings.model),
        congestion_control=congestion_control or settings.congestion_control,
    )


# The settings a claimed job's plan, and so its lease, takes from whoever runs it, beside the job's own levels and
# duration_s: the Settings field (and key of a claim's "plan_settings") -> the variable that sets it.
LEASE_SETTINGS = {"model": "TAME_MODEL", "max_probe_duration_s": "TAME_PROBE_MAX_DURATION_S",
                  "omit_s": "TAME_PROBE_OMIT_S"}


def lease_settings(settings: Settings) -> dict[str, Any]:
    """``settings``' values of LEASE_SETTINGS (the model's name; seconds), as a claim's answer gives the service's."""
    return {name: getattr(settings, name) for name in LEASE_SETTINGS}


def lease_settings_differ(mine: Settings, services: dict[str, Any]) -> list[str]:
    """Each of LEASE_SETTINGS whose value in ``mine`` differs from ``services`` (a claim's "plan_settings"), as
    ``TAME_X is MINE, the service's THEIRS``; a setting the service does not give is left out."""
    return [f"{variable} is {_shown(getattr(mine, name))}, the service's {_shown(services[name])}"
            for name, variable in LEASE_SETTINGS.items()
            if name in services and services[name] != getattr(mine, name)]


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def plan_needs(settings: Settings) -> tuple[int, float]:
    """What one probe of the configured plan takes of a site's budget: its most streams, and its longest time, s."""
    return max(settings.default_levels), plan_for(settings, settings.default_levels,
                                                  settings.default_duration_s).worst_case_s


def plan_need_text(name: str, need: float) -> str:
    """How a message names what one probe of the configured plan needs (:func:`plan_needs`) of budget field ``name``,
    and the settings that make it so."""
    if name == "max_streams":
        return f"the probe plan's {need} streams (TAME_PROBE_LEVELS)"
    return (f"one probe plan's longest time, {need:.1f}".removesuffix(".0") + " s (TAME_PROBE_LEVELS, "
            "TAME_PROBE_DURATION_S, TAME_PROBE_MAX_DURATION_S, TAME_PROBE_OMIT_S, TAME_MODEL)")


def adaptive_probes(model: str) -> int:
    """How many probes the model adds after the fixed levels (0 or 1)."""
    return 1 if model in ADAPTIVE_LEVEL else 0


def level_chooser(model: str, n_max: int) -> NextLevel | None:
    """The plan's ``next_level`` for ``model``: its adaptive level from the probes so far, or None."""
    if model not in ADAPTIVE_LEVEL:
        return None
    return lambda results: next_probe_level(model, [point_from_probe(r) for r in results], n_max)
