"""How a probe's error against the ground truth changes with its length, and how far the truth itself moves with the seed.

For each path (scenario, m cross flows) and stream count n, one probe run of the accuracy
benchmark's probe driver (its seed, its 2 s warm-up) is made for each length, with no settle rule
or extension, and compared with the benchmark's ground truth at the same n (80 s after 10 s
warm-up, seed 1): (probe rate / truth rate) - 1. It shows whether a longer probe would close a
gap the probe table of benchmarks/results/*/README.md reports. The last columns run the same
long transfer with other seeds: (their rate / seed 1's) - 1, the spread of the truth itself.
Runs are cached like the benchmark's.

    python -m benchmarks.studies.probe_length                               # s1 and s7 (lock-out), s6
    python -m benchmarks.studies.probe_length --path 7:25:5,10,31 --lengths 10,60,120
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.accuracy import FULL, Settings, simulate
from models.single_flow import BITS_PER_BYTE

ROOT = Path(__file__).resolve().parents[2]

# Lock-out paths (s1, s7) and s6, whose fair-share probes miss the ground truth by up to 40 %.
DEFAULT_PATHS = ("1:15:5,10,31", "1:25:5,10,31", "7:5:10,31", "7:25:5,10,31", "6:15:10", "6:20:10", "6:30:5")


def parse_path(text: str) -> tuple[int, int, tuple[int, ...]]:
    """'scenario:m:n1,n2,...' -> (scenario, m, (n1, n2, ...))."""
    try:
        scenario, m, ns = text.split(":")
        return int(scenario), int(m), tuple(int(n) for n in ns.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a path is scenario:m:n1,n2,... (e.g. 7:25:5,10,31), got {text!r}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="append", type=parse_path, help="scenario:m:n1,n2,... (repeatable)")
    parser.add_argument("--lengths", default="10,20,40,60", help="probe lengths in seconds, comma-separated")
    parser.add_argument("--truth-seeds", default="2,3,4,5", help="other seeds for the ground truth, comma-separated")
    parser.add_argument("--cache", type=Path, default=ROOT / "benchmarks" / "cache")
    args = parser.parse_args(argv)
    paths = args.path or [parse_path(p) for p in DEFAULT_PATHS]
    lengths = [float(x) for x in args.lengths.split(",")]
    seeds = [int(x) for x in args.truth_seeds.split(",")] if args.truth_seeds else []
    settings = Settings(**FULL, cache_dir=args.cache)
    print("| path | n | window (segments) | " + " | ".join(f"probe {d:g} s" for d in lengths)
          + "".join(f" | truth seed {k}" for k in seeds) + " |")
    print("|---" * (3 + len(lengths) + len(seeds)) + "|")
    for scenario, m, ns in paths:
        driver = settings.probe_driver(scenario, m)
        for n in ns:
            truth, _ = simulate(settings.truth_config(scenario, m, n), deadline_s=3600.0, cache_dir=args.cache)
            cells, last = [], None
            for length in lengths:
                last = driver.run(f"s{scenario}m{m}", n, length, settings.probe_omit_s, deadline_s=3600.0)
                cells.append(f"{last.throughput_bps / truth.ours_bps - 1:+.0%}")
            # Segments in flight per stream in the longest probe: below 4 a loss waits for a timeout.
            window = last.throughput_bps / n * (last.rtt_mean_s or 0.0) / (BITS_PER_BYTE * last.mss_bytes)
            for seed in seeds:
                other, _ = simulate(replace(settings.truth_config(scenario, m, n), seed=seed), deadline_s=3600.0,
                                    cache_dir=args.cache)
                cells.append(f"{other.ours_bps / truth.ours_bps - 1:+.0%}")
            print(f"| s{scenario} m{m} | {n} | {window:.1f} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
