"""Where a model's cross-traffic error lies: per scenario, how many (path, n) errors are within a tolerance.

The accuracy report gives the p50 and p90 of the |relative error| of the predicted cross traffic
over every path and n; the goal p50 <= 0.05 needs half of those errors within 0.05. This counts
them per scenario, both from the probes (what the service does) and fitted to the ground truth's
own runs at the model's probe levels (the model's form, as in the report), so the scenarios that
hold the p50 up can be named. Same settings as the benchmark, reading its cache and simulating
what it lacks.

    python -m benchmarks.studies.cross_breakdown                      # full run, model auto
    python -m benchmarks.studies.cross_breakdown --holdout --model lu
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np

from benchmarks.accuracy import ModelScore, argument_parser, evaluate, form_scores, settings_from
from models.registry import MODELS


def errors_by_scenario(score: ModelScore, points_per_path: int) -> dict[int, np.ndarray]:
    """|relative error| of the predicted cross traffic, grouped by scenario (each scored path adds ``points_per_path``)."""
    errors = np.abs(np.asarray(score.cross_error, dtype=float)).reshape(-1, points_per_path)
    grouped: dict[int, list[np.ndarray]] = {}
    for scenario, row in zip(score.per_path_scenario, errors):
        grouped.setdefault(scenario, []).append(row)
    return {s: np.concatenate(rows) for s, rows in sorted(grouped.items())}


def breakdown_lines(by_probes: dict[int, np.ndarray], by_form: dict[int, np.ndarray], tolerance: float) -> list[str]:
    """Markdown table: per scenario and in all, errors within ``tolerance`` and the median, from probes and form."""
    def cells(errors: np.ndarray | None) -> str:
        if errors is None or not errors.size:
            return "- | -"
        return f"{int(np.sum(errors <= tolerance))} / {errors.size} ({np.mean(errors <= tolerance):.0%}) | {np.median(errors):.3f}"

    lines = [f"| scenario | within {tolerance:g}, probes | p50, probes | within {tolerance:g}, form | p50, form |",
             "|---|---|---|---|---|"]
    for scenario in sorted(set(by_probes) | set(by_form)):
        lines.append(f"| s{scenario} | {cells(by_probes.get(scenario))} | {cells(by_form.get(scenario))} |")
    every = [np.concatenate(list(d.values())) if d else np.array([]) for d in (by_probes, by_form)]
    lines.append(f"| all | {cells(every[0])} | {cells(every[1])} |")
    if every[0].size:
        lines += ["", f"A p50 within {tolerance:g} needs {int(np.ceil(every[0].size / 2))} of the {every[0].size} errors within it."]
    return lines


def main(argv=None) -> int:
    # Every other option (--holdout, --quick, --scenarios, --ms, --ns, --cache, probe settings) is the benchmark's.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[argument_parser(add_help=False)])
    parser.add_argument("--model", default="auto", choices=sorted(MODELS))
    parser.add_argument("--tolerance", type=float, default=0.05, help="|relative error| counted as within (default 0.05)")
    args = parser.parse_args(argv)
    if args.tolerance <= 0:
        parser.error(f"--tolerance must be above 0, got {args.tolerance:g}")
    settings, _ = settings_from(argparse.Namespace(**{**vars(args), "models": args.model}), parser)
    # Cross-traffic errors only: the advice's fractional-stream runs are not needed.
    paths, scores = evaluate(replace(settings, fractional_models=()))
    by_probes = errors_by_scenario(scores[args.model], len(settings.ns))
    by_form = errors_by_scenario(form_scores(paths, settings)[args.model], len(settings.ns))
    print(f"Cross-traffic |relative error| of model {args.model}, by scenario\n")
    print("\n".join(breakdown_lines(by_probes, by_form, args.tolerance)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
