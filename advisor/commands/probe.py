"""`tame probe`: measure a destination with paired iperf3 probes and print what they measured."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

from advisor.cli import UsageError
from advisor.commands.common import positive_int
from advisor.errors import InvalidRequest
from advisor.limits import (
    MAX_PROBE_DURATION_S, MAX_PROBE_MAX_DURATION_S, MAX_PROBE_OMIT_S, MAX_PROBE_REPEATS, MIN_PROBE_DURATION_S,
    check_available_control, check_congestion_control, parse_number,
)
from advisor.plan_runner import level_chooser
from advisor.tame import DEFAULT_N_MAX
from models.registry import ADAPTIVE_LEVEL, MODELS
from probes.destination import parse_destination
from probes.errors import ProbeError
from probes.controls import available_controls, host_default_control
from probes.iperf import MAX_STREAMS, IperfDriver
from probes.plan import NextLevel, PlanEvent, ProbePlan, idle_streams, run_plan
from probes.result import PlanResult, ProbeResult

EXIT_PROBE_FAILED = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "probe", help="measure DEST with paired iperf3 probes (needs `iperf3 -s` there)"
    )
    add_plan_options(parser)
    adaptive = ", ".join(sorted(ADAPTIVE_LEVEL))
    parser.add_argument("--model", choices=sorted(MODELS), default=None,
                        help="also run the probe MODEL adds after the levels, as `tame advise --model MODEL` does "
                             f"(models that add one: {adaptive}; default: the levels only)")
    parser.add_argument("--n-max", type=positive_int, default=DEFAULT_N_MAX,
                        help=f"largest stream count the added probe may use (default {DEFAULT_N_MAX})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(handler=run)


def add_plan_options(parser) -> None:
    """DEST and the probe-plan options shared by `tame probe` and `tame advise`."""
    parser.add_argument("dest", metavar="DEST[:PORT]", help="iperf3 server; port 5201 if none; IPv6 as [addr]:port")
    plan = ProbePlan()
    levels = ",".join(map(str, plan.levels))
    parser.add_argument("--levels", default=levels, help=f"stream counts to probe, comma-separated (default {levels})")
    parser.add_argument("--duration", default=f"{plan.duration_s:g}", metavar="S",
                        help=f"measured seconds per probe (default {plan.duration_s:g})")
    parser.add_argument("--omit", default=f"{plan.omit_s:g}", metavar="S",
                        help=f"warm-up seconds left out of each probe (default {plan.omit_s:g})")
    parser.add_argument("--max-duration", default=f"{plan.max_duration_s:g}", metavar="S",
                        help=f"longest a probe is extended to while its rate has not settled (default {plan.max_duration_s:g})")
    parser.add_argument("--repeats", default="1", metavar="K", help="probe every level K times (default 1)")
    add_control_option(parser, "the probes' streams run under; one this kernel offers "
                               "(net.ipv4.tcp_available_congestion_control)")


def add_control_option(parser, what: str) -> None:
    """--congestion-control NAME, the same on every command that takes it."""
    parser.add_argument("--congestion-control", metavar="NAME", default=None,
                        help=f"TCP congestion control {what} (default: this host's, net.ipv4.tcp_congestion_control)")


def control_from_args(args, local: bool, default: str | None = None) -> str:
    """The --congestion-control given, else ``default`` (the settings' TAME_CONGESTION_CONTROL), else this host's
    default; checked, and with ``local`` one this kernel offers."""
    name = args.congestion_control if args.congestion_control is not None else default
    if name is None:
        return host_default_control()
    what = "--congestion-control" if args.congestion_control is not None else "TAME_CONGESTION_CONTROL"
    try:
        if local:
            return check_available_control(name, available_controls(), what)
        return check_congestion_control(name, what)
    except InvalidRequest as exc:
        raise UsageError(str(exc)) from None


def parse_levels(text: str) -> tuple[int, ...]:
    """``"1,10"`` → (1, 10); UsageError saying what to fix otherwise."""
    parts = [p.strip() for p in text.split(",")]
    levels = []
    for part in parts:
        level = _whole(part)
        if level is None or level < 1:
            raise UsageError(f"--levels {text!r}: {part!r} is not a positive integer; give e.g. --levels 1,10")
        if level > MAX_STREAMS:
            raise UsageError(f"--levels {text!r}: {part} streams is more than iperf3 allows ({MAX_STREAMS})")
        levels.append(level)
    duplicates = sorted({n for n in levels if levels.count(n) > 1})
    if duplicates:
        raise UsageError(f"--levels {text!r}: {', '.join(map(str, duplicates))} given twice; list each level once")
    return tuple(levels)


def _whole(text: str) -> int | None:
    try:
        return parse_number(text, int)
    except ValueError:
        return None


def _seconds(option: str, text: str, low: float, high: float) -> float:
    try:
        value = parse_number(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise UsageError(f"{option} {text!r}: give a number of seconds from {low:g} to {high:g}")
    return value


def plan_from_args(args) -> ProbePlan:
    """The plan the options describe, within the service's limits (advisor.limits)."""
    repeats = _whole(args.repeats)
    if repeats is None or not 1 <= repeats <= MAX_PROBE_REPEATS:
        raise UsageError(f"--repeats {args.repeats!r}: give a whole number from 1 to {MAX_PROBE_REPEATS}")
    duration = _seconds("--duration", args.duration, MIN_PROBE_DURATION_S, MAX_PROBE_DURATION_S)
    max_duration = _seconds("--max-duration", args.max_duration, MIN_PROBE_DURATION_S, MAX_PROBE_MAX_DURATION_S)
    if max_duration < duration:
        raise UsageError(f"--max-duration {args.max_duration} is shorter than --duration {args.duration}")
    return ProbePlan(
        levels=parse_levels(args.levels),
        duration_s=duration,
        omit_s=_seconds("--omit", args.omit, 0, MAX_PROBE_OMIT_S),
        max_duration_s=max_duration,
        repeats=repeats,
    )


def measure(args, command: str, next_level: NextLevel | None = None) -> PlanResult | None:
    """Run the plan the options describe against DEST with progress on stderr; None after a ProbeError.

    With ``next_level``, one adaptive probe follows at the level it picks (the model's choice).
    """
    try:
        dest = str(parse_destination(args.dest))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    plan = dataclasses.replace(plan_from_args(args), congestion_control=control_from_args(args, local=True))
    if next_level is not None:
        plan = dataclasses.replace(plan, adaptive_probes=1)
    driver = IperfDriver()
    try:
        return run_plan(driver, dest, plan, progress=lambda event: _print_progress(event, command),
                        next_level=next_level)
    except ProbeError as exc:
        print(f"tame {command}: {exc}", file=sys.stderr)
        return None


def run(args) -> int:
    result = measure(args, "probe", level_chooser(args.model, args.n_max) if args.model else None)
    if result is None:
        return EXIT_PROBE_FAILED
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        _print_table(result)
    return 0


def to_json(result: PlanResult) -> dict:
    """The `tame probe --json` document (throughput_bps: the receiver's rate after the start-up ramp;
    window_throughput_bps: over the whole measured window; stream_bps and stream_retransmits: each stream's
    rate and retransmitted segments over it;
    idle_streams: how many carried next to nothing, :func:`probes.plan.idle_streams`; interval_bps: the
    per-interval rate the settle rule read, measured at interval_side, "receiver" or "sender")."""
    used = result.congestion_controls
    return {
        "dest": result.dest,
        "congestion_control": used.pop() if len(used) == 1 else None,
        "idle_rtt_s": result.idle_rtt_s,
        "probes": [
            {
                "streams": p.streams,
                "throughput_bps": p.throughput_bps,
                "window_throughput_bps": p.window_throughput_bps,
                "sender_bps": p.sender_bps,
                "retransmits": p.retransmits,
                "rtt_mean_s": p.rtt_mean_s,
                "duration_s": p.duration_s,
                "omit_s": p.omit_s,
                "throughput_stderr_bps": p.throughput_stderr_bps,
                "settled": p.settled,
                "stream_bps": list(p.stream_bps),
                "stream_retransmits": list(p.stream_retransmits),
                "idle_streams": idle_streams(p),
                "interval_bps": list(p.interval_bps),
                "interval_side": p.interval_side,
                "congestion_control": p.congestion_control,
                "mss_bytes": p.mss_bytes,
                "started_at": p.started_at,
            }
            for p in result.probes
        ],
    }


def from_json(doc: dict) -> PlanResult:
    """The PlanResult a `tame probe --json` document describes (the inverse of :func:`to_json`; ``idle_streams``
    is derived, so it is not read back; a document written before interval_bps or stream_retransmits was kept
    reads back without them).
    KeyError or TypeError when the document lacks a field or has the wrong shape."""
    fields = ("streams", "throughput_bps", "window_throughput_bps", "sender_bps", "retransmits", "rtt_mean_s",
              "duration_s", "omit_s", "throughput_stderr_bps", "settled", "congestion_control", "mss_bytes",
              "started_at")
    probes = tuple(ProbeResult(dest=doc["dest"], stream_bps=tuple(p["stream_bps"]),
                               stream_retransmits=tuple(p.get("stream_retransmits", ())),
                               interval_bps=tuple(p.get("interval_bps", ())),
                               interval_side=p.get("interval_side", ProbeResult.interval_side),
                               **{k: p[k] for k in fields})
                   for p in doc["probes"])
    return PlanResult(dest=doc["dest"], idle_rtt_s=doc["idle_rtt_s"], probes=probes)


def _print_progress(event: PlanEvent, command: str) -> None:
    step = f"[{event.index}/{event.total}]"
    if event.kind == "idle_rtt":
        line = f"measuring idle RTT to {event.dest} …"
    elif event.kind == "idle_rtt_done":
        rtt = "unknown" if event.idle_rtt_s is None else f"{event.idle_rtt_s * 1e3:.3f} ms"
        line = f"idle RTT {rtt}"
    elif event.kind == "probe":
        line = f"{step} {event.streams} stream(s) for {event.duration_s:g} s …"
    elif event.kind == "extend":
        line = f"{step} {event.streams} stream(s): rate not settled, again for {event.duration_s:g} s …"
    elif event.kind == "retry":
        line = (f"{step} {event.streams} stream(s): {idle_streams(event.result)} stream(s) carried nothing, "
                f"again later for {event.duration_s:g} s …")
    else:
        r = event.result
        idle = idle_streams(r)
        line = f"{step} {event.streams} stream(s): {r.throughput_bps / 1e6:.1f} Mbit/s" + (
            "" if r.settled else " (not settled at the longest duration)"
        ) + (f" ({idle} stream(s) carried nothing)" if idle else "") + (
            " (the server sent no per-second report: the start-up ramp was judged by the sender's series, "
            "which can read high on a full link)" if r.interval_bps and r.interval_side == "sender" else "")
    print(f"tame {command}: {line}", file=sys.stderr, flush=True)


def _print_table(result: PlanResult) -> None:
    rtt = "unknown" if result.idle_rtt_s is None else f"{result.idle_rtt_s * 1e3:.3f} ms"
    controls = ", ".join(sorted(result.congestion_controls)) or "unknown"
    print(f"{result.dest}  idle RTT {rtt}  congestion control {controls}")
    print(f"{'streams':>7}  {'Mbit/s':>10}  {'± Mbit/s':>9}  {'retrans':>8}  {'RTT ms':>8}  {'seconds':>7}  settled")
    for p in result.probes:
        stderr = "-" if p.throughput_stderr_bps is None else f"{p.throughput_stderr_bps / 1e6:.1f}"
        retrans = "-" if p.retransmits is None else str(p.retransmits)
        rtt_ms = "-" if p.rtt_mean_s is None else f"{p.rtt_mean_s * 1e3:.3f}"
        print(
            f"{p.streams:>7}  {p.throughput_bps / 1e6:>10.1f}  {stderr:>9}  {retrans:>8}  {rtt_ms:>8}  "
            f"{p.duration_s:>7.1f}  {'yes' if p.settled else 'no'}"
        )
