"""The advice's margin for the impact's error against what it costs, scored on ns-2 for a grid of margins.

The advisor holds the budget to the predicted impact i raised to i (1 + RELATIVE) + ABSOLUTE
(advisor.tame.DEFAULT_MARGIN). A larger margin exceeds the budget less often and leaves more of
the in-budget throughput unused; this prints both for every margin on the grid, per budget and over
all budgets, from the same probes and ground truth as benchmarks/accuracy.py (its cache; missing runs
are simulated first), for the default model unless ``--models`` says otherwise:

    python benchmarks/margin_sweep.py                  # Lu's scenarios 1-6 (accuracy.py's full run)
    python benchmarks/margin_sweep.py --holdout        # scenarios 7-10

Every option of accuracy.py is accepted (its --margin is ignored: the grid replaces it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import BUDGETS, argument_parser, evaluate, score_paths, settings_from, summary  # noqa: E402

from advisor.tame import DEFAULT_MARGIN, DEFAULT_MODEL, ImpactMargin  # noqa: E402

RELATIVE = (0.0, 0.05, 0.10, 0.15, 0.20, 0.30)
ABSOLUTE = (0.0, 0.01, 0.02, 0.03)
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


def sweep_rows(paths, settings, margins) -> list[tuple[ImpactMargin, dict]]:
    """(margin, the default-or-first model's summary row with the advice scored under that margin) per margin."""
    name = settings.models[0]
    return [(margin, summary(score_paths(paths, replace(settings, margin=margin)))[name]) for margin in margins]


def _cell(ratio: float, exceeded: float) -> str:
    """'ratio (exceeded %)', or '-' where no path had an in-budget n."""
    return "-" if math.isnan(ratio) else f"{ratio:.2f} ({exceeded:.0%})"


def table(rows: list[tuple[ImpactMargin, dict]]) -> list[str]:
    """Markdown table of the advice per margin; '*' marks the service's margin, '+' the margins meeting both goals."""
    lines = ["| relative | absolute | " + " | ".join(f"adv {b:g} (exc)" for b in BUDGETS) + " | all budgets | goals |",
             "|---" * (4 + len(BUDGETS)) + "|"]
    for margin, row in rows:
        meets = row["adv_all"] >= ADVICE_RATIO_GOAL and row["exc_all"] <= EXCEEDED_GOAL
        mark = ("*" if margin == DEFAULT_MARGIN else "") + ("+" if meets else "")
        lines.append(f"| {margin.relative:g} | {margin.absolute:g} | "
                     + " | ".join(_cell(row[f"adv_{b}"], row[f"exc_{b}"]) for b in BUDGETS)
                     + f" | {_cell(row['adv_all'], row['exc_all'])} | {mark} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[argument_parser(add_help=False)])
    parser.add_argument("--relative", type=fractions, default=RELATIVE,
                        help=f"comma-separated relative margins to try (default {','.join(map(str, RELATIVE))})")
    parser.add_argument("--absolute", type=fractions, default=ABSOLUTE,
                        help=f"comma-separated absolute margins to try (default {','.join(map(str, ABSOLUTE))})")
    own = parser.parse_args(argv)
    settings, _ = settings_from(own, parser)
    # Whole-stream advice per margin (score_paths); the fractional-stream runs would be one per margin and advice.
    settings = replace(settings, models=settings.models[:1] or (DEFAULT_MODEL,), fractional_models=())
    start = time.monotonic()
    paths, _ = evaluate(settings)
    margins = [ImpactMargin(r, a) for r in own.relative for a in own.absolute]
    rows = sweep_rows(paths, settings, margins)
    print(f"Advice of `{settings.models[0]}` on scenarios {list(settings.scenarios)} x m {list(settings.ms)} "
          f"({len(paths)} paths) per margin: median over paths of true throughput at the advice / best in-budget "
          f"throughput, and the share of advice truly over budget. '*' the service's margin; '+' meets both goals "
          f"(>= {ADVICE_RATIO_GOAL:g}, <= {EXCEEDED_GOAL:.0%}).\n")
    print("\n".join(table(rows)))
    print(f"\n({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
