"""`tame fit`: advice from probe numbers typed in (offline)."""

from __future__ import annotations

import dataclasses

from advisor.cli import UsageError
from advisor.commands.common import (
    add_probe_options, fraction, fractional_margin_from_args, margin_from_args, print_advice, print_json, probes_from_args,
)
from advisor.alternatives import alternatives
from advisor.commands.probe import add_control_option, control_from_args
from advisor.opening import how_to_open
from advisor.tame import tame_parallel_tcp
from models.errors import FitError
from probes.controls import available_controls


def register(subparsers) -> None:
    parser = subparsers.add_parser("fit", help="advice from probe results you type in (no network)")
    add_probe_options(parser)
    parser.add_argument("--max-impact", type=fraction, default=0.1,
                        help="largest tolerated throughput loss of competing flows, fraction 0-1 (default 0.1)")
    add_control_option(parser, "the probes ran under: the fractional stream's FM is calibrated against it")
    parser.set_defaults(handler=run)


def run(args) -> int:
    points = probes_from_args(args)
    control = control_from_args(args, local=False)
    try:
        advice = tame_parallel_tcp(points, args.max_impact, args.n_max, args.model, margin=margin_from_args(args),
                                    fractional_margin=fractional_margin_from_args(args), standard_control=control)
    except FitError as exc:
        raise UsageError(str(exc)) from exc
    # Typed-in probes name no destination: the probes that would tell are spelled for DEST.
    advice = dataclasses.replace(advice, alternatives=alternatives("DEST", args.max_impact, control, advice, {},
                                                                   available_controls()))
    opening = how_to_open(advice, None)  # typed-in numbers: no destination, no RTT
    if args.json:
        print_json({**advice.to_json(), "open": opening})
    else:
        print_advice(advice, opening)
    return 0
