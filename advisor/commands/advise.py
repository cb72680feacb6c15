"""`tame advise`: probe DEST (or ask the server at TAME_URL), fit, and print the advice."""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from advisor.advice import Advice
from advisor.alternatives import alternatives
from advisor.cli import UsageError
from advisor.commands.common import add_margin_option, add_src_option, fraction, fractional_margin_from_args, hold_defaults, link_text, margin_from_args, positive_int, print_advice, print_json, put_back_defaults, refuse_given, service_token, service_url
from advisor.commands.probe import EXIT_PROBE_FAILED, add_plan_options, control_from_args, measure, parse_levels
from advisor.errors import InvalidRequest
from advisor.jobs import MAX_LOOKUP_WAITS
from advisor.limits import check_probe_duration_s, check_probe_levels, parse_number
from advisor.plan_runner import level_chooser
from advisor.opening import how_to_open
from advisor.tame import DEFAULT_MODEL, DEFAULT_N_MAX, advise_from_plan, point_from_probe, representative_rtt_s
from models.errors import FitError
from models.registry import MIN_LEVELS, MODELS
from probes.controls import available_controls
from probes.plan import ProbePlan

# How long `tame advise` waits for a server-side probe before giving up, seconds.
SERVER_PROBE_WAIT_S = 900.0
# Options that shape the probes run and the fit made here; the server at TAME_URL is asked only for levels and
# duration_s (POST /v1/probes) and fits with its own settings.
_LOCAL_OPTIONS = {"model": "--model", "n_max": "--n-max", "no_margin": "--no-margin", "omit": "--omit",
                  "repeats": "--repeats", "max_duration": "--max-duration"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "advise", help="probe DEST and advise how many streams to use (uses the server at TAME_URL when set)"
    )
    add_plan_options(parser)
    parser.add_argument("--max-impact", type=fraction, required=True,
                        help="largest tolerated throughput loss of competing flows, fraction 0-1")
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    parser.add_argument("--n-max", type=positive_int, default=DEFAULT_N_MAX, help="largest stream count considered")
    add_margin_option(parser)
    parser.add_argument("--json", action="store_true", help="print the advice as JSON (the fields of `tame fit --json`)")
    add_src_option(parser, "of the link whose advice the server at TAME_URL gives (without TAME_URL this host probes, "
                           "and is the source)")
    parser.set_defaults(handler=run)
    hold_defaults(parser, _LOCAL_OPTIONS)  # refused with TAME_URL


def run(args) -> int:
    if os.environ.get("TAME_URL"):
        refuse_given(args, _LOCAL_OPTIONS, "with TAME_URL the server probes with its own settings (it takes "
                     "--levels and --duration) and fits with its own model, n_max and margin")
    put_back_defaults(args)
    # The plan the service would take for this model (POST /v1/probes), whoever runs the probes.
    try:
        check_probe_levels(list(parse_levels(args.levels)), MIN_LEVELS[args.model], args.model)
    except InvalidRequest as exc:
        raise UsageError(f"--levels {args.levels!r}: {exc}") from None
    try:
        check_probe_duration_s(parse_number(args.duration))
    except (ValueError, InvalidRequest) as exc:
        raise UsageError(f"--duration {args.duration!r}: give seconds from 1 to 300 ({exc})") from None
    server = service_url(os.environ.get("TAME_URL"))
    # The write token reads too; a scheduler holding only the read token can still read advice.
    token = service_token() if server else None
    if args.src is not None and not server:
        raise UsageError("--src names a link of the server at TAME_URL; without TAME_URL, tame advise probes from "
                         "this host: set TAME_URL, or leave --src out")
    # The server probes under a control its own kernel offers and says so; a local probe needs it here.
    control_from_args(args, local=not server)
    payload = _from_server(server, token, args) if server else _locally(args)
    if payload is None:
        return EXIT_PROBE_FAILED
    if args.json:
        print_json(payload)
    else:
        print(link_text(payload.get("src"), payload["dest"], payload.get("age_s"), payload.get("stale")))
        print_advice(Advice(**{k: v for k, v in payload.items() if k in Advice.__dataclass_fields__}),
                     payload.get("open"))
    return 0


def _locally(args) -> dict | None:
    plan = measure(args, "advise", level_chooser(args.model, args.n_max))
    if plan is None:
        return None
    try:
        advice = advise_from_plan(plan, args.max_impact, args.n_max, args.model, margin_from_args(args),
                                  fractional_margin_from_args(args), control_from_args(args, local=True))
    except (FitError, ValueError) as exc:
        print(f"tame advise: the probes of {plan.dest} cannot be fitted: {exc}", file=sys.stderr)
        return None
    # Probed here and now, under one control: nothing else is measured, so the others are probes to run.
    advice = dataclasses.replace(advice, alternatives=alternatives(plan.dest, args.max_impact,
                                                                   advice.congestion_control, advice, {},
                                                                   available_controls()))
    rtt_s = representative_rtt_s([point_from_probe(p) for p in plan.probes], plan.idle_rtt_s)
    return {"dest": plan.dest, **advice.to_json(), "open": how_to_open(advice, plan.dest, rtt_s)}


def _plan_asked(args) -> dict:
    """The probe plan options given on the command line, for the server (which has its own defaults)."""
    default = ProbePlan()
    asked = {}
    if args.levels != ",".join(map(str, default.levels)):
        asked["levels"] = list(parse_levels(args.levels))
    if float(args.duration) != default.duration_s:
        asked["duration_s"] = float(args.duration)
    return asked


def _waits(status: dict) -> str:
    """What a probe job's status (GET /v1/probes/ID) says of its wait for its name lookup: "" when it does not wait."""
    retry_at = status.get("retry_at")  # a service older than the field says nothing
    if retry_at is None:
        return ""
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(retry_at))
    return (f": waiting for a name lookup until {until} (wait {status.get('lookup_waits')} of "
            f"{MAX_LOOKUP_WAITS - 1}; the {MAX_LOOKUP_WAITS}th fails the probe)")


def _from_server(url: str, token: str | None, args) -> dict | None:
    from api.client import TameClient, TameError  # the CLI is where the layers are wired together

    with TameClient(url, token=token, timeout_s=30) as client:
        try:
            return client.advice(args.dest, args.max_impact, args.congestion_control, args.src)
        except TameError as exc:
            if exc.status != 404:
                raise UsageError(f"{client.shown_url}: {exc}") from exc
        print(f"tame advise: {client.shown_url} has no advice for {args.dest}; requesting a probe", file=sys.stderr,
              flush=True)
        try:
            job = client.request_probe(args.dest, **_plan_asked(args), congestion_control=args.congestion_control,
                                       src=args.src)
            deadline = time.monotonic() + SERVER_PROBE_WAIT_S
            while time.monotonic() < deadline:
                status = client.probe(job["id"])
                print(f"tame advise: probe {status['status']} ({status.get('progress') or 0:.0%}){_waits(status)}",
                      file=sys.stderr, flush=True)
                if status["status"] == "done":
                    return client.advice(args.dest, args.max_impact, args.congestion_control, args.src)
                if status["status"] == "failed":
                    print(f"tame advise: the server's probe failed: {status.get('error')}", file=sys.stderr)
                    return None
                time.sleep(2.0)
        except TameError as exc:
            raise UsageError(f"{client.shown_url}: {exc}") from exc
    print(f"tame advise: the server's probe did not finish within {SERVER_PROBE_WAIT_S:g} s", file=sys.stderr)
    return None
