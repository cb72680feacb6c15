"""The advice's margin chosen per form of the default model's fit, scored on ns-2 (a study; the service keeps one margin).

The service holds every fit's predicted impact i to i (1 + 0.15) + 0.02 (advisor.tame.DEFAULT_MARGIN).
``auto`` reads the impact from different laws by form (:func:`form_of`): the fair share's M
("congested"), the knee's equal shares and link conservation ("knee"), the mean of the fair share and
the probes' loss rates ("timeout regime"), none ("uncongested"). This study gives each form a margin of
its own (:class:`MarginByForm`), chosen on Lu's scenarios 1-6 (accuracy's full run) by one rule:

    for each form, every margin on the grid is tried with the other forms kept at the service's; among
    those that add no over-budget case in that form, the one with the highest mean ratio (true
    throughput at the advice / best in-budget) over the form's cases.

The choice is always made on the full run; the run the options ask for (``--holdout``, ``--queue RED``,
...) is then scored with the service's margin and with the chosen one, as whole streams and as opened
(each advice with a fractional stream is a ground-truth run of its own, accuracy.score_opened; its
fractional stream keeps the service's fractional margin):

    python -m benchmarks.studies.margin_by_form                        # choose and score on scenarios 1-6
    python -m benchmarks.studies.margin_by_form --holdout              # choose on 1-6, score on 7-10
    python -m benchmarks.studies.margin_by_form --holdout --queue RED  # ... behind RED queues

Runs come from the accuracy benchmark's cache; missing ones are simulated first (the full run from an empty cache
takes about 50 minutes on two cores).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, fields, replace

import numpy as np

from advisor.tame import DEFAULT_MARGIN, ImpactMargin
from benchmarks.accuracy import (FULL, ModelScore, PathResult, Settings, argument_parser, evaluate, score_opened,
                                 score_paths, summary)
from benchmarks.studies.common import one_model_settings, whole_stream_outcomes
from models.auto import KneeFit, TimeoutRegimeFit
from models.parallel import ParallelFit
from models.registry import MODELS, model_probes

GRID = tuple(ImpactMargin(r, a) for r in (0.0, 0.05, 0.10, 0.15) for a in (0.0, 0.01, 0.02))


def form_of(fitted: ParallelFit) -> str:
    """Which law the fit's impact comes from: "knee", "timeout regime", else its regime ("congested", "uncongested")."""
    if isinstance(fitted, KneeFit):
        return "knee"
    if isinstance(fitted, TimeoutRegimeFit):
        return "timeout regime"
    return fitted.regime


@dataclass(frozen=True)
class MarginByForm:
    """A margin per form of fit (:func:`form_of`), ``default`` for the rest.

    Each form reads the impact from its own law (the fair share's M, the knee's equal shares and link
    conservation, the timeout regime's loss rates), so each errs by its own amount.
    """

    default: ImpactMargin
    forms: tuple[tuple[str, ImpactMargin], ...] = ()

    def for_fit(self, fitted: ParallelFit) -> ImpactMargin:
        return dict(self.forms).get(form_of(fitted), self.default)


def fitted_paths(paths, model: str) -> list[tuple[object, object]]:
    """(path, the model fitted to its probes) for every path."""
    return [(path, MODELS[model](model_probes(model, path.probes, max(path.ns)))) for path in paths]


def form_outcomes(fits, margin: ImpactMargin) -> list[tuple[float, bool]]:
    """(true throughput at the whole-stream advice / best in-budget, truly over budget) for every (path, budget)
    of ``fits`` with an in-budget n, the advice held to ``margin``."""
    return [outcome for path, fitted in fits for outcome in whole_stream_outcomes(path, fitted, margin)]


