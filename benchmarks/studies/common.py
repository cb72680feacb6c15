"""What several studies share on top of the accuracy benchmark: one model's settings, the service's whole streams scored."""

from __future__ import annotations

import argparse
from dataclasses import replace

from advisor.tame import DEFAULT_MODEL, NO_MARGIN, ImpactMargin, advise
from benchmarks.accuracy import BUDGETS, PathResult, Settings, advice_outcome, settings_from


def one_model_settings(parser: argparse.ArgumentParser, argv=None) -> tuple[Settings, argparse.Namespace]:
    """A study's settings from the command line and its parsed options: ``parser`` (built on
    :func:`benchmarks.accuracy.argument_parser`) read, the first model asked for or the default, no advice
    simulated as opened."""
    args = parser.parse_args(argv)
    settings, _ = settings_from(args, parser)
    return replace(settings, models=settings.models[:1] or (DEFAULT_MODEL,), fractional_models=()), args


def whole_stream_outcomes(path: PathResult, fitted, margin: ImpactMargin) -> list[tuple[float, bool]]:
    """The service's whole streams (advisor.tame.advise, floor(n*)) held to ``margin`` against the path's truth:
    (true throughput / best in-budget, whether over budget) for each budget that has an in-budget n."""
    outcomes = []
    for budget in BUDGETS:
        advised = advise(fitted, budget, n_max=max(path.ns), margin=margin, fractional_margin=NO_MARGIN)
        _, ratio, over = advice_outcome(path.ns, path.ours_bps, path.true_impact, budget, advised.num_flows)
        if ratio is not None:
            outcomes.append((ratio, over))
    return outcomes
