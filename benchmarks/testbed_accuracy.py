"""How accurate the advice is on real test-bed paths: predicted vs measured throughput and cross-traffic impact.

    sudo .venv/bin/python -m benchmarks.testbed_accuracy           # about 15-20 minutes
    sudo .venv/bin/python -m benchmarks.testbed_accuracy --quick   # about 5 minutes, 5 s runs

For each of three namespace test beds (probes/testbed.py) it

1. builds the path and starts an iperf3 server in the receiver namespace;
2. runs the advisor's real probe plan from the sender namespace (``tame probe --json --model
   auto``: idle RTT, levels 1 and 10, then auto's adaptive probe, each extended while its rate
   has not settled, 30 s after 5 s of warm-up as the service probes) and fits every model of
   ``--models`` to its own levels, with the losses, RTT and segment size the probes measured
   (what the service fits from);
3. measures ground truth with the iperf3 CLI (``-J``, receiver-side goodput) for n = 1, 2, 4,
   8, 16, 32 streams and every n a model advises at the budgets 0.05, 0.1, 0.2 and 0.3 (so each
   advice is measured where it lands), ``--seconds`` each after ``--omit`` warm-up seconds, and, on the path with
   cross traffic, the cross flows' goodput over the same window (their sockets' ``bytes_acked``
   from ``ss``, sampled inside the measured part of the run), and with no transfer at all (n = 0)
   before and after the sweep.

It prints, per path and model, the measured and predicted throughput with the relative error
(pred − meas) / meas, the measured cross throughput and the predicted one,
cross(n=0) × (1 − impact(n)), with its relative error, the mean |relative error| over the fixed
sweep, and per budget the advice against the best measured n whose true impact is within it; a
summary table of these comes first.
The tables also go to ``--output`` (default benchmarks/results/testbed.md, or
testbed-quick.md with --quick) with the command at the top.

Paths (all 40 ms RTT, one-BDP queue, cubic senders):

* congested: 50 Mbit/s, 5 long cross flows;
* loss-limited: 100 Mbit/s, 0.1 % random loss, no cross traffic;
* buffer-limited: 100 Mbit/s, every socket in the sender and receiver namespaces capped by
  ``net.ipv4.tcp_rmem``/``tcp_wmem`` max = 131072 bytes. That is what ``iperf3 -w 64K`` gives
  (the kernel doubles SO_SNDBUF/SO_RCVBUF; measured here: 16.1 Mbit/s with -w 64K, 16.2 with the
  sysctl, one stream), and unlike -w it also reaches the probes, whose driver has no window option.

Everything it builds lives in a private state directory and is removed on exit, on Ctrl-C
and on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from advisor.commands.probe import from_json
from advisor.commands.probe import to_json as probe_json
from advisor.tame import DEFAULT_MODEL, DEFAULT_N_MAX, point_from_probe, tame_parallel_tcp
from models.errors import FitError
from models.evidence import loss_limited, loss_rate
from models.registry import ADAPTIVE_LEVEL, MODELS, PROBE_LEVELS, fit, model_probes
from probes import pathcheck, testbed
from probes.errors import ProbeError
from probes.iperf_parse import parse_iperf_json
from probes.netns import run
from probes.plan import ProbePlan
from probes.result import PlanResult

PORT = 5201
STREAMS = (1, 2, 4, 8, 16, 32)
# Impact budgets the advice is scored at (those of the ns-2 benchmark, benchmarks.accuracy).
BUDGETS = (0.05, 0.1, 0.2, 0.3)
CONGESTION_CONTROL = "cubic"
# The host allows only reno and bbr as namespace defaults, so every sender asks for cubic per socket.
BUFFER_SYSCTL_BYTES = 131072
# Long-running cross flows overshoot together in slow start; let them settle before anything is measured.
CROSS_WARMUP_S = 3.0
# After starting an iperf3 client, how long before its omitted warm-up even begins (connect, parameter exchange).
CLIENT_SETUP_S = 0.5
_BYTES_ACKED_RE = re.compile(r"bytes_acked:(\d+)")


@dataclass(frozen=True)
class BenchPath:
    key: str
    title: str
    spec: testbed.TestbedSpec
    socket_buffer_bytes: int | None = None


PATHS = (
    BenchPath("congested", "(a) congested: 50 Mbit/s, 40 ms RTT, one-BDP queue (250 kB), 5 cubic cross flows",
          testbed.TestbedSpec(rate_bps=50e6, rtt_s=0.040, queue_bytes=250_000, cross_flows=5,
                              congestion_control=CONGESTION_CONTROL)),
    BenchPath("loss", "(b) loss-limited: 100 Mbit/s, 40 ms RTT, one-BDP queue (500 kB), 0.1 % random loss, no cross traffic",
          testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.040, queue_bytes=500_000, loss_rate=0.001,
                              congestion_control=CONGESTION_CONTROL)),
    BenchPath("buffer", "(c) buffer-limited: 100 Mbit/s, 40 ms RTT, one-BDP queue (500 kB), socket buffers as iperf3 -w 64K",
          testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.040, queue_bytes=500_000, congestion_control=CONGESTION_CONTROL),
          socket_buffer_bytes=BUFFER_SYSCTL_BYTES),
)


@dataclass
class Row:
    streams: int
    measured_bps: float | None
    cross_bps: float | None = None


@dataclass
class PathResult:
    path: BenchPath
    run: int = 1                                    # 1..--runs: each run probes and sweeps the path afresh
    plan: PlanResult | None = None
    fits: dict = field(default_factory=dict)        # model -> ParallelFit or the error text
    model_points: dict = field(default_factory=dict)  # model -> the ProbePoints it was fitted to
    advice: dict = field(default_factory=dict)        # model -> {budget: Advice}, as the service gives it
    rows: list[Row] = field(default_factory=list)
    cross_idle_bps: list[float] = field(default_factory=list)  # n = 0 windows, before and after the sweep
    notes: list[str] = field(default_factory=list)


class Terminated(Exception):
    """SIGTERM arrived; unwinds like Ctrl-C so every finally block tears down."""


def _on_sigterm(signum, frame):
    raise Terminated()


# --- measuring ----------------------------------------------------------------------------------


def cross_bytes_acked(tb: testbed.Testbed) -> tuple[float, int]:
    """(monotonic time, payload bytes acknowledged so far) summed over the cross flows' sockets."""
    out = run(tb.exec_in(tb.cross_sender_ns, ["ss", "-H", "-t", "-i", "-n", "state", "established",
                                              "dport", "=", f":{testbed.CROSS_PORT}"]))
    return time.monotonic(), sum(int(m) for m in _BYTES_ACKED_RE.findall(out))


