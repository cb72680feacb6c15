"""Two alternatives to the advice's constant margin, scored on ns-2 (a study; the service uses neither).

Both wrap the default model's fit and change only the impact the budget is held against; the advice is
the service's own (advisor.tame.advise: its whole streams, floor(n*)), scored as
benchmarks.accuracy scores it, from the same probes and ground truth (its cache; missing runs are
simulated first):

* ``spread``: a margin per path from the fit's own uncertainty. The probes are left out one at a
  time, the model is fitted to the rest, and the jackknife standard deviation of the impact over those
  fits, times Z, is added to the margin: bound = i (1 + RELATIVE) + ABSOLUTE + Z sd(n) for a predicted
  impact i > 0. Z = 0 is the service's constant margin.
* ``capacity``: where the fit is congested, the impact is at least our predicted throughput over the
  bottleneck's rate (the scenario's L3 link, which the service is not told): a full link's total is
  conserved, so the cross traffic loses what we take. This also changes the cross-traffic error.

    python -m benchmarks.studies.impact_bound_study                 # Lu's scenarios 1-6
    python -m benchmarks.studies.impact_bound_study --holdout       # scenarios 7-10

Every option of benchmarks.accuracy is accepted; its --margin is the constant part (RELATIVE, ABSOLUTE) of
the ``spread`` rows' first column and of the ``capacity`` row.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np

from advisor.tame import NO_MARGIN, ImpactMargin
from benchmarks.accuracy import argument_parser, evaluate
from benchmarks.studies.common import one_model_settings, whole_stream_outcomes
from models.errors import FitError
from models.parallel import CONGESTED, ParallelFit
from models.registry import MODELS, model_probes
from probes.ns2 import SCENARIOS

SPREAD_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class BoundedImpact(ParallelFit):
    """``fitted`` with its impact replaced by the bound the budget is held against (fractions 0-1): the
    predicted impact (floored at throughput / ``link_bps`` where congested, if given) raised by ``margin``
    and by ``weight`` x the jackknife spread over the ``left_out`` fits. Build it with :meth:`around`."""

    # Every fit class names the form of its record; this one is never stored.
    record_form = "impact_bound_study"

    fitted: ParallelFit | None = None
    margin: ImpactMargin = NO_MARGIN
    weight: float = 0.0
    left_out: tuple[ParallelFit, ...] = ()
    link_bps: float | None = None

    @classmethod
    def around(cls, fitted: ParallelFit, margin: ImpactMargin, weight: float = 0.0,
               left_out: tuple[ParallelFit, ...] = (), link_bps: float | None = None) -> "BoundedImpact":
        return cls(model=fitted.model, params=fitted.params, regime=fitted.regime, probe_streams=fitted.probe_streams,
                   fitted=fitted, margin=margin, weight=weight, left_out=tuple(left_out), link_bps=link_bps)

    def throughput_bps(self, streams):
        return self.fitted.throughput_bps(streams)

    def predicted_impact(self, streams) -> np.ndarray:
        """The fit's impact, floored at throughput / link rate where congested and a link rate is given."""
        impact = np.asarray(self.fitted.impact(streams), dtype=float)
        if self.link_bps is not None and self.fitted.regime == CONGESTED:
            impact = np.maximum(impact, np.minimum(1.0, np.asarray(self.fitted.throughput_bps(streams)) / self.link_bps))
        return impact

    def spread(self, streams) -> np.ndarray:
        """Jackknife standard deviation of the impact over the leave-one-probe-out fits (0 with fewer than two)."""
        n = np.asarray(streams, dtype=float)
        if self.weight == 0 or len(self.left_out) < 2:
            return np.zeros_like(n)
        values = np.array([np.clip(np.asarray(f.impact(n), dtype=float), 0.0, 1.0) for f in self.left_out])
        k = len(values)
        return np.sqrt((k - 1) / k * ((values - values.mean(axis=0)) ** 2).sum(axis=0))

    def impact(self, streams):
        impact = self.predicted_impact(streams)
        bound = np.asarray(self.margin.bound(impact)) + np.where(impact > 0, self.weight * self.spread(streams), 0.0)
        bound = np.minimum(bound, np.where(impact > 0, 1.0, impact))
        return bound if bound.ndim else float(bound)


