"""`tame curve`: predicted throughput and impact for n = 1 .. n_max, from probe numbers or a known DEST."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from advisor.advice import Advice, curve_to_json
from advisor.cli import UsageError
from advisor.commands.common import (
    add_probe_options, add_src_option, format_bps, fraction, fractional_margin_from_args, hold_defaults, link_text,
    margin_from_args, n_star_text, opened_text, print_json, probes_from_args, put_back_defaults, refuse_given,
    service_token, service_url,
)
from advisor.commands.probe import add_control_option
from advisor.errors import InvalidRequest
from advisor.limits import check_congestion_control
from advisor.tame import advise, stored_curve, within_budget
from models.errors import FitError
from models.registry import fit

# Options that shape a fit made here; a known DEST's curve is the stored fit's, made by the service.
_FIT_OPTIONS = {"model": "--model", "n_max": "--n-max", "no_margin": "--no-margin"}


def png_path(text: str) -> Path:
    """A --plot value: a path ending in .png, written as given."""
    if Path(text).suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text!r} does not end in .png; the plot is a PNG image: give e.g. "
                                         "--plot curve.png")
    return Path(text)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "curve", help="predicted throughput and impact vs number of streams (from --probe numbers or a known DEST)"
    )
    parser.add_argument("dest", nargs="?", metavar="DEST[:PORT]",
                        help="a destination the store knows (or the server at TAME_URL); instead of --probe")
    add_probe_options(parser, required=False)
    parser.add_argument("--max-impact", type=fraction, default=None,
                        help="also mark the stream counts within this budget (fraction 0-1) and say what the advice "
                             "opens at it")
    parser.add_argument("--plot", type=png_path, metavar="OUT.png", help="also draw throughput and impact vs streams")
    add_src_option(parser, "of DEST's link")
    add_control_option(parser, "of DEST's curve and advice, which are kept per control (default: the service's), or "
                               "the --probe numbers ran under (the fractional stream's FM is calibrated against it)")
    parser.set_defaults(handler=run)
    hold_defaults(parser, _FIT_OPTIONS)  # DEST mode refuses them


def run(args) -> int:
    if args.dest and args.probe:
        raise UsageError("give either DEST (a known destination) or --probe numbers, not both")
    if not args.dest and not args.probe:
        raise UsageError("give DEST (a known destination) or at least two --probe STREAMS:BPS")
    if args.src is not None and not args.dest:
        raise UsageError("--src names the source of DEST's link; --probe numbers have no link: leave it out")
    control = None
    if args.congestion_control is not None:
        try:
            control = check_congestion_control(args.congestion_control, "--congestion-control")
        except InvalidRequest as exc:
            raise UsageError(str(exc)) from None
    if args.dest:
        refuse_given(args, _FIT_OPTIONS, "DEST's curve is the service's stored fit (its model, n_max and margin), "
                     "not one made here from --probe numbers")
        payload, advice = _known_curve(args.dest, args.max_impact, args.src, control)
    else:
        put_back_defaults(args)
        payload, advice = _fitted_curve(args, control)
    if advice is not None:
        payload.update(max_impact=args.max_impact, num_flows=advice.num_flows,
                       tcp_equivalent_streams=advice.tcp_equivalent_streams,
                       fractional_multiplier=advice.fractional_multiplier)
    if args.plot:
        from advisor.plot import plot_curve

        title = f"{payload.get('dest', 'probes')}: model {payload['model']}"
        try:
            plot_curve(payload["curve"], payload.get("probes", []), title, args.plot)
        except OSError as exc:
            raise UsageError(f"--plot {str(args.plot)!r}: cannot write it ({exc.strerror or exc}); give a path in a "
                             "directory that exists and that you may write to") from None
    if args.json:
        print_json(payload)
        return 0
    _print_table(payload, args.max_impact, advice)
    return 0


# Why a curve is stale (reading a curve queues no probe; asking for its advice does).
_STALE = "its evidence is older than the service's TAME_TTL_S; asking for its advice queues a probe"


def _print_table(payload: dict, budget: float | None, advice: Advice | None) -> None:
    if "dest" in payload:  # a known DEST's link, not --probe numbers; a server older than age_s leaves its age unsaid
        print(link_text(payload["src"], payload["dest"], payload.get("age_s"), payload["stale"], _STALE,
                        what="curve"))
    header = f"{'streams':>7}  {'throughput':>14}  {'impact':>7}  {'bound':>7}"
    print(header + ("  within budget" if budget is not None else ""))
    for point in payload["curve"]:
        line = (f"{point['streams']:>7}  {format_bps(point['throughput_bps']):>14}  {point['impact']:>7.1%}  "
                f"{point['impact_bound']:>7.1%}")
        if budget is not None:
            # The schedulers' rule (current_advice): advisable and the bound within the budget.
            within = point["advisable"] and within_budget(point["impact_bound"], budget)
            line += f"  {'yes' if within else 'no'}"
        print(line)
    if advice is not None:
        print(f"at budget {budget:.1%}: {opened_text(advice)} (n* {n_star_text(advice.tcp_equivalent_streams)})")
    for warning in payload.get("warnings", []):
        print(f"warning: {warning}")


def _fitted_curve(args, control: str | None) -> tuple[dict, Advice | None]:
    points = probes_from_args(args)
    try:
        fitted = fit(args.model, points)
    except FitError as exc:
        raise UsageError(str(exc)) from exc
    margin = margin_from_args(args)
    curve = stored_curve(fitted, args.n_max, margin)
    payload = curve_to_json(fitted.model, dict(fitted.params), [point for point, _ in curve])
    for entry, (_, advisable) in zip(payload["curve"], curve):
        entry["advisable"] = advisable
    payload["probes"] = [{"streams": p.streams, "throughput_bps": p.throughput_bps} for p in points]
    payload["warnings"] = list(fitted.warnings)
    advice = None
    if args.max_impact is not None:
        advice = advise(fitted, args.max_impact, args.n_max, margin=margin,
                        fractional_margin=fractional_margin_from_args(args), standard_control=control)
    return payload, advice


def _advice_from_payload(payload: dict) -> Advice:
    return Advice(**{k: v for k, v in payload.items() if k in Advice.__dataclass_fields__})


def _known_curve(dest: str, budget: float | None, src: str | None,
                 control: str | None) -> tuple[dict, Advice | None]:
    server = service_url(os.environ.get("TAME_URL"))
    if server:
        from api.client import TameClient, TameError  # the CLI is where the layers are wired together

        with TameClient(server, token=service_token(read_first=True)) as client:
            try:
                return _read_curve(client, dest, budget, src, control)
            except TameError as exc:
                raise UsageError(f"{client.shown_url}: {exc}") from exc
    from advisor.commands.runtime import load_settings, open_store
    from advisor.errors import AdvisorError
    from advisor.service import AdviceService

    settings = load_settings()
    store = open_store(settings, create=False)
    try:
        return _read_curve(AdviceService(store, settings), dest, budget, src, control)
    except AdvisorError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        store.close()


def _read_curve(service, dest: str, budget: float | None, src: str | None,
                control: str | None) -> tuple[dict, Advice | None]:
    """The curve of DEST's link from ``service`` (the server's client, or the service on the local store: the same
    calls), with its age_s and stale, and the advice at ``budget``."""
    payload = service.curve(dest, control, src=src)
    return payload, None if budget is None else _advice_from_payload(service.advice(dest, budget, control, src=src))
