"""Do a real queue's drops read as random? The loss-count dispersion `auto` reads, on namespace test beds.

    sudo .venv/bin/python -m benchmarks.studies.testbed_dispersion            # about 10 minutes
    sudo .venv/bin/python -m benchmarks.studies.testbed_dispersion --beds droptail-bdp --runs 1

`auto` weights its fair share by the probes' loss counts where the lowest probe of several streams
(10 streams) spreads its losses over its streams at least as much as Poisson counts
(:func:`models.evidence.loss_dispersion` >= :data:`models.auto.RANDOM_DROP_DISPERSION`): random drops,
as behind a RED queue. On ns-2 (Reno, 25-packet queues) a drop-tail queue read under 1 on 22 of 29
paths that could tell. This measures the same index on Linux TCP through the test bed's drop-tail
bottleneck (tbf; the kernel has no RED qdisc) and through random loss (nftables), with the service's
own probe (`tame probe --levels 10 --json`, iperf3's per-stream sender retransmissions), ``--runs``
probes per bed, and prints per probe: rate, retransmitted segments, the spread of the per-stream
counts and the index, and whether `auto` would read the drops as random.

Beds (all 40 ms RTT, probes and cross flows with the bed's congestion control):

* droptail-bdp: 50 Mbit/s, one-BDP queue (250 kB), 5 cubic cross flows (the accuracy test bed's congested path);
* droptail-small: the same with a 25-packet queue (37.9 kB), as the ns-2 scenarios' buffers;
* droptail-reno: the small queue, every sender on Reno (ns-2's TCP);
* random-loss: 100 Mbit/s, one-BDP queue, 0.1 % random loss, no cross traffic (drops that are random by construction).

Everything built lives in a private state directory and is removed on exit, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from advisor.tame import point_from_probe
from benchmarks.testbed_accuracy import CROSS_WARMUP_S, PORT, Terminated, _on_sigterm, tame_probe
from models.auto import RANDOM_DROP_DISPERSION
from models.evidence import MIN_EXPECTED_LOSSES_PER_STREAM, loss_dispersion, loss_rate
from probes import pathcheck, testbed
from probes.controls import available_controls
from probes.testbed import FRAME_BYTES

STREAMS = 10  # the level `auto` reads the index at (the lowest probe of several streams in its plan)


@dataclass(frozen=True)
class Bed:
    key: str
    title: str
    spec: testbed.TestbedSpec


BEDS = (
    Bed("droptail-bdp", "drop-tail, 50 Mbit/s, one-BDP queue (250 kB), 5 cubic cross flows",
        testbed.TestbedSpec(rate_bps=50e6, rtt_s=0.040, queue_bytes=250_000, cross_flows=5, congestion_control="cubic")),
    Bed("droptail-small", "drop-tail, 50 Mbit/s, 25-packet queue, 5 cubic cross flows",
        testbed.TestbedSpec(rate_bps=50e6, rtt_s=0.040, queue_bytes=25 * FRAME_BYTES, cross_flows=5,
                            congestion_control="cubic")),
    Bed("droptail-reno", "drop-tail, 50 Mbit/s, 25-packet queue, 5 Reno cross flows, Reno probes",
        testbed.TestbedSpec(rate_bps=50e6, rtt_s=0.040, queue_bytes=25 * FRAME_BYTES, cross_flows=5,
                            congestion_control="reno")),
    Bed("random-loss", "random loss 0.1 %, 100 Mbit/s, one-BDP queue (500 kB), no cross traffic, cubic",
        testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.040, queue_bytes=500_000, loss_rate=0.001,
                            congestion_control="cubic")),
)


def probe_bed(bed: Bed, name: str, state_dir: Path, args) -> list[dict]:
    """Build the bed, run ``args.runs`` probes of 10 streams through `tame probe --json`, tear down; one row per probe."""
    spec = replace(bed.spec, name=name)
    print(f"\n== {bed.key}: {bed.title}", file=sys.stderr, flush=True)
    tb = testbed.up(spec, state_dir=state_dir)
    try:
        if spec.cross_flows:
            time.sleep(CROSS_WARMUP_S)
        with pathcheck.iperf3_server(tb, PORT):
            options = ["--levels", str(STREAMS), "--repeats", str(args.runs), "--duration", f"{args.seconds:g}",
                       "--max-duration", f"{args.seconds:g}", "--omit", f"{args.omit:g}",
                       "--congestion-control", spec.congestion_control]
            plan = tame_probe(tb, options, args.runs * (args.seconds + args.omit + 30) + 60)
    finally:
        testbed.down(spec.name, state_dir=state_dir)
    return [probe_row(bed.key, run, probe) for run, probe in enumerate(plan.probes, start=1)]


def probe_row(bed: str, run: int, probe) -> dict:
    """What one probe says about its drops: rate (bits/s), losses, per-stream counts and the dispersion index."""
    point = point_from_probe(probe)
    index = loss_dispersion(point)
    return {
        "bed": bed, "run": run, "throughput_bps": probe.throughput_bps, "duration_s": probe.duration_s,
        "retransmits": probe.retransmits, "loss_rate": loss_rate(point),
        "stream_retransmits": list(probe.stream_retransmits), "stream_bps": list(probe.stream_bps),
        "dispersion": index,
        "reads_random": None if index is None else index >= RANDOM_DROP_DISPERSION,
    }


def table(rows: list[dict]) -> list[str]:
    """Markdown: one line per probe."""
    lines = ["| bed | run | Mbit/s | s | retransmits | % lost | per-stream retransmits (min-max) | index | random? |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        counts = r["stream_retransmits"]
        spread = f"{min(counts)}-{max(counts)}" if counts else "-"
        lost = "-" if r["loss_rate"] is None else f"{100 * r['loss_rate']:.2f}"
        index = "-" if r["dispersion"] is None else f"{r['dispersion']:.2f}"
        verdict = "too few losses" if r["reads_random"] is None else ("yes" if r["reads_random"] else "no")
        lines.append(f"| {r['bed']} | {r['run']} | {r['throughput_bps'] / 1e6:.2f} | {r['duration_s']:.0f} | "
                     f"{r['retransmits']} | {lost} | {spread} | {index} | {verdict} |")
    return lines


def by_bed(rows: list[dict]) -> list[str]:
    """Per bed: probes whose index could be read, how many read as random, and the median index."""
    lines = ["| bed | probes | index readable | read as random | median index |", "|---|---|---|---|---|"]
    for bed in dict.fromkeys(r["bed"] for r in rows):
        mine = [r for r in rows if r["bed"] == bed]
        readable = [r["dispersion"] for r in mine if r["dispersion"] is not None]
        median = f"{float(np.median(readable)):.2f}" if readable else "-"
        lines.append(f"| {bed} | {len(mine)} | {len(readable)} | {sum(x >= RANDOM_DROP_DISPERSION for x in readable)} "
                     f"| {median} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beds", default=",".join(b.key for b in BEDS),
                        help=f"which beds, comma-separated (default all: {', '.join(b.key for b in BEDS)})")
    parser.add_argument("--runs", type=int, default=3, help="10-stream probes per bed (default 3)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="measured seconds per probe (default 30, the service's probe; never extended)")
    parser.add_argument("--omit", type=float, default=5.0, help="warm-up seconds left out of each probe (default 5)")
    parser.add_argument("--output", type=Path, default=None,
                        help="also write the tables (markdown) and the rows (the same name with .json) there")
    args = parser.parse_args()
    wanted = args.beds.split(",")
    beds = [b for b in BEDS if b.key in wanted]
    if not beds or len(beds) != len(set(wanted)):
        parser.error(f"unknown bed in --beds {args.beds!r}; known: {', '.join(b.key for b in BEDS)}")
    if args.runs < 1 or args.seconds <= 0 or args.omit < 0:
        parser.error("--runs must be >= 1, --seconds > 0 and --omit >= 0")
    if any(b.spec.congestion_control not in available_controls() for b in beds):
        parser.error("a bed asks for a congestion control this kernel does not offer "
                     "(net.ipv4.tcp_available_congestion_control)")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    signal.signal(signal.SIGTERM, _on_sigterm)
    command = "sudo .venv/bin/python -m benchmarks.studies.testbed_dispersion " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tpt-dispersion-") as tmp:
        for index, bed in enumerate(beds):
            try:
                rows += probe_bed(bed, f"dsp{os.getpid() % 10000}{index}"[:12], Path(tmp), args)
            except (RuntimeError, subprocess.TimeoutExpired, testbed.TestbedError) as exc:
                print(f"{bed.key}: {exc}", file=sys.stderr, flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = [f"Command: `{command}`", "",
            f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {(time.monotonic() - started) / 60:.1f} min; load average "
            f"(1/5/15 min) at the end {load}. {STREAMS} streams, {args.seconds:g} s after {args.omit:g} s warm-up. "
            f"The index needs {MIN_EXPECTED_LOSSES_PER_STREAM} losses a stream; `auto` reads random drops at "
            f"{RANDOM_DROP_DISPERSION:g} or more.", "", *by_bed(rows), "", *table(rows)]
    print("\n".join(text))
    if args.output:
        args.output.write_text("\n".join(text) + "\n")
        args.output.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (KeyboardInterrupt, Terminated):
        sys.exit(130)
