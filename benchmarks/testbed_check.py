"""Measure a namespace test bed: RTT mean and jitter (idle and under UDP load) and TCP goodput.

    sudo .venv/bin/python -m benchmarks.testbed_check                 # 100 Mbit/s, 40 ms RTT
    sudo .venv/bin/python -m benchmarks.testbed_check --rate 50e6 --rtt 0.02 --json

Builds its own beds (unique names, private state directory), measures and
removes them (about 25 s in all). RTTs are milliseconds in the printout, rates Mbit/s
(receiver goodput).
Jitter is reported two ways: ping's mdev and p99 − p50 of the samples. Rows:

* idle: the configured path, nothing else running;
* "no queue": UDP at the full rate through the delay line, with the bottleneck raised
  tenfold so no queue forms: the delay line's own jitter at that rate;
* "queued": UDP at 80 % of the bottleneck, which iperf3 sends in bursts, so this RTT
  includes real queueing at the bottleneck (expected, not delay-line jitter).

The host's load average is printed too: the delay line shares the CPUs with everything else.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path


from probes import pathcheck, testbed

PORT = 5201


def _rtt_row(label: str, stats: pathcheck.RttStats) -> dict:
    return {"label": label, "count": len(stats.samples_s), "mean_ms": stats.mean_s * 1e3, "p50_ms": stats.p50_s * 1e3,
            "min_ms": min(stats.samples_s) * 1e3, "max_ms": max(stats.samples_s) * 1e3,
            "mdev_ms": stats.mdev_s * 1e3, "p99_minus_p50_ms": stats.jitter_s * 1e3, "loss": stats.loss_rate}


def _delay_line_lateness(state_dir: Path, name: str) -> list[str]:
    record = json.loads((state_dir / f"{name}.json").read_text())
    lines = []
    for proc in record["processes"]:
        if proc["label"].startswith("delay-"):
            os.kill(proc["pid"], signal.SIGUSR1)
    time.sleep(0.2)
    for log in sorted(state_dir.glob(f"{name}.delay-*.log")):
        reports = [l for l in log.read_text().splitlines() if "late mean" in l]
        if reports:
            lines.append(f"{log.name.split('.')[1]}: {reports[-1].removeprefix('delayline: ')}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100e6, help="bottleneck rate, bits/s (default 100e6)")
    parser.add_argument("--rtt", type=float, default=0.040, help="round-trip time, seconds (default 0.040)")
    parser.add_argument("--count", type=int, default=300, help="pings per RTT measurement (10 ms apart)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each TCP transfer, seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    spec = testbed.TestbedSpec(rate_bps=args.rate, rtt_s=args.rtt, queue_bytes=max(30_000, int(args.rate * args.rtt / 8)),
                               name=f"bench{os.getpid()}"[:12])
    # Same delay, bottleneck 10x faster: the load crosses the delay line without queueing at the bottleneck,
    # so this row is the delay line's own jitter at the full rate.
    wide = replace(spec, rate_bps=10 * args.rate, queue_bytes=10 * spec.queue_bytes, name=f"benw{os.getpid()}"[:12])
    rows, goodput, lateness = [], {}, []
    with tempfile.TemporaryDirectory(prefix="tpt-bench-") as tmp:
        state_dir = Path(tmp)
        tb = testbed.up(wide, state_dir=state_dir)
        try:
            _delay_line_lateness(state_dir, wide.name)  # reset the counters
            with pathcheck.iperf3_server(tb, PORT):
                stats = pathcheck.ping_under_udp_load(tb, PORT, args.rate, args.count, 0.01)
            rows.append(_rtt_row(f"UDP {args.rate / 1e6:g} Mbit/s, no queue", stats))
            lateness = _delay_line_lateness(state_dir, wide.name)
        finally:
            testbed.down(wide.name, state_dir=state_dir)
        tb = testbed.up(spec, state_dir=state_dir)
        try:
            rows.insert(0, _rtt_row("idle", pathcheck.ping(tb, args.count, 0.01)))
            with pathcheck.iperf3_server(tb, PORT):
                stats = pathcheck.ping_under_udp_load(tb, PORT, 0.8 * args.rate, args.count, 0.01)
                rows.append(_rtt_row("UDP 80% of rate, queued", stats))
                for streams in (1, 4):
                    goodput[streams] = pathcheck.tcp_throughput(tb, PORT, args.seconds, streams, omit_s=1.0)
        finally:
            testbed.down(spec.name, state_dir=state_dir)
    load = os.getloadavg()
    # tbf counts 1514-byte frames; TCP with timestamps carries 1448 payload bytes in each.
    ideal = args.rate * 1448 / 1514
    if args.json:
        print(json.dumps({"spec": {"rate_bps": spec.rate_bps, "rtt_s": spec.rtt_s, "queue_bytes": spec.queue_bytes},
                          "rtt": rows, "goodput_bps": goodput, "ideal_goodput_bps": ideal,
                          "delay_line": lateness, "loadavg": load}, indent=2))
        return 0
    print(f"test bed {spec.rate_bps / 1e6:g} Mbit/s, RTT {spec.rtt_s * 1e3:g} ms, queue {spec.queue_bytes} B "
          f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs)")
    print(f"{'RTT':<24} {'n':>4} {'mean':>7} {'p50':>7} {'min':>7} {'max':>7} {'mdev':>6} {'p99-p50':>8}  (ms)")
    for r in rows:
        print(f"{r['label']:<24} {r['count']:>4} {r['mean_ms']:>7.3f} {r['p50_ms']:>7.2f} {r['min_ms']:>7.2f} "
              f"{r['max_ms']:>7.2f} {r['mdev_ms']:>6.3f} {r['p99_minus_p50_ms']:>8.2f}")
    for line in lateness:
        print(f"delay line ({args.rate / 1e6:g} Mbit/s row) {line}")
    for streams, bps in goodput.items():
        print(f"TCP goodput, {streams} stream{'s' if streams > 1 else ''}: {bps / 1e6:6.2f} Mbit/s "
              f"({bps / ideal:.1%} of the {ideal / 1e6:.2f} Mbit/s a full {spec.rate_bps / 1e6:g} Mbit/s link carries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
