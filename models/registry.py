"""The named throughput models the advisor can use, by the name users pass as --model."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from models import auto
from models.fair_share import fit_fair_share
from models.parallel import ParallelFit, ProbePoint, fit_full_order2, fit_linear, fit_lu
from models.yildirim import fit_yildirim

Fitter = Callable[[Sequence[ProbePoint]], ParallelFit]

MODELS: dict[str, Fitter] = {
    "auto": auto.fit_auto,
    "auto_weighted": auto.fit_auto_weighted,
    "lu": fit_lu,
    "linear": fit_linear,
    "full2": fit_full_order2,
    "fair_share": fit_fair_share,
    "yildirim": fit_yildirim,
}

# How many distinct probe levels each model needs.
MIN_LEVELS: dict[str, int] = {"auto": 2, "auto_weighted": 2, "lu": 2, "linear": 2, "full2": 3, "fair_share": 2,
                              "yildirim": 3}

# The probe plan's fixed levels per model (Lu IV.B: (1, 10)); a model may add one adaptive level.
PROBE_LEVELS: dict[str, tuple[int, ...]] = {
    "auto": (1, 10), "auto_weighted": (1, 10), "lu": (1, 10), "linear": (1, 10), "full2": (1, 5, 10),
    "fair_share": (1, 10), "yildirim": (1, 5, 10),
}

# Models whose plan adds a probe chosen from the first probes' results: name -> chooser(probes, n_max).
ADAPTIVE_LEVEL: dict[str, Callable[[Sequence[ProbePoint], int], int | None]] = {
    "auto": auto.next_level, "auto_weighted": auto.next_level}


def next_probe_level(model: str, probes: Sequence[ProbePoint], n_max: int) -> int | None:
    """The extra probe level the model wants after its fixed levels (at most ``n_max``), or None."""
    chooser = ADAPTIVE_LEVEL.get(model)
    return chooser(probes, n_max) if chooser is not None else None


def model_probes(model: str, by_streams: Mapping[int, ProbePoint], n_max: int) -> list[ProbePoint]:
    """The probes ``model`` is fitted to, taken from ``by_streams`` (probes by stream count): its fixed
    levels, then the adaptive level it picks from them (up to ``n_max``), if any. KeyError when one is missing."""
    probes = [by_streams[n] for n in PROBE_LEVELS[model]]
    level = next_probe_level(model, probes, n_max)
    if level is not None:
        probes.append(by_streams[level])
    return probes


def fit(model: str, points: Sequence[ProbePoint]) -> ParallelFit:
    """Fit the named model; raises ValueError naming the known models for an unknown name."""
    try:
        fitter = MODELS[model]
    except KeyError:
        raise ValueError(f"unknown model {model!r}; choose one of: {', '.join(sorted(MODELS))}") from None
    return fitter(points)