def choose(fits, grid=GRID, service: ImpactMargin = DEFAULT_MARGIN) -> tuple[MarginByForm, list[tuple]]:
    """The margin per form by the module's rule, and a row per (form, margin) tried:
    (form, margin, cases, over-budget cases, the service margin's over-budget cases, mean ratio).

    A form's margin moves only the advice of that form's paths, so each form is scored on its own paths."""
    by_form = defaultdict(list)
    for path, fitted in fits:
        by_form[form_of(fitted)].append((path, fitted))
    chosen, rows = {}, []
    for form, form_fits in sorted(by_form.items()):
        allowed = sum(over for _, over in form_outcomes(form_fits, service))
        best = None
        for margin in grid:
            cases = form_outcomes(form_fits, margin)
            over = sum(o for _, o in cases)
            mean = float(np.mean([r for r, _ in cases]))
            rows.append((form, margin, len(cases), over, allowed, mean))
            if over <= allowed and (best is None or mean > best[0]):
                best = (mean, margin)
        chosen[form] = best[1] if best else service
    return MarginByForm(service, tuple(sorted(chosen.items()))), rows


def pooled(name: str, parts: list[ModelScore]) -> ModelScore:
    """One score of the paths of ``parts`` (scores of disjoint sets of paths), in the order of ``parts``."""
    whole = ModelScore(name)
    for part in parts:
        for f in fields(ModelScore):
            mine, theirs = getattr(whole, f.name), getattr(part, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            elif isinstance(mine, dict):
                for key, values in theirs.items():
                    mine.setdefault(key, []).extend(values)
    return whole


def scored(paths: list[PathResult], settings: Settings, margins: MarginByForm) -> dict:
    """The first model's summary row, each path's advice held to the margin of its fit's form, whole streams and
    as opened (its fractional stream held to the settings' fractional margin).

    A form's margin moves only its own paths' advice, so the paths are scored a margin at a time with the
    benchmark's own scoring (accuracy.score_paths, score_opened) and their scores pooled."""
    name = settings.models[0]
    settings = replace(settings, fractional_models=(name,))
    groups: dict[ImpactMargin, list[PathResult]] = defaultdict(list)
    for path, fitted in fitted_paths(paths, name):
        groups[margins.for_fit(fitted)].append(path)
    ordered = [path for group in groups.values() for path in group]
    scores = {name: pooled(name, [score_paths(group, replace(settings, margin=margin))[name]
                                  for margin, group in groups.items()])}
    score_opened(ordered, scores, settings)
    return summary(scores)[name]


def _cell(row: dict, kind: str) -> str:
    return f"{row[f'adv{kind}_all']:.2f} ({row[f'exc{kind}_all']:.0%})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[argument_parser(add_help=False)])
    settings, _ = one_model_settings(parser, argv)
    model = settings.models[0]
    start = time.monotonic()
    full = replace(settings, scenarios=FULL["scenarios"], ms=FULL["ms"], ns=FULL["ns"], queue="DropTail")
    full_paths = evaluate(full)[0]
    by_form, rows = choose(fitted_paths(full_paths, model))
    print(f"Margins per form of `{model}`'s fit, chosen on scenarios {list(full.scenarios)} x m {list(full.ms)} "
          "(DropTail): per form, the grid margin with the highest mean ratio over the form's cases among those "
          "adding no over-budget case in the form ('*': chosen).\n")
    print("| form | margin (relative, absolute) | cases | over budget (service's margin) | mean ratio |\n|---|---|---|---|---|")
    chosen = dict(by_form.forms)
    for form, margin, cases, over, allowed, mean in rows:
        mark = " *" if chosen[form] == margin else ""
        print(f"| {form} | {margin.relative:g}, {margin.absolute:g}{mark} | {cases} | {over} ({allowed}) | {mean:.3f} |")
    paths = full_paths if settings == full else evaluate(settings)[0]
    service, per_form = scored(paths, settings, MarginByForm(DEFAULT_MARGIN)), scored(paths, settings, by_form)
    print(f"\nAdvice on scenarios {list(settings.scenarios)} x m {list(settings.ms)} ({settings.queue}, {len(paths)} "
          "paths): median over budgets 0.05-0.3 of true throughput at the advice / best in-budget, and the share "
          "of advice truly over budget.\n")
    print("| margin | whole streams | as opened |\n|---|---|---|")
    for label, row in (("the service's (one for every form)", service), ("per form, as chosen above", per_form)):
        print(f"| {label} | {_cell(row, '')} | {_cell(row, '_opened')} |")
    print(f"\n({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
