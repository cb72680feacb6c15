"""`tame curve`: predicted throughput and impact for n = 1 .. n_max, from probe numbers or a known DEST."""

from __future__ import annotations

import os
from pathlib import Path

from advisor.advice import curve_to_json
from advisor.cli import UsageError
from advisor.commands.common import add_probe_options, format_bps, margin_from_args, print_json, probes_from_args
from advisor.tame import predicted_curve
from models.errors import FitError
from models.registry import fit


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "curve", help="predicted throughput and impact vs number of streams (from --probe numbers or a known DEST)"
    )
    parser.add_argument("dest", nargs="?", metavar="DEST[:PORT]",
                        help="a destination the store knows (or the server at TAME_URL); instead of --probe")
    add_probe_options(parser, required=False)
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="also draw throughput and impact vs streams")
    parser.set_defaults(handler=run)


def run(args) -> int:
    if args.dest and args.probe:
        raise UsageError("give either DEST (a known destination) or --probe numbers, not both")
    if not args.dest and not args.probe:
        raise UsageError("give DEST (a known destination) or at least two --probe STREAMS:BPS")
    payload = _known_curve(args.dest) if args.dest else _fitted_curve(args)
    if args.plot:
        from advisor.plot import plot_curve

        title = f"{payload.get('dest', 'probes')}: model {payload['model']}"
        plot_curve(payload["curve"], payload.get("probes", []), title, args.plot)
    if args.json:
        print_json(payload)
        return 0
    print(f"{'streams':>7}  {'throughput':>14}  {'impact':>7}  {'bound':>7}")
    for point in payload["curve"]:
        print(f"{point['streams']:>7}  {format_bps(point['throughput_bps']):>14}  {point['impact']:>7.1%}  "
              f"{point['impact_bound']:>7.1%}")
    for warning in payload.get("warnings", []):
        print(f"warning: {warning}")
    return 0


def _fitted_curve(args) -> dict:
    points = probes_from_args(args)
    try:
        fitted = fit(args.model, points)
    except (FitError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    curve = predicted_curve(fitted, args.n_max, margin_from_args(args))
    payload = curve_to_json(fitted.model, dict(fitted.params), curve)
    payload["probes"] = [{"streams": p.streams, "throughput_bps": p.throughput_bps} for p in points]
    payload["warnings"] = list(fitted.warnings)
    return payload


def _known_curve(dest: str) -> dict:
    server = os.environ.get("TAME_URL")
    if server:
        from api.client import TameClient, TameError  # the CLI is where the layers are wired together

        with TameClient(server, token=os.environ.get("TAME_READ_TOKEN") or os.environ.get("TAME_TOKEN")) as client:
            try:
                return client.curve(dest)
            except TameError as exc:
                raise UsageError(f"{server}: {exc}") from exc
    from advisor.commands.runtime import load_settings, open_store
    from advisor.errors import AdvisorError
    from advisor.service import AdviceService

    settings = load_settings()
    store = open_store(settings)
    try:
        return AdviceService(store, settings).curve(dest)
    except AdvisorError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        store.close()
