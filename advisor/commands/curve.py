"""`tame curve`: predicted throughput and impact for n = 1 .. n_max."""

from __future__ import annotations

from advisor.advice import curve_to_json
from advisor.cli import UsageError
from advisor.commands.common import add_probe_options, format_bps, print_json, probes_from_args
from advisor.tame import predicted_curve
from models.errors import FitError
from models.registry import fit


def register(subparsers) -> None:
    parser = subparsers.add_parser("curve", help="predicted throughput and impact vs number of streams")
    add_probe_options(parser)
    parser.set_defaults(handler=run)


def run(args) -> int:
    points = probes_from_args(args)
    try:
        fitted = fit(args.model, points)
    except (FitError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    curve = predicted_curve(fitted, args.n_max)
    if args.json:
        print_json(curve_to_json(fitted.model, dict(fitted.params), curve))
        return 0
    print(f"{'streams':>7}  {'throughput':>14}  {'impact':>7}")
    for point in curve:
        print(f"{point.streams:>7}  {format_bps(point.throughput_bps):>14}  {point.impact:>7.1%}")
    for warning in fitted.warnings:
        print(f"warning: {warning}")
    return 0
