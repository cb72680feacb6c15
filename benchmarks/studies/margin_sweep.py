"""The advice's margin for the impact's error against what it costs, scored on ns-2 for a grid of margins.

The advisor holds the budget to the predicted impact i raised to i (1 + RELATIVE) + ABSOLUTE
(advisor.tame.DEFAULT_MARGIN). A larger margin exceeds the budget less often and leaves more of
the in-budget throughput unused; this prints both for every margin on the grid, per budget and over
all budgets, from the same probes and ground truth as benchmarks.accuracy (its cache; missing runs
are simulated first), for the default model unless ``--models`` says otherwise:

    python -m benchmarks.studies.margin_sweep                  # Lu's scenarios 1-6 (the accuracy benchmark's full run)
    python -m benchmarks.studies.margin_sweep --holdout        # scenarios 7-10

With ``--fractional`` the grid is the fractional stream's margin (advisor.tame.DEFAULT_FRACTIONAL_MARGIN)
instead, the whole streams held to the service's margin, and the advice is scored as the transfer
opens it: each advice with a fractional stream is a ground-truth run of its own (accuracy.score_opened),
so a margin's first sweep costs about a hundred simulations on the full run (2-3 minutes on two cores).

Every option of benchmarks.accuracy is accepted (its --margin, or with --fractional its --fractional-margin,
is ignored: the grid replaces it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace

from advisor.tame import DEFAULT_FRACTIONAL_MARGIN, DEFAULT_MARGIN, ImpactMargin
from benchmarks.accuracy import (BUDGETS, PathResult, Settings, argument_parser, evaluate, score_opened, score_paths,
                                 summary)
from benchmarks.studies.common import one_model_settings

RELATIVE = (0.0, 0.05, 0.10, 0.15, 0.20, 0.30)
ABSOLUTE = (0.0, 0.01, 0.02, 0.03)
# The fractional stream's margin is at least the whole streams' (0.15, 0.02).
FRACTIONAL_RELATIVE = (0.15, 0.20, 0.30, 0.40, 0.50)
FRACTIONAL_ABSOLUTE = (0.02, 0.03, 0.04, 0.06)
# Issue 5's advice goals: at least this share of the best in-budget throughput on median, the budget
# exceeded in at most this share of cases.
ADVICE_RATIO_GOAL = 0.95
EXCEEDED_GOAL = 0.10


def fractions(text: str) -> tuple[float, ...]:
    """Comma-separated fractions >= 0, e.g. ``0,0.05,0.1``."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, e.g. 0,0.05,0.1; got {text!r}") from None
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"margins must be numbers >= 0; got {text!r}")
    return values


def summary_as_opened(paths: list[PathResult], settings: Settings) -> dict[str, float]:
    """The first model's summary row, its served advice also simulated as the transfer opens it (score_opened)."""
    name = settings.models[0]
    settings = replace(settings, fractional_models=(name,))
    scores = score_paths(paths, settings)
    score_opened(paths, scores, settings)
    return summary(scores)[name]


def sweep_rows(paths, settings, margins) -> list[tuple[ImpactMargin, dict]]:
    """(margin, the default-or-first model's summary row with the advice scored under that margin) per margin."""
    name = settings.models[0]
    return [(margin, summary(score_paths(paths, replace(settings, margin=margin)))[name]) for margin in margins]


def fractional_sweep_rows(paths, settings, margins) -> list[tuple[ImpactMargin, dict]]:
    """(margin, the model's summary row with its advice opened, the fractional stream held to that margin) per margin."""
    return [(margin, summary_as_opened(paths, replace(settings, fractional_margin=margin))) for margin in margins]


def _cell(ratio: float, exceeded: float) -> str:
    """'ratio (exceeded %)', or '-' where no path had an in-budget n."""
    return "-" if math.isnan(ratio) else f"{ratio:.2f} ({exceeded:.0%})"


def table(rows: list[tuple[ImpactMargin, dict]], opened: bool = False) -> list[str]:
    """Markdown table of the advice per margin; '*' marks the service's margin, '+' the margins meeting both goals.

    ``opened``: the rows are fractional_sweep_rows' (the advice as opened, against the service's fractional
    margin), with a last column counting where no whole n is within the budget and the opened advice is.
    """
    adv, exc, service = ("adv_opened", "exc_opened", DEFAULT_FRACTIONAL_MARGIN) if opened else ("adv", "exc", DEFAULT_MARGIN)
    extra = " within budget where no whole n is |" if opened else ""
    lines = ["| relative | absolute | " + " | ".join(f"adv {b:g} (exc)" for b in BUDGETS) + " | all budgets | goals |"
             + extra, "|---" * (4 + len(BUDGETS) + bool(opened)) + "|"]
    for margin, row in rows:
        meets = row[f"{adv}_all"] >= ADVICE_RATIO_GOAL and row[f"{exc}_all"] <= EXCEEDED_GOAL
        mark = ("*" if margin == service else "") + ("+" if meets else "")
        lines.append(f"| {margin.relative:g} | {margin.absolute:g} | "
                     + " | ".join(_cell(row[f"{adv}_{b}"], row[f"{exc}_{b}"]) for b in BUDGETS)
                     + f" | {_cell(row[f'{adv}_all'], row[f'{exc}_all'])} | {mark} |"
                     + (f" {row['within_opened_without_whole']} of {row['without_whole']} |" if opened else ""))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[argument_parser(add_help=False)])
    parser.add_argument("--fractional", action="store_true",
                        help="sweep the fractional stream's margin and score the advice as opened (simulates it)")
    parser.add_argument("--relative", type=fractions,
                        help=f"comma-separated relative margins to try (default {','.join(map(str, RELATIVE))}; "
                             f"with --fractional {','.join(map(str, FRACTIONAL_RELATIVE))})")
    parser.add_argument("--absolute", type=fractions,
                        help=f"comma-separated absolute margins to try (default {','.join(map(str, ABSOLUTE))}; "
                             f"with --fractional {','.join(map(str, FRACTIONAL_ABSOLUTE))})")
    # The opened advice is simulated only where the sweep asks for it (fractional_sweep_rows).
    settings, own = one_model_settings(parser, argv)
    start = time.monotonic()
    paths, _ = evaluate(settings)
    relative = own.relative or (FRACTIONAL_RELATIVE if own.fractional else RELATIVE)
    absolute = own.absolute or (FRACTIONAL_ABSOLUTE if own.fractional else ABSOLUTE)
    margins = [ImpactMargin(r, a) for r in relative for a in absolute]
    if own.fractional:
        rows = fractional_sweep_rows(paths, settings, margins)
        what = (f"as opened, whole streams held to the service's margin ({DEFAULT_MARGIN.relative:g}, "
                f"{DEFAULT_MARGIN.absolute:g}) and the fractional stream to the margin of the row")
    else:
        rows = sweep_rows(paths, settings, margins)
        what = "per margin"
    print(f"Advice of `{settings.models[0]}` on scenarios {list(settings.scenarios)} x m {list(settings.ms)} "
          f"({len(paths)} paths) {what}: median over paths of true throughput at the advice / best in-budget "
          f"throughput, and the share of advice truly over budget. '*' the service's margin; '+' meets both goals "
          f"(>= {ADVICE_RATIO_GOAL:g}, <= {EXCEEDED_GOAL:.0%}).\n")
    print("\n".join(table(rows, opened=own.fractional)))
    print(f"\n({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