def left_out_fits(model: str, probes) -> tuple[ParallelFit, ...]:
    """The model fitted to the probes with each one left out in turn (fits that fail are skipped)."""
    fits = []
    for i in range(len(probes)):
        try:
            fits.append(MODELS[model](list(probes[:i]) + list(probes[i + 1:])))
        except FitError:
            pass
    return tuple(fits)


def score(paths, model: str, bounded) -> dict:
    """Cross-traffic |relative error| p50 / p90 of the bound's predicted impact, and the advice per budget:
    the service's whole streams (advisor.tame.advise) held to the bound with no further margin.

    ``bounded(path, fitted, probes)`` gives the BoundedImpact of one path.
    """
    cross, ratios, exceeded = [], [], []
    for path in paths:
        probes = model_probes(model, path.probes, max(path.ns))
        curve = bounded(path, MODELS[model](probes), probes)
        cross.extend(np.abs(path.cross_error(curve.predicted_impact(np.array(path.ns, dtype=float)))).tolist())
        for ratio, over in whole_stream_outcomes(path, curve, NO_MARGIN):
            ratios.append(ratio)
            exceeded.append(over)
    return {"cross_p50": float(np.percentile(cross, 50)), "cross_p90": float(np.percentile(cross, 90)),
            "advice": float(np.median(ratios)), "exceeded": float(np.mean(exceeded)), "cases": len(exceeded),
            "over": int(sum(exceeded))}


def spread_rows(paths, model: str, margins, weights) -> list[tuple[ImpactMargin, float, dict]]:
    """(margin, weight, score) for every margin and jackknife weight."""
    left_out = {id(path): left_out_fits(model, model_probes(model, path.probes, max(path.ns))) for path in paths}
    return [(margin, weight, score(paths, model, lambda path, fitted, probes, m=margin, w=weight:
                                   BoundedImpact.around(fitted, m, w, left_out[id(path)])))
            for margin in margins for weight in weights]


def capacity_score(paths, model: str, margin: ImpactMargin) -> dict:
    """The score with the impact floored at throughput / the scenario's bottleneck rate."""
    return score(paths, model, lambda path, fitted, probes: BoundedImpact.around(
        fitted, margin, link_bps=SCENARIOS[path.scenario].l3_bps))


def _row(label: str, s: dict) -> str:
    return (f"| {label} | {s['cross_p50']:.3f} / {s['cross_p90']:.3f} | {s['advice']:.2f} ({s['exceeded']:.0%}, "
            f"{s['over']} of {s['cases']}) |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[argument_parser(add_help=False)])
    settings, _ = one_model_settings(parser, argv)
    model = settings.models[0]
    start = time.monotonic()
    paths, _ = evaluate(settings)
    base = settings.margin
    margins = [base, ImpactMargin(0.0, base.absolute), ImpactMargin(0.0, 0.0), ImpactMargin(0.1, 0.01)]
    print(f"`{model}` on scenarios {list(settings.scenarios)} x m {list(settings.ms)} ({len(paths)} paths). "
          "Cross: |relative error| p50 / p90; advice: median of true throughput at floor(n*) / best in-budget, "
          "and the share (count) of advice truly over budget.\n")
    print("| impact bound | cross | advice |\n|---|---|---|")
    for margin, weight, s in spread_rows(paths, model, margins, SPREAD_WEIGHTS):
        print(_row(f"i x {1 + margin.relative:g} + {margin.absolute:g} + {weight:g} x jackknife sd", s))
    print(_row(f"max(i, ours / link rate) x {1 + base.relative:g} + {base.absolute:g}", capacity_score(paths, model, base)))
    print(f"\n({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