def cross_rate(before: tuple[float, int], after: tuple[float, int]) -> float:
    """Cross-traffic goodput in bits/s between two samples of cross_bytes_acked."""
    return (after[1] - before[1]) * 8 / (after[0] - before[0])


def probe_options(args, models: list[str]) -> tuple[list[str], ProbePlan]:
    """`tame probe` options and the plan they make: the levels the models share, then the adaptive probe of
    the first model in ``models`` that adds one, as `tame advise` would."""
    levels = sorted({n for model in models for n in PROBE_LEVELS[model]})
    adaptive = next((m for m in models if m in ADAPTIVE_LEVEL), None)
    options = ["--levels", ",".join(map(str, levels)), "--duration", f"{args.probe_seconds:g}",
               "--max-duration", f"{args.probe_max_seconds:g}", "--omit", f"{args.probe_omit:g}",
               "--congestion-control", CONGESTION_CONTROL]
    if adaptive:
        options += ["--model", adaptive, "--n-max", str(DEFAULT_N_MAX)]
    plan = ProbePlan(levels=tuple(levels), duration_s=args.probe_seconds, omit_s=args.probe_omit,
                     max_duration_s=args.probe_max_seconds, adaptive_probes=1 if adaptive else 0)
    return options, plan


def tame_probe(tb: testbed.Testbed, options: list[str], timeout_s: float) -> PlanResult:
    """`tame probe --json` with ``options`` from the sender namespace to the bed's iperf3 server on PORT."""
    argv = [sys.executable, "-m", "advisor", "probe", f"{tb.receiver_addr}:{PORT}", *options, "--json"]
    done = subprocess.run(tb.exec_in(tb.sender_ns, argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=None,
                          text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"tame probe failed (exit {done.returncode}); see its message above")
    return from_json(json.loads(done.stdout))


def probe_plan(tb: testbed.Testbed, args, models: list[str]) -> PlanResult:
    """Run the advisor's probe plan (:func:`probe_options`) from the sender namespace via `tame probe --json`."""
    options, plan = probe_options(args, models)
    # The plan's own worst case (idle RTT, every probe extended to the cap and tried again), plus start-up.
    return tame_probe(tb, options, plan.worst_case_s + 10)


def transfer(tb: testbed.Testbed, streams: int, seconds: int, omit_s: int, with_cross: bool) -> Row:
    """Our transfer of ``streams`` streams (iperf3 CLI) and, if any, the cross traffic's goodput meanwhile."""
    argv = tb.exec_in(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-p", str(PORT), "-J", "-P", str(streams),
                                     "-t", str(seconds), "-O", str(omit_s), "-C", CONGESTION_CONTROL])
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cross = None
        if with_cross:
            # The window sits inside iperf3's measured part: after set-up and warm-up, ending a second early.
            _sleep_until(start + CLIENT_SETUP_S + omit_s)
            first = cross_bytes_acked(tb)
            _sleep_until(first[0] + seconds - 1.0)
            cross = cross_rate(first, cross_bytes_acked(tb))
        out, err = proc.communicate(timeout=seconds + omit_s + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0 and not out.strip():
        raise RuntimeError(f"iperf3 -P {streams} failed: {err.strip()[-300:]}")
    result = parse_iperf_json(out, f"{tb.receiver_addr}:{PORT}")
    return Row(streams, result.throughput_bps, cross)


def transfer_retrying(tb: testbed.Testbed, streams: int, args, with_cross: bool, notes: list[str]) -> Row:
    """transfer(), tried twice; a run that fails both times becomes an empty row and a note."""
    for attempt in (1, 2):
        try:
            return transfer(tb, streams, args.seconds, args.omit, with_cross)
        except (ProbeError, RuntimeError, ValueError) as exc:
            # Seen once in ~20 runs: "unable to receive control message: Connection reset by peer".
            notes.append(f"n={streams}, attempt {attempt}: {exc}")
            print(f"n={streams}: attempt {attempt} failed: {exc}", file=sys.stderr, flush=True)
            time.sleep(1.0)
    return Row(streams, None)


def idle_cross(tb: testbed.Testbed, seconds: int, omit_s: int) -> float:
    """Cross-traffic goodput with no transfer of ours (n = 0), over a window as long as a transfer's."""
    time.sleep(CLIENT_SETUP_S + omit_s)
    first = cross_bytes_acked(tb)
    time.sleep(seconds - 1.0)
    return cross_rate(first, cross_bytes_acked(tb))


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def fit_models(result: PathResult, models: list[str]) -> None:
    """Fit every model to its own probes of ``result.plan`` and take its advice at each budget, as the service would."""
    by_streams = {p.streams: point_from_probe(p) for p in result.plan.probes}
    for model in models:
        # Each model sees its own probes, with the loss, RTT and segment size the service fits from.
        try:
            result.model_points[model] = model_probes(model, by_streams, DEFAULT_N_MAX)
        except KeyError as exc:
            result.fits[model] = f"not probed: it needs a probe at {exc} streams"
            continue
        try:
            result.fits[model] = fit(model, result.model_points[model])
            result.advice[model] = {b: tame_parallel_tcp(result.model_points[model], b, DEFAULT_N_MAX, model,
                                                         result.plan.idle_rtt_s) for b in BUDGETS}
        except (FitError, ValueError) as exc:
            result.fits[model] = f"cannot fit: {exc}"


def to_record(result: PathResult) -> dict:
    """What one run measured, as JSON: enough to fit the models again and rewrite the report (:func:`from_record`)."""
    return {"path": result.path.key, "run": result.run,
            "plan": None if result.plan is None else probe_json(result.plan),
            "rows": [asdict(r) for r in result.rows], "cross_idle_bps": result.cross_idle_bps, "notes": result.notes}


def from_record(record: dict, models: list[str]) -> PathResult:
    """The PathResult a :func:`to_record` document describes, with the models fitted afresh."""
    path = next(p for p in PATHS if p.key == record["path"])
    result = PathResult(path, record["run"], plan=None if record["plan"] is None else from_json(record["plan"]),
                        rows=[Row(**r) for r in record["rows"]], cross_idle_bps=list(record["cross_idle_bps"]),
                        notes=list(record["notes"]))
    if result.plan is not None:
        fit_models(result, models)
    return result


def measure_path(result: PathResult, name: str, state_dir: Path, args, models: list[str]) -> None:
    """Build the path, probe, sweep n; fills ``result`` as it goes, so a failure keeps what was measured."""
    path = result.path
    spec = replace(path.spec, name=name)
    print(f"\n== {path.title}", file=sys.stderr, flush=True)
    tb = testbed.up(spec, state_dir=state_dir)
    try:
        if path.socket_buffer_bytes:
            limit = f"4096 {path.socket_buffer_bytes} {path.socket_buffer_bytes}"
            for ns in (tb.sender_ns, tb.receiver_ns):
                for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
                    run(tb.exec_in(ns, ["sysctl", "-q", "-w", f"{key}={limit}"]))
        if spec.cross_flows:
            time.sleep(CROSS_WARMUP_S)
        with pathcheck.iperf3_server(tb, PORT):
            result.plan = probe_plan(tb, args, models)
            for p in result.plan.probes:
                print(f"probe n={p.streams}: {p.throughput_bps / 1e6:.2f} Mbit/s over {p.duration_s:.1f} s"
                      f"{'' if p.settled else ' (not settled)'}", file=sys.stderr, flush=True)
            fit_models(result, models)
            if spec.cross_flows:
                result.cross_idle_bps.append(idle_cross(tb, args.seconds, args.omit))
                print(f"n=0: cross {result.cross_idle_bps[-1] / 1e6:.2f} Mbit/s", file=sys.stderr, flush=True)
            # The sweep, and every stream count some model advises, so each advice is measured where it lands.
            advised = {a.num_flows for by_budget in result.advice.values() for a in by_budget.values()}
            for n in sorted(set(STREAMS) | advised):
                row = transfer_retrying(tb, n, args, bool(spec.cross_flows), result.notes)
                result.rows.append(row)
                if row.measured_bps is not None:
                    cross = "" if row.cross_bps is None else f", cross {row.cross_bps / 1e6:.2f} Mbit/s"
                    print(f"n={n}: {row.measured_bps / 1e6:.2f} Mbit/s{cross}", file=sys.stderr, flush=True)
            if spec.cross_flows:
                result.cross_idle_bps.append(idle_cross(tb, args.seconds, args.omit))
                print(f"n=0 (after): cross {result.cross_idle_bps[-1] / 1e6:.2f} Mbit/s", file=sys.stderr, flush=True)
    finally:
        testbed.down(spec.name, state_dir=state_dir)


# --- reporting ----------------------------------------------------------------------------------


def _mbit(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:.2f}"


def _err(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else (pred - meas) / meas


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _fraction(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def cross_baseline(result: PathResult) -> float | None:
    """cross(n=0) in bits/s: the mean of the idle windows before and after the sweep (None without cross traffic)."""
    return sum(result.cross_idle_bps) / len(result.cross_idle_bps) if result.cross_idle_bps else None


def true_impact(result: PathResult, row: Row) -> float:
    """Measured relative loss of the cross traffic at ``row`` (0 on a path without cross traffic)."""
    baseline = cross_baseline(result)
    return 0.0 if baseline is None else 1.0 - row.cross_bps / baseline


def _impact_text(impact: float, budget: float) -> str:
    return f"{impact:.3f}" + (" (over)" if impact > budget else "")


def model_score(result: PathResult, model: str) -> dict:
    """One model on one path: mean |relative error| of throughput and of cross traffic over the fixed sweep
    (None where nothing was measured), and per budget (Advice, the row at the advised n, the best in-budget
    row, true throughput ratio of the two); rows that failed are left out."""
    fitted = result.fits[model]
    measured = [r for r in result.rows if r.measured_bps is not None]
    sweep = [r for r in measured if r.streams in STREAMS]
    throughput = [abs(float(fitted.throughput_bps(r.streams)) / r.measured_bps - 1) for r in sweep]
    baseline = cross_baseline(result)
    cross = [] if baseline is None else [abs(baseline * (1 - float(fitted.impact(r.streams))) / r.cross_bps - 1)
                                         for r in sweep if r.cross_bps]
    scored = [r for r in measured if not result.cross_idle_bps or r.cross_bps is not None]
    advice = {}
    for budget, given in result.advice.get(model, {}).items():
        there = next((r for r in scored if r.streams == given.num_flows), None)
        within = [r for r in scored if true_impact(result, r) <= budget]
        best = max(within, key=lambda r: r.measured_bps, default=None)
        ratio = None if there is None or best is None else there.measured_bps / best.measured_bps
        advice[budget] = (given, there, best, ratio)
    return {"throughput": float(np.mean(throughput)) if throughput else None,
            "cross": float(np.mean(cross)) if cross else None, "advice": advice}


def _median(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def summary(results: list[PathResult], models: list[str], runs: int) -> list[str]:
    """The report's first table: per path, model and run, the mean errors and the advice over the budgets;
    with several runs, each path and model's median over them follows its runs."""
    lines = ["| path | model | throughput mean \\|err\\| | cross traffic mean \\|err\\| "
             f"| advice ratio at budgets {', '.join(f'{b:g}' for b in BUDGETS)} "
             "| advice over budget, of the budgets some n meets |",
             "|---|---|---:|---:|---|---:|"]
    for path in dict.fromkeys(r.path for r in results):
        for model in models:
            scored = [(r, model_score(r, model)) for r in results
                      if r.path == path and model in r.fits and not isinstance(r.fits[model], str)]
            rows = []
            for result, score in scored:
                ratios = [r for _, _, _, r in score["advice"].values()]
                # As on ns-2 (benchmarks.accuracy): only budgets some measured n meets can be kept to.
                feasible = [(budget, there) for budget, (_, there, best, _) in score["advice"].items()
                            if best is not None]
                over = sum(there is not None and true_impact(result, there) > budget for budget, there in feasible)
                rows.append((f"{path.key}" + (f" (run {result.run})" if runs > 1 else ""), score["throughput"],
                             score["cross"], ratios, over, len(feasible)))
            if len(rows) > 1:
                rows.append((f"**{path.key}, median of {len(rows)} runs**", _median([r[1] for r in rows]),
                             _median([r[2] for r in rows]), [_median(list(b)) for b in zip(*(r[3] for r in rows))],
                             sum(r[4] for r in rows), sum(r[5] for r in rows)))
            for label, throughput, cross, ratios, over, budgets in rows:
                text = " / ".join("-" if r is None else f"{r:.2f}" for r in ratios)
                lines.append(f"| {label} | {model} | {_fraction(throughput)} | {_fraction(cross)} | {text} "
                             f"| {over} of {budgets} |")
    return lines + [""]


def _probe_text(probe) -> str:
    """One probe as the report shows it: rate, seconds, share of segments lost and auto's verdict on its streams."""
    point = point_from_probe(probe)
    lost = loss_rate(point)
    verdict = {True: "loss-limited", False: "not loss-limited", None: "cannot tell"}[loss_limited(point)]
    return (f"n={probe.streams}: {probe.throughput_bps / 1e6:.2f} Mbit/s ({probe.duration_s:.1f} s"
            f"{'' if probe.settled else ', not settled'}, {'-' if lost is None else f'{lost:.2%}'} lost, {verdict})")


def report(result: PathResult, models: list[str], runs: int) -> list[str]:
    """Markdown lines for one path: the probes, then one table per model."""
    lines = [f"### {result.path.title}" + (f", run {result.run}" if runs > 1 else ""), ""]
    plan = result.plan
    if plan is None:
        return lines + [f"- {note}" for note in result.notes] + [""]
    rtt = "unknown" if plan.idle_rtt_s is None else f"{plan.idle_rtt_s * 1e3:.1f} ms"
    lines.append(f"Probes (idle RTT {rtt}): " + ", ".join(_probe_text(p) for p in plan.probes) + ".")
    baseline = cross_baseline(result)
    if baseline is not None:
        windows = " and ".join(f"{b / 1e6:.2f}" for b in result.cross_idle_bps)
        lines.append(f"Cross traffic with no transfer (n=0), before and after the sweep: {windows} Mbit/s; "
                     f"cross(n=0) = their mean, {baseline / 1e6:.2f} Mbit/s.")
    for model in models:
        fitted = result.fits.get(model, "not fitted (the run stopped first)")
        lines.append("")
        label = f"`{model}`" + (" (DEFAULT_MODEL)" if model == DEFAULT_MODEL else "")
        if isinstance(fitted, str):
            lines.append(f"Model {label}: {fitted}")
            continue
        params = ", ".join(f"{k}={v:.4g}" for k, v in fitted.params.items())
        lines.append(f"Model {label}: regime {fitted.regime}, {params}.")
        for warning in fitted.warnings:
            lines.append(f"- warning: {warning}")
        lines.append("")
        lines.append("| n | measured Mbit/s | predicted Mbit/s | rel. error | cross measured Mbit/s "
                     "| cross predicted Mbit/s | cross rel. error |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|")
        if baseline is not None:
            lines.append(f"| 0 | - | - | - | {_mbit(baseline)} | {_mbit(baseline)} | - |")
        for row in result.rows:
            predicted = float(fitted.throughput_bps(row.streams))  # printed even where the measurement failed
            cross_pred = None if baseline is None else baseline * (1 - float(fitted.impact(row.streams)))
            mark = "" if row.streams in STREAMS else " (advised)"
            lines.append(f"| {row.streams}{mark} | {_mbit(row.measured_bps)} | {_mbit(predicted)} "
                         f"| {_pct(_err(predicted, row.measured_bps))} | {_mbit(row.cross_bps)} | {_mbit(cross_pred)} "
                         f"| {_pct(_err(cross_pred, row.cross_bps))} |")
        score = model_score(result, model)
        lines.append(f"| mean \\|err\\| over n = {', '.join(map(str, STREAMS))} | | | {_fraction(score['throughput'])} "
                     f"| | | {_fraction(score['cross'])} |")
        lines += ["", "Advice as the service gives it (with its margin), measured where it lands: true throughput there "
                  "over the best measured n whose true impact is within the budget.", "",
                  "| budget | advised n | predicted impact | measured Mbit/s | true impact | best in-budget n | ratio |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for budget, (advice, there, best, ratio) in score["advice"].items():
            lines.append(f"| {budget:g} | {advice.num_flows} | {advice.cross_traffic_impact:.3f} "
                         f"| {_mbit(None if there is None else there.measured_bps)} "
                         f"| {'-' if there is None else _impact_text(true_impact(result, there), budget)} "
                         f"| {'-' if best is None else best.streams} | {'-' if ratio is None else f'{ratio:.2f}'} |")
    if result.notes:
        lines.append("")
    for note in result.notes:
        lines.append(f"- {note}")
    lines.append("")
    return lines


SETTINGS = ("seconds", "omit", "probe_seconds", "probe_max_seconds", "probe_omit", "runs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 s transfers and 5 s probes (about 5 minutes)")
    parser.add_argument("--paths", default=",".join(p.key for p in PATHS),
                        help=f"which paths, comma-separated (default all: {', '.join(p.key for p in PATHS)})")
    parser.add_argument("--models", default=",".join(dict.fromkeys([DEFAULT_MODEL, "lu"])),
                        help=f"models to fit to the probes, comma-separated (known: {', '.join(sorted(MODELS))})")
    parser.add_argument("--seconds", type=int, default=None, help="measured seconds per transfer (default 20; 5 quick)")
    parser.add_argument("--runs", type=int, default=1,
                        help="probe and sweep each path this many times (real TCP varies from run to run; the "
                             "summary adds the median over runs)")
    parser.add_argument("--output", type=Path, default=None,
                        help="markdown file for the tables (default benchmarks/results/testbed[-quick].md); "
                             "the measurements go beside it as .json")
    parser.add_argument("--from-json", type=Path, default=None, metavar="FILE",
                        help="measure nothing: fit --models to the measurements FILE holds (the .json an earlier "
                             "run wrote) and write the report again (default: FILE with .md)")
    args = parser.parse_args()
    command = "sudo .venv/bin/python -m benchmarks.testbed_accuracy " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    models = [m for m in args.models.split(",") if m]
    if any(m not in MODELS for m in models):
        parser.error(f"unknown model in --models {args.models!r}")
    if args.from_json:
        return rewrite(args.from_json, args.output or args.from_json.with_suffix(".md"), models, command)
    args.omit = 2 if args.quick else 5
    args.seconds = args.seconds or (5 if args.quick else 20)
    # The service's own plan (probes.plan.ProbePlan's defaults) unless --quick.
    default = ProbePlan()
    args.probe_seconds, args.probe_max_seconds, args.probe_omit = (
        (5.0, 5.0, 2.0) if args.quick else (default.duration_s, default.max_duration_s, default.omit_s))
    output = args.output or ROOT / "benchmarks" / "results" / ("testbed-quick.md" if args.quick else "testbed.md")
    wanted = args.paths.split(",")
    paths = [p for p in PATHS if p.key in wanted]
    if not paths or len(paths) != len(set(wanted)):
        parser.error(f"unknown path in --paths {args.paths!r}")
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: give a whole number >= 1")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")

    signal.signal(signal.SIGTERM, _on_sigterm)
    settings = {k: getattr(args, k) for k in SETTINGS}
    started = time.monotonic()
    load_before = os.getloadavg()
    results = []

    def header() -> dict:
        load_after = os.getloadavg()
        return {"command": command, "settings": settings, "run": (
            f"Run: {time.strftime('%Y-%m-%d %H:%M %Z')}, {(time.monotonic() - started) / 60:.1f} min on "
            f"{os.cpu_count()} CPUs; load average (1/5/15 min) {' '.join(f'{x:.2f}' for x in load_before)} before, "
            f"{' '.join(f'{x:.2f}' for x in load_after)} after (other jobs share the CPUs with the delay line).")}

    with tempfile.TemporaryDirectory(prefix="tpt-accuracy-") as tmp:
        todo = [(path, number) for path in paths for number in range(1, args.runs + 1)]
        for index, (path, number) in enumerate(todo):
            name = f"acc{os.getpid() % 10000}{index}"[:12]
            results.append(PathResult(path, number))
            try:
                measure_path(results[-1], name, Path(tmp), args, models)
            except (ProbeError, RuntimeError, subprocess.TimeoutExpired, testbed.TestbedError) as exc:
                print(f"{path.key}: {exc}", file=sys.stderr, flush=True)
                results[-1].notes.append(f"measurement stopped: {exc}")
            except (KeyboardInterrupt, Terminated):
                results[-1].notes.append("interrupted (Ctrl-C or SIGTERM); the beds were removed")
                write(output, header(), models, results, final=False, measurements=True)
                raise
            # Kept after every path, so a run cut short still leaves what it measured.
            write(output, header(), models, results, final=index == len(todo) - 1, measurements=True)
    return 0


def rewrite(source: Path, output: Path, models: list[str], command: str) -> int:
    """The report of the measurements in ``source`` (a .json this script wrote), fitted again with ``models``."""
    try:
        doc = json.loads(source.read_text())
        results = [from_record(record, models) for record in doc["results"]]
        header = dict(doc["header"])
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as exc:
        print(f"testbed_accuracy: cannot read measurements from {source}: {exc}", file=sys.stderr)
        return 2
    header["command"] = f"{header['command']}`; report written again from its measurements by `{command.strip()}"
    write(output, header, models, results, final=True, measurements=False)
    return 0


def write(output: Path, header: dict, models: list[str], results: list[PathResult], final: bool,
          measurements: bool) -> None:
    """The report to ``output`` and, with ``measurements``, what was measured to the same name with .json."""
    args = argparse.Namespace(**header["settings"])
    lines = [
        "## Accuracy on the namespace test bed",
        "",
        f"Command: `{header['command'].strip()}`",
        "",
        f"Probes: `tame probe {' '.join(probe_options(args, models)[0])}` (`--model` adds the adaptive probe "
        "`tame advise` runs); each model is fitted to its own levels with the probes' losses, RTT and segment size. "
        f"Ground truth: `iperf3 -J -P n -t {args.seconds} "
        f"-O {args.omit} -C cubic`, receiver goodput; cross traffic: goodput of the cross flows (`ss` bytes_acked) "
        f"over {args.seconds - 1} s inside each transfer's measured part. Relative error = (pred − meas) / meas; "
        "predicted cross = cross(n=0) × (1 − impact(n)).",
        "",
        header["run"],
        "",
    ]
    lines += summary(results, models, args.runs)
    for result in results:
        lines += report(result, models, args.runs)
    text = "\n".join(lines)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text + "\n")
    if measurements:
        output.with_suffix(".json").write_text(json.dumps(
            {"header": header, "results": [to_record(r) for r in results]}, indent=1) + "\n")
    if final:
        print(text)
        print(f"(written to {output})", file=sys.stderr)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (KeyboardInterrupt, Terminated):
        print("interrupted; test beds removed", file=sys.stderr)
        sys.exit(130)
