"""One path of the accuracy benchmark, n by n: the ground truth, a model's predictions, its probes and its advice.

The per-path rows of benchmarks/results/*/README.md say how far a model is off; this says where
and why: the probes it was fitted to (rate, RTT, share of segments lost, evidence verdict, the
index of dispersion of the streams' loss counts that tells random drops from synchronised ones), the
regime and warnings of the fit, then for every n the measured and predicted throughput and
cross-traffic impact, the link's total (ours + cross traffic) and how our per-stream rate compares
with a cross flow's (1.00: equal shares, Lu's assumption), and the advice for each budget against
the best in-budget n. It runs the same settings as the benchmark (same seeds, same probe plan),
reading the benchmark's cache and simulating what it lacks.

    python -m benchmarks.studies.explain_path 6:10                  # scenario 6, 10 cross flows, model auto
    python -m benchmarks.studies.explain_path 10:25 --model lu      # held-out scenario 10, Lu's model
    python -m benchmarks.studies.explain_path 9:15 --queue RED      # the same path with a RED bottleneck queue
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from benchmarks.accuracy import FULL, ModelScore, Settings, evaluate, score_model, sweep_index
from models.evidence import loss_dispersion, loss_limited, loss_rate
from models.registry import MODELS, model_probes
from probes.ns2 import QUEUES, SCENARIOS

ROOT = Path(__file__).resolve().parents[2]

MBPS = 1e6
VERDICT = {True: "loss-limited", False: "clean", None: "cannot tell"}


def parse_path(text: str) -> tuple[int, int]:
    """'scenario:m' -> (scenario, m)."""
    try:
        scenario, m = text.split(":")
        return int(scenario), int(m)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a path is scenario:m (e.g. 6:10), got {text!r}") from None


def fit_line(fitted) -> str:
    """The fit's throughput asymptote (the fair share's C) and competing flows M, where it has them."""
    capacity, flows = fitted.capacity_bps, fitted.params.get("competing_flows")
    return ("Fit: capacity " + ("unbounded" if capacity is None else f"{capacity / MBPS:.3f} Mbit/s")
            + ("" if flows is None else f", competing flows M = {flows:.2f}") + ".")


def explain(path, model: str, settings: Settings) -> list[str]:
    """Markdown lines describing one PathResult under one model."""
    probes = model_probes(model, path.probes, max(path.ns))
    fitted = MODELS[model](probes)
    lines = [f"## s{path.scenario} m{path.m} ({settings.queue}), model {model}: regime {fitted.regime}", ""]
    lines += [f"- warning: {w}" for w in fitted.warnings] + ([""] if fitted.warnings else [])
    lines += [fit_line(fitted), ""]
    lines += ["| probe streams | Mbit/s | per stream | RTT ms | % lost | verdict | loss dispersion |",
              "|---|---|---|---|---|---|---|"]
    for p in sorted(probes, key=lambda q: q.streams):
        lost, dispersion = loss_rate(p), loss_dispersion(p)
        lines.append(f"| {p.streams} | {p.throughput_bps / MBPS:.3f} | {p.throughput_bps / p.streams / MBPS:.3f} | "
                     f"{(p.rtt_s or 0) * 1e3:.1f} | {'' if lost is None else f'{lost:.2%}'} | "
                     f"{VERDICT[loss_limited(p)]} | {'' if dispersion is None else f'{dispersion:.2f}'} |")
    ns = np.array(path.ns, dtype=float)
    pred, impact = np.asarray(fitted.throughput_bps(ns)), np.asarray(fitted.impact(ns))
    lines += ["", f"Cross traffic alone: {path.cross0_bps / MBPS:.3f} Mbit/s.", "",
              "| n | ours Mbit/s | predicted | error | cross Mbit/s | impact | predicted impact | ours + cross Mbit/s "
              "| per stream / per cross flow |",
              "|---|---|---|---|---|---|---|---|---|"]
    for k, n in enumerate(path.ns):
        lines.append(f"| {n} | {path.ours_bps[k] / MBPS:.3f} | {pred[k] / MBPS:.3f} | "
                     f"{pred[k] / path.ours_bps[k] - 1:+.1%} | {path.cross_bps[k] / MBPS:.3f} | "
                     f"{path.true_impact[k]:.3f} | {impact[k]:.3f} | {(path.ours_bps[k] + path.cross_bps[k]) / MBPS:.3f} | "
                     f"{(path.ours_bps[k] / n) / (path.cross_bps[k] / path.m):.2f} |")
    score = ModelScore(model)
    score_model(model, path, probes, score, settings)
    lines += ["", "| budget | advised n | best in-budget n | ratio | true impact at advice |", "|---|---|---|---|---|"]
    for budget, (advised, best, ratio, _) in score.advice_by_path[0].items():
        index = sweep_index(path.ns, advised)
        lines.append(f"| {budget:g} | {advised} | {'none' if best is None else best} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} | {path.true_impact[index]:.3f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=parse_path, help="scenario:m, e.g. 6:10")
    parser.add_argument("--model", default="auto", choices=sorted(MODELS))
    parser.add_argument("--ns", help="comma-separated stream counts (default: the benchmark's 1..31)")
    parser.add_argument("--queue", default="DropTail", choices=QUEUES, help="bottleneck queue (default DropTail)")
    parser.add_argument("--cache", type=Path, default=ROOT / "benchmarks" / "cache")
    args = parser.parse_args(argv)
    unknown = sorted({s for s, _ in args.paths} - set(SCENARIOS))
    if unknown:
        parser.error(f"no scenario {', '.join(map(str, unknown))}; the scenarios are {', '.join(map(str, SCENARIOS))}")
    ns = tuple(int(x) for x in args.ns.split(",")) if args.ns else FULL["ns"]
    for scenario, m in args.paths:
        settings = Settings(scenarios=(scenario,), ms=(m,), ns=ns, models=(args.model,), queue=args.queue,
                            cache_dir=args.cache, fractional_models=())
        paths, _ = evaluate(settings)
        print("\n".join(explain(paths[0], args.model, settings)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
