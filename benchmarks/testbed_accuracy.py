"""Prediction accuracy on real TCP through the namespace test bed (issue 3's benchmark). Needs root.

For each of three paths (congested by 5 cross flows; loss-limited; buffer-limited) it builds the
test bed, runs the advisor's real probe plan (`tame probe`, levels 1 and 10, settle rule) from the
sender namespace, then measures the ground truth: our throughput with n = 1, 2, 4, 8, 16, 32
streams (iperf3, receiver side) and the cross traffic's throughput in the same window (an nftables
byte counter in the receiver namespace), plus the cross traffic alone (n = 0). It prints, per n,
measured vs predicted throughput and cross-traffic throughput with relative errors
((pred - meas) / meas, Lu eq. 14), and writes the tables to benchmarks/results/testbed.md.

    sudo .venv/bin/python benchmarks/testbed_accuracy.py            # ~10 minutes
    sudo .venv/bin/python benchmarks/testbed_accuracy.py --quick    # ~4 minutes, shorter runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.tame import DEFAULT_MODEL  # noqa: E402
from models.parallel import ProbePoint  # noqa: E402
from models.registry import fit  # noqa: E402
from probes import testbed  # noqa: E402
from probes.iperf_parse import parse_iperf_json  # noqa: E402

NS = (1, 2, 4, 8, 16, 32)
PORT = 5201
CROSS_WARMUP_S = 3.0
# A buffer-limited host: every socket of the path capped at 64 KB (namespaced sysctls).
SMALL_BUFFER = "4096 65536 65536"


@dataclass(frozen=True)
class Path_:
    label: str
    spec: testbed.TestbedSpec
    small_buffers: bool = False


PATHS = (
    Path_("congested: 50 Mbit/s, 40 ms, 5 cross flows",
          testbed.TestbedSpec(rate_bps=50e6, rtt_s=0.04, queue_bytes=250_000, cross_flows=5, name="bca")),
    Path_("loss-limited: 100 Mbit/s, 40 ms, 0.1 % loss",
          testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.04, queue_bytes=500_000, loss_rate=0.001, name="bcb")),
    Path_("buffer-limited: 100 Mbit/s, 40 ms, 64 KB socket buffers",
          testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.04, queue_bytes=500_000, name="bcc"), small_buffers=True),
)


def log(text: str) -> None:
    print(f"[testbed-accuracy] {text}", file=sys.stderr, flush=True)


def run(argv: list[str], timeout_s: float) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} … failed: {done.stderr.strip()[-400:]}")
    return done.stdout


def cross_counter_bytes(tb: testbed.Testbed) -> int:
    out = run(tb.exec_in(tb.receiver_ns, ["nft", "-j", "list", "table", "ip", "tptbench"]), 10)
    for item in json.loads(out)["nftables"]:
        rule = item.get("rule")
        if rule:
            for expr in rule["expr"]:
                if "counter" in expr:
                    return int(expr["counter"]["bytes"])
    raise RuntimeError("cross-traffic counter not found")


def add_cross_counter(tb: testbed.Testbed) -> None:
    for command in (["add", "table", "ip", "tptbench"],
                    ["add", "chain", "ip", "tptbench", "in", "{ type filter hook input priority 0 ; }"],
                    ["add", "rule", "ip", "tptbench", "in", "ip", "daddr", tb.cross_receiver_addr, "counter"]):
        run(tb.exec_in(tb.receiver_ns, ["nft", *command]), 10)


def cap_buffers(tb: testbed.Testbed) -> None:
    for ns in (tb.sender_ns, tb.receiver_ns):
        for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
            run(tb.exec_in(ns, ["sysctl", "-q", "-w", f"{key}={SMALL_BUFFER}"]), 10)


def measure(tb: testbed.Testbed, streams: int, seconds: float, omit_s: float) -> tuple[float, float]:
    """(our receiver throughput, cross-traffic bits/s over the same window); streams = 0: cross alone."""
    cc = tb.spec.congestion_control
    if streams == 0:
        before = cross_counter_bytes(tb)
        time.sleep(seconds)
        return 0.0, (cross_counter_bytes(tb) - before) * 8 / seconds
    argv = tb.exec_in(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-p", str(PORT), "-C", cc, "-P", str(streams),
                                     "-t", f"{seconds:g}", "-O", f"{omit_s:g}", "-J"])
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(omit_s + 0.5)  # count cross bytes while our measured window runs
    before, t0 = cross_counter_bytes(tb), time.monotonic()
    time.sleep(max(seconds - 1.0, 1.0))
    cross = (cross_counter_bytes(tb) - before) * 8 / (time.monotonic() - t0)
    out, err = process.communicate(timeout=seconds + omit_s + 60)
    if process.returncode != 0:
        raise RuntimeError(f"iperf3 -P {streams} failed: {err.strip() or out[-300:]}")
    return parse_iperf_json(out, f"{tb.receiver_addr}:{PORT}").throughput_bps, cross


def probe(tb: testbed.Testbed, duration_s: float, max_duration_s: float) -> list[ProbePoint]:
    argv = tb.exec_in(tb.sender_ns, [sys.executable, "-m", "advisor", "probe", f"{tb.receiver_addr}:{PORT}",
                                     "--levels", "1,10", "--duration", f"{duration_s:g}",
                                     "--max-duration", f"{max_duration_s:g}",
                                     "--congestion-control", tb.spec.congestion_control, "--json"])
    doc = json.loads(run(argv, 20 * max_duration_s))
    return [ProbePoint(p["streams"], p["throughput_bps"], rtt_s=p["rtt_mean_s"], retransmits=p["retransmits"],
                       duration_s=p["duration_s"]) for p in doc["probes"]]


def bench_path(path: Path_, args, models: tuple[str, ...]) -> dict:
    spec = path.spec
    log(f"{path.label}: building the test bed")
    with tempfile.TemporaryDirectory() as state_dir:
        tb = testbed.up(spec, state_dir=Path(state_dir))
        server = None
        try:
            if path.small_buffers:
                cap_buffers(tb)
            add_cross_counter(tb)
            server = subprocess.Popen(tb.exec_in(tb.receiver_ns, ["iperf3", "-s", "-B", tb.receiver_addr,
                                                                  "-p", str(PORT)]),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(CROSS_WARMUP_S)
            log(f"{path.label}: probing (levels 1, 10)")
            started = time.monotonic()
            points = probe(tb, args.probe_duration, args.probe_max_duration)
            probe_s = time.monotonic() - started
            cross0 = measure(tb, 0, args.seconds, args.omit)[1] if spec.cross_flows else None
            truth = {}
            for n in NS:
                log(f"{path.label}: ground truth, {n} streams for {args.seconds:g} s")
                truth[n] = measure(tb, n, args.seconds, args.omit)
        finally:
            if server is not None:
                server.kill()
                server.wait()
            testbed.down(spec.name, state_dir=Path(state_dir))
    fits = {name: fit(name, points) for name in models}
    return {"path": path, "points": points, "probe_s": probe_s, "cross0": cross0, "truth": truth, "fits": fits}


def table(result: dict, models: tuple[str, ...]) -> list[str]:
    path, truth, cross0 = result["path"], result["truth"], result["cross0"]
    probes = ", ".join(f"{p.streams:g}: {p.throughput_bps / 1e6:.1f} Mbit/s" for p in result["points"])
    lines = [f"### {path.label}", "", f"Probes ({result['probe_s']:.0f} s with extensions): {probes}."
             + (f" Cross traffic alone: {cross0 / 1e6:.1f} Mbit/s." if cross0 else ""), ""]
    head = "| n | measured Mbit/s | " + " | ".join(f"{m} pred (err)" for m in models)
    if cross0:
        head += " | cross measured | " + " | ".join(f"{m} cross pred (err)" for m in models)
    lines += [head + " |", "|" + "---|" * (head.count("|"))]
    errors = {m: [] for m in models}
    cross_errors = {m: [] for m in models}
    for n in NS:
        ours, cross = truth[n]
        row = f"| {n} | {ours / 1e6:.1f} | "
        cells = []
        for m in models:
            pred = float(result["fits"][m].throughput_bps(n))
            errors[m].append((pred - ours) / ours)
            cells.append(f"{pred / 1e6:.1f} ({errors[m][-1]:+.2f})")
        row += " | ".join(cells)
        if cross0:
            cells = []
            for m in models:
                pred = cross0 * (1 - float(result["fits"][m].impact(n)))
                cross_errors[m].append((pred - cross) / cross)
                cells.append(f"{pred / 1e6:.1f} ({cross_errors[m][-1]:+.2f})")
            row += f" | {cross / 1e6:.1f} | " + " | ".join(cells)
        lines.append(row + " |")
    lines.append("")
    for m in models:
        summary = f"- {m}: mean |relative error| of throughput {np.mean(np.abs(errors[m])):.3f}"
        if cross0:
            summary += f", of cross-traffic throughput {np.mean(np.abs(cross_errors[m])):.3f}"
        lines.append(summary)
    lines.append("")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 s ground-truth runs and 5 s probes")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "testbed.md")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("testbed_accuracy: needs root (network namespaces); run it with sudo", file=sys.stderr)
        return 2
    args.seconds, args.omit = (5.0, 2.0) if args.quick else (12.0, 2.0)
    args.probe_duration, args.probe_max_duration = (5.0, 20.0) if args.quick else (10.0, 40.0)
    models = tuple(dict.fromkeys((DEFAULT_MODEL, "lu", "fair_share")))
    load = os.getloadavg()[0]
    started = time.monotonic()
    lines = ["# Prediction accuracy on the namespace test bed", "",
             f"Command: `benchmarks/testbed_accuracy.py{' --quick' if args.quick else ''}`. Ground truth: iperf3, "
             f"{args.seconds:g} s after {args.omit:g} s omitted, cubic. Probes: `tame probe --levels 1,10` "
             f"({args.probe_duration:g} s, extended to {args.probe_max_duration:g} s while unsettled). "
             f"Relative error = (predicted - measured) / measured. Load average at start {load:.2f}.", ""]
    for path in PATHS:
        result = bench_path(path, args, models)
        section = table(result, models)
        print("\n".join(section), flush=True)
        lines += section
    lines.append(f"Wall clock {time.monotonic() - started:.0f} s.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    log(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
