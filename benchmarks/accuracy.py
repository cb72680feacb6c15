"""Accuracy benchmark on ns-2 (Lu et al. 2004, sections IV.B and V.B): every registered model vs long transfers.

For each path (scenario x m cross flows) it runs, on at most two worker processes:
  * the ground truth: a long transfer at every n (and n = 0, cross traffic alone), one seed;
  * the probes, exactly as the real probe plan does them (probes.plan.run_plan over the ns-2
    driver): the model's levels, warm-up omitted, a probe whose rate has not settled re-run twice
    as long up to the cap, with a seed of their own (so probes never reuse the ground-truth runs).
Then it fits every model in models.registry.MODELS on the probes and scores throughput (Lu Fig. 10,
12), cross traffic (Fig. 14), the advice against the best in-budget n, and what its probes cost the
path (seconds, stream-seconds, and the cross traffic they displace: :class:`ProbeCost`), and writes a
Markdown report with PNG figures.

    python -m benchmarks.accuracy --quick            # <= 5 minutes on 2 cores
    python -m benchmarks.accuracy                    # scenarios 1-6 x m 5..30 x n 1..31
    python -m benchmarks.accuracy --holdout          # scenarios 7-10 (not Lu's) x m 5,15,25 x n 1..31
    python -m benchmarks.accuracy --probe-duration 20 --probe-max-duration 40   # another probe plan

Advice is scored as the service gives it (advisor.tame.DEFAULT_MARGIN, or ``--margin``) and with
Lu's bare rule (no margin), for every model.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from advisor.tame import (DEFAULT_FRACTIONAL_MARGIN, DEFAULT_MARGIN, DEFAULT_MODEL, NO_MARGIN, ImpactMargin,
                          advise, point_from_probe)
from models.errors import FitError
from models.parallel import ProbePoint
from models.registry import MIN_LEVELS, MODELS, PROBE_LEVELS, model_probes, next_probe_level
from probes.ns2 import HELD_OUT, QUEUES, Ns2Config, Ns2Driver, parse_ns2_output, probe_result, simulate
from probes.plan import PLANS, ProbePlan, run_plan

BUDGETS = (0.05, 0.1, 0.2, 0.3)
FULL = dict(scenarios=(1, 2, 3, 4, 5, 6), ms=(5, 10, 15, 20, 25, 30), ns=tuple(range(1, 32)))
QUICK = dict(scenarios=(2, 3, 6), ms=(5, 20), ns=(1, 2, 4, 8, 16, 31))
HOLDOUT = dict(scenarios=HELD_OUT, ms=(5, 15, 25), ns=tuple(range(1, 32)))


@dataclass(frozen=True)
class Settings:
    scenarios: tuple[int, ...]
    ms: tuple[int, ...]
    ns: tuple[int, ...]
    seed: int = 1
    truth_duration_s: float = 80.0
    truth_omit_s: float = 10.0
    # The service's own probe plan unless told otherwise.
    probe_duration_s: float = ProbePlan.duration_s
    probe_omit_s: float = ProbePlan.omit_s
    probe_max_duration_s: float = ProbePlan.max_duration_s
    # The cap on an adaptive probe's streams (ProbePlan.max_adaptive_streams): None, none.
    probe_max_adaptive_streams: int | None = ProbePlan.max_adaptive_streams
    # Score a refresh of each path instead of its first probing: the fixed levels probed again at another
    # time, the adaptive probe re-used from the first probing (refresh_fixed_levels).
    reuse_adaptive: bool = False
    # Which probing of the path a probe belongs to (0 the first, 1 a later refresh): each has its own seed.
    probe_round: int = 0
    queue: str = "DropTail"
    workers: int = 2
    cache_dir: Path = ROOT / "benchmarks" / "cache"
    models: tuple[str, ...] = ()
    # Other seeds whose ground truth is the noise floor's stand-in model (seed_floor); none: no floor.
    floor_seeds: tuple[int, ...] = ()
    # The margin the advice is scored with (beside Lu's bare rule): the service's unless told otherwise.
    margin: ImpactMargin = DEFAULT_MARGIN
    # The margin the served advice's fractional stream is held against: the service's unless told otherwise.
    fractional_margin: ImpactMargin = DEFAULT_FRACTIONAL_MARGIN
    # Models whose served advice is also simulated as the transfer opens it, its fractional stream included.
    fractional_models: tuple[str, ...] = (DEFAULT_MODEL,)

    def truth_config(self, scenario: int, m: int, n: int, fractional_multiplier: float | None = None) -> Ns2Config:
        return Ns2Config(scenario, m, n, self.seed, self.truth_duration_s, self.truth_omit_s, self.queue,
                         fractional_multiplier=fractional_multiplier)

    def probe_driver(self, scenario: int, m: int) -> "RecordingNs2Driver":
        # Probes run at another time than the ground truth: a seed of their own.
        return RecordingNs2Driver(scenario, m, seed=1000 * self.seed + 7 + self.probe_round, queue=self.queue,
                                  cache_dir=self.cache_dir)

    def probe_plan(self, levels) -> ProbePlan:
        return ProbePlan(levels=tuple(levels), duration_s=self.probe_duration_s, omit_s=self.probe_omit_s,
                         max_duration_s=self.probe_max_duration_s,
                         max_adaptive_streams=self.probe_max_adaptive_streams)

    def adaptive_n_max(self, n_max: int) -> int:
        """The most streams an adaptive probe may take on a path whose advice reaches ``n_max``, under the plan's cap."""
        cap = self.probe_max_adaptive_streams
        return n_max if cap is None else min(n_max, cap)


@dataclass(frozen=True)
class ProbeRun:
    """One simulator run of a probe (extensions and retries are runs of their own): the streams, the seconds
    it lasted (``omit_s`` warm-up + ``duration_s`` measured) and the cross traffic's bits/s while measured."""

    streams: int
    duration_s: float
    omit_s: float
    cross_bps: float

    @property
    def seconds(self) -> float:
        return self.omit_s + self.duration_s


@dataclass
class RecordingNs2Driver(Ns2Driver):
    """The ns-2 driver, keeping a ProbeRun of every run it makes for the plan's cost."""

    runs: list[ProbeRun] = field(default_factory=list)

    def run(self, dest, streams, duration_s, omit_s, deadline_s, attempt=0, congestion_control=None):
        result = super().run(dest, streams, duration_s, omit_s, deadline_s, attempt, congestion_control)
        self.runs.append(ProbeRun(streams, duration_s, omit_s, parse_ns2_output(result.raw).cross_bps))
        return result


@dataclass(frozen=True)
class ProbeCost:
    """What probing one path cost: wall seconds of probing (warm-up, extensions and retries included; the idle
    RTT left out), stream-seconds (streams x seconds summed over runs) and the cross traffic displaced.

    Displaced bits: over each run, (the cross traffic alone, n = 0 of the ground truth on the same path -
    the cross traffic while the run measured) x the run's seconds, its warm-up counted at its measured
    rate; ``displaced_share`` is that over the cross traffic alone x the seconds (what the probing took
    from the cross traffic, 0-1; negative where the cross traffic happened to do better than alone).
    """

    seconds: float
    stream_seconds: float
    displaced_bits: float
    displaced_share: float

    @classmethod
    def of(cls, runs, cross0_bps: float) -> "ProbeCost":
        seconds = sum(r.seconds for r in runs)
        displaced = sum((cross0_bps - r.cross_bps) * r.seconds for r in runs)
        return cls(seconds, sum(r.streams * r.seconds for r in runs), displaced,
                   displaced / (cross0_bps * seconds) if seconds > 0 and cross0_bps > 0 else float("nan"))


def _run(config: Ns2Config, cache_dir: Path):
    run, raw = simulate(config, deadline_s=3600.0, cache_dir=cache_dir)
    return config, run, raw


def run_all(configs: list[Ns2Config], settings: Settings) -> dict:
    """Simulate every config (cached) on settings.workers processes; progress goes to stderr."""
    results, todo = {}, sorted(set(configs), key=lambda c: (-c.n * c.duration_s, c.scenario, c.m))
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=settings.workers) as pool:
        futures = [pool.submit(_run, c, settings.cache_dir) for c in todo]
        for done, future in enumerate(as_completed(futures), 1):
            config, run, raw = future.result()
            results[config] = (run, raw)
            if done % 20 == 0 or done == len(todo):
                print(f"[accuracy] {done}/{len(todo)} simulator runs, {time.monotonic() - start:.0f} s", file=sys.stderr)
    return results


@dataclass
class PathResult:
    scenario: int
    m: int
    ns: tuple[int, ...]
    ours_bps: np.ndarray
    cross_bps: np.ndarray
    cross0_bps: float
    probes: dict[int, ProbePoint] = field(default_factory=dict)
    # Every simulator run of each level's probe, extensions and retries included.
    probe_runs: dict[int, list[ProbeRun]] = field(default_factory=dict)
    # The ground truth's own long transfers read as probes, by n (for form_scores).
    truth_points: dict[int, ProbePoint] = field(default_factory=dict)

    @property
    def true_impact(self) -> np.ndarray:
        return 1.0 - self.cross_bps / self.cross0_bps

    def cross_error(self, impact) -> np.ndarray:
        """Relative error (Lu eq. 14) of the cross traffic predicted from ``impact`` (fractions 0-1 at each n of
        the sweep): the cross traffic alone x (1 - impact) against the measured, signed."""
        predicted = self.cross0_bps * (1.0 - np.asarray(impact, dtype=float))
        return (predicted - self.cross_bps) / self.cross_bps


@dataclass
class ModelScore:
    name: str
    per_path_error: list[float] = field(default_factory=list)
    per_path_scenario: list[int] = field(default_factory=list)
    error_vs_n: dict[int, list[float]] = field(default_factory=dict)
    cross_error: list[float] = field(default_factory=list)
    # Per path, the median signed relative error of the predicted cross traffic (> 0: it lost
    # more than predicted, so the impact was under-predicted).
    per_path_cross_bias: list[float] = field(default_factory=list)
    advice_ratio: dict[float, list[float]] = field(default_factory=dict)
    advice_exceeded: dict[float, list[bool]] = field(default_factory=dict)
    # The same without the advisor's margin (Lu's bare rule: predicted impact <= budget).
    advice_ratio_bare: dict[float, list[float]] = field(default_factory=dict)
    advice_exceeded_bare: dict[float, list[bool]] = field(default_factory=dict)
    # Per path, per budget, the advice as the service gives it: (advised n, best in-budget n or None,
    # true throughput ratio or None, whether the advised n truly exceeds the budget).
    advice_by_path: list[dict[float, tuple[int, int | None, float | None, bool]]] = field(default_factory=list)
    # Per path, per budget, what the served advice opens: (standard streams, FM of its fractional stream or None).
    opened_by_path: list[dict[float, tuple[int, float | None]]] = field(default_factory=list)
    # The served advice simulated as opened, its fractional stream included (score_opened): ratio and
    # over-budget per budget over paths with an in-budget n, and per path per budget (true bits/s, true impact,
    # ratio to the best in-budget whole n or None).
    advice_ratio_opened: dict[float, list[float]] = field(default_factory=dict)
    advice_exceeded_opened: dict[float, list[bool]] = field(default_factory=dict)
    # Where no whole n is within the budget (even one stream exceeds it): whether the opened advice is.
    within_opened_without_whole: list[bool] = field(default_factory=list)
    opened_outcome_by_path: list[dict[float, tuple[float, float, float | None]]] = field(default_factory=list)
    probes_used: list[int] = field(default_factory=list)
    # Per path, the stream counts of the probes the model was fitted to, and what they cost.
    probe_levels: list[tuple[int, ...]] = field(default_factory=list)
    probe_cost: list[ProbeCost] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _probe_path(scenario: int, m: int, levels: tuple[int, ...], settings: Settings):
    """Run the real probe plan on one simulated path: (probe points by level, every run of each level).

    A level's runs are all it took: the runs its extensions replaced and its attempts again after idle
    streams included.
    """
    driver = settings.probe_driver(scenario, m)
    plan = run_plan(driver, f"s{scenario}m{m}", settings.probe_plan(levels))
    runs: dict[int, list[ProbeRun]] = {}
    for run in driver.runs:
        runs.setdefault(run.streams, []).append(run)
    return scenario, m, levels, {p.streams: point_from_probe(p) for p in plan.probes}, runs


def probe_all(requests: list[tuple[int, int, tuple[int, ...]]], settings: Settings) -> dict:
    """Probe every (scenario, m, levels) through the plan on settings.workers processes."""
    results = {}
    with ProcessPoolExecutor(max_workers=settings.workers) as pool:
        futures = [pool.submit(_probe_path, s, m, levels, settings) for s, m, levels in requests]
        for future in as_completed(futures):
            s, m, levels, points, seconds = future.result()
            results[(s, m, levels)] = (points, seconds)
    print(f"[accuracy] probed {len(results)} paths through the probe plan", file=sys.stderr)
    return results


def sweep_index(ns, streams: int) -> int:
    """Index in the sorted sweep ``ns`` of the largest measured n not above ``streams`` (the sweep may not hold every n)."""
    return max(int(np.searchsorted(ns, streams, side="right")) - 1, 0)


def best_within(ns, ours_bps, impact, budget: float) -> int | None:
    """The n of the sweep ``ns`` with the most throughput among those whose impact (0-1) is within ``budget``, or None."""
    within = np.asarray(impact) <= budget
    return int(ns[int(np.argmax(np.where(within, ours_bps, -np.inf)))]) if within.any() else None


def against_best(ns, ours_bps, true_impact, budget: float, ours_at_advice: float) -> tuple[int | None, float | None]:
    """(best in-budget n of the sweep or None, true throughput at the advice (bits/s) / at that n, or None)."""
    best_n = best_within(ns, ours_bps, true_impact, budget)
    return best_n, None if best_n is None else float(ours_at_advice / ours_bps[list(ns).index(best_n)])


def advice_outcome(ns, ours_bps, true_impact, budget: float, advised: int) -> tuple[int | None, float | None, bool]:
    """How advice of ``advised`` streams fares against the truth: (best in-budget n or None, true throughput
    at the advice / at that n or None, whether the advice truly exceeds the budget)."""
    index = sweep_index(ns, advised)
    best_n, ratio = against_best(ns, ours_bps, true_impact, budget, ours_bps[index])
    return best_n, ratio, bool(true_impact[index] > budget)


def known_curve_advice(path: PathResult, ours_bps, impact, margin: ImpactMargin = NO_MARGIN) -> list[tuple[float, bool]]:
    """Advice of a model that knows a curve (our bits/s and impact 0-1 at each n of the path's sweep), scored
    against the path's truth: (true throughput / best in-budget, whether over budget) for each budget that
    has an in-budget n. It advises the curve's best n whose impact raised by ``margin`` is within the
    budget (Lu's bare rule with no margin), one stream if none."""
    outcomes = []
    bound = np.asarray(margin.bound(np.clip(impact, 0.0, 1.0)))
    for budget in BUDGETS:
        advised = best_within(path.ns, ours_bps, bound, budget) or 1
        _, ratio, over = advice_outcome(path.ns, path.ours_bps, path.true_impact, budget, advised)
        if ratio is not None:
            outcomes.append((ratio, over))
    return outcomes


def score_model(name: str, path: PathResult, probes: list[ProbePoint], score: ModelScore, settings: Settings) -> None:
    """Add one path's errors for one model to its score."""
    try:
        fitted = MODELS[name](probes)
    except FitError as exc:
        score.failures.append(f"s{path.scenario} m{path.m}: {exc}")
        return
    ns = np.array(path.ns, dtype=float)
    pred = np.asarray(fitted.throughput_bps(ns))
    rel = (pred - path.ours_bps) / path.ours_bps
    score.per_path_error.append(float(np.mean(np.abs(rel))))
    score.per_path_scenario.append(path.scenario)
    for n, e in zip(path.ns, rel):
        score.error_vs_n.setdefault(n, []).append(float(e))
    cross_rel = path.cross_error(fitted.impact(ns))
    score.cross_error.extend(cross_rel.tolist())
    score.per_path_cross_bias.append(float(np.median(cross_rel)))
    by_budget, opened = {}, {}
    for budget in BUDGETS:
        for as_served, margin, ratios, exceeded in (
                (True, settings.margin, score.advice_ratio, score.advice_exceeded),
                (False, NO_MARGIN, score.advice_ratio_bare, score.advice_exceeded_bare)):
            advice = advise(fitted, budget, n_max=max(path.ns), margin=margin,
                            fractional_margin=settings.fractional_margin if as_served else NO_MARGIN)
            advised = advice.num_flows
            best_n, ratio, over = advice_outcome(path.ns, path.ours_bps, path.true_impact, budget, advised)
            if as_served:
                by_budget[budget] = (advised, best_n, ratio, over)
                opened[budget] = advice.opened_streams()
            if ratio is not None:
                ratios.setdefault(budget, []).append(ratio)
                exceeded.setdefault(budget, []).append(over)
    score.advice_by_path.append(by_budget)
    score.opened_by_path.append(opened)
    score.probes_used.append(len(probes))
    score.probe_levels.append(tuple(p.streams for p in probes))
    score.probe_cost.append(ProbeCost.of([r for p in probes for r in path.probe_runs.get(p.streams, ())],
                                         path.cross0_bps))


def evaluate(settings: Settings) -> tuple[list[PathResult], dict[str, ModelScore]]:
    """Run (or read from cache) every simulation the settings need and score every model."""
    models = settings.models or tuple(MODELS)
    first_levels = sorted({lvl for name in models for lvl in PROBE_LEVELS[name]})
    configs = []
    for s in settings.scenarios:
        for m in settings.ms:
            configs += [settings.truth_config(s, m, n) for n in (0, *settings.ns)]
    runs = run_all(configs, settings)
    probed = probe_all([(s, m, tuple(first_levels)) for s in settings.scenarios for m in settings.ms], settings)
    probed = {(s, m): value for (s, m, _), value in probed.items()}
    paths = []
    for s in settings.scenarios:
        for m in settings.ms:
            truth = [runs[settings.truth_config(s, m, n)][0] for n in settings.ns]
            path = PathResult(
                s, m, settings.ns,
                ours_bps=np.array([r.ours_bps for r in truth]),
                cross_bps=np.array([r.cross_bps for r in truth]),
                cross0_bps=runs[settings.truth_config(s, m, 0)][0].cross_bps,
                truth_points={n: point_from_probe(probe_result(r, f"s{s}m{m}", n, settings.truth_omit_s))
                              for n, r in zip(settings.ns, truth)},
            )
            points, probe_runs = probed[(s, m)]
            path.probes.update(points)
            path.probe_runs.update(probe_runs)
            paths.append(path)
    # Adaptive plans pick a further level from the first probes; those runs are made now.
    extra = set()
    for path in paths:
        for name in models:
            level = next_probe_level(name, [path.probes[n] for n in PROBE_LEVELS[name]],
                                     settings.adaptive_n_max(max(settings.ns)))
            if level is not None and level not in path.probes:
                extra.add((path.scenario, path.m, (level,)))
    if extra:
        for (s, m, _), (points, probe_runs) in probe_all(sorted(extra), settings).items():
            path = next(p for p in paths if p.scenario == s and p.m == m)
            path.probes.update(points)
            path.probe_runs.update(probe_runs)
    if settings.reuse_adaptive:
        refresh_fixed_levels(paths, tuple(first_levels), settings)
    scores = score_paths(paths, settings)
    score_opened(paths, scores, settings)
    return paths, scores


def refresh_fixed_levels(paths: list[PathResult], levels: tuple[int, ...], settings: Settings) -> None:
    """Each path probed again later (the next probe round's seed) at the fixed ``levels`` only, the adaptive
    probe kept from the first probing: a refresh that re-uses the last fit's third probe. The fresh probes
    replace the first ones, and the cost counts them alone."""
    fresh = probe_all([(p.scenario, p.m, levels) for p in paths], replace(settings, probe_round=settings.probe_round + 1))
    for path in paths:
        points, runs = fresh[(path.scenario, path.m, levels)]
        path.probes.update(points)
        path.probe_runs = {n: runs.get(n, []) for n in path.probe_runs}


def score_paths(paths: list[PathResult], settings: Settings) -> dict[str, ModelScore]:
    """Every model of the settings fitted to each path's probes and scored (the paths hold every probe they need)."""
    models = settings.models or tuple(MODELS)
    scores = {name: ModelScore(name) for name in models}
    for path in paths:
        for name in models:
            probes = model_probes(name, path.probes, settings.adaptive_n_max(max(path.ns)))
            if len({p.streams for p in probes}) < MIN_LEVELS[name]:
                scores[name].failures.append(f"s{path.scenario} m{path.m}: too few probe levels")
                continue
            score_model(name, path, probes, scores[name], settings)
    return scores


def score_opened(paths: list[PathResult], scores: dict[str, ModelScore], settings: Settings) -> None:
    """The served advice of ``settings.fractional_models`` simulated as the transfer opens it.

    Advice of n* = 2.4 TCP-equivalent streams opens 2 standard streams and one fractional stream of FM
    1/0.4^2 (advisor.advice.Advice.opened_streams); the sweep has only whole n, so each such advice is a
    ground-truth run of its own (the same seed, length and warm-up, the fractional stream one more flow of
    ours: probes.ns2.Ns2Config.fractional_multiplier). Scored against the same best in-budget whole n.
    """
    wanted = [name for name in settings.fractional_models if name in scores and not scores[name].failures]
    configs = {(p.scenario, p.m, streams, fm) for name in wanted for p, opened in zip(paths, scores[name].opened_by_path)
               for streams, fm in opened.values() if fm is not None}
    runs = run_all([settings.truth_config(s, m, n, fm) for s, m, n, fm in configs], settings) if configs else {}
    for name in wanted:
        score = scores[name]
        for path, opened in zip(paths, score.opened_by_path):
            outcome = {}
            for budget, (streams, fm) in opened.items():
                if fm is None:
                    index = sweep_index(path.ns, streams)
                    ours, impact = float(path.ours_bps[index]), float(path.true_impact[index])
                else:
                    run = runs[settings.truth_config(path.scenario, path.m, streams, fm)][0]
                    ours, impact = run.ours_bps, 1.0 - run.cross_bps / path.cross0_bps
                _, ratio = against_best(path.ns, path.ours_bps, path.true_impact, budget, ours)
                outcome[budget] = (ours, impact, ratio)
                if ratio is not None:
                    score.advice_ratio_opened.setdefault(budget, []).append(ratio)
                    score.advice_exceeded_opened.setdefault(budget, []).append(impact > budget)
                else:
                    score.within_opened_without_whole.append(impact <= budget)
            score.opened_outcome_by_path.append(outcome)


def form_scores(paths: list[PathResult], settings: Settings) -> dict[str, ModelScore]:
    """Every model fitted to the ground truth's own runs at its probe levels, scored like the probes' fits.

    No probe noise enters: what is left is the error of the model's form between and beyond its
    levels (and, for 'auto', of its reading of the evidence). Paths whose sweep lacks one of the
    model's levels are left out.
    """
    models = settings.models or tuple(MODELS)
    scores = {name: ModelScore(name) for name in models}
    for path in paths:
        for name in models:
            try:
                points = model_probes(name, path.truth_points, settings.adaptive_n_max(max(path.ns)))
            except KeyError:
                continue
            score_model(name, path, points, scores[name], settings)
    return scores


def _advice_figures(advice: list[tuple[float, bool]]) -> tuple[float, float]:
    """Median true-throughput ratio and share over budget of (ratio, over budget) outcomes; nan if none."""
    if not advice:
        return float("nan"), float("nan")
    return float(np.median([r for r, _ in advice])), float(np.mean([o for _, o in advice]))


def _floor_row(per_path: list[float], cross: list[float], advice: list[tuple[float, bool]],
               advice_with_margin: list[tuple[float, bool]], scenarios: list[int]) -> dict:
    """Headline figures of a perfect-model stand-in: per-path throughput errors, cross-traffic errors and
    its advice's (true throughput ratio to the best in-budget n, whether over budget) per path and budget,
    under Lu's bare rule and with the margin."""
    by_scenario = {}
    for s, e in zip(scenarios, per_path):
        by_scenario.setdefault(s, []).append(e)
    adv, exc = _advice_figures(advice)
    adv_margin, exc_margin = _advice_figures(advice_with_margin)
    return {"per_path": list(per_path), "adv_all": adv, "exc_all": exc,
            "adv_margin_all": adv_margin, "exc_margin_all": exc_margin,
            "thr_median": float(np.median(per_path)), "thr_p90": float(np.quantile(per_path, 0.9)),
            "cross_p50": float(np.median(cross)), "cross_p90": float(np.quantile(cross, 0.9)),
            "thr_median_by_scenario": {s: float(np.median(v)) for s, v in sorted(by_scenario.items())},
            "thr_max_by_scenario": {s: float(np.max(v)) for s, v in sorted(by_scenario.items())}}


def seed_floor(paths: list[PathResult], settings: Settings) -> dict:
    """How well other seeds' ground truth predicts this seed's: the noise no model fed by probes can beat.

    The probes run with a seed of their own, so nothing in them tells which start times the ground
    truth's seed drew; the best any model can do is the path's expected curve. For every path the
    long transfers at every n are run again with each of ``settings.floor_seeds`` and scored as a
    model: their per-n median ("out of sample": it has not seen this seed; with one seed, that seed's
    curve, an over-estimate of the best error by about sqrt(2) for Gaussian noise), and the per-n
    median of those seeds together with this one ("in sample": it has seen the run it is scored
    against, so it under-estimates the best error). The expected curve's error lies between the two.
    """
    def other_seed(p: PathResult, n: int, seed: int) -> Ns2Config:
        return replace(settings.truth_config(p.scenario, p.m, n), seed=seed)

    seeds = settings.floor_seeds
    runs = run_all([other_seed(p, n, seed) for p in paths for n in (0, *p.ns) for seed in seeds], settings)
    errors = {"out_of_sample": ([], [], [], []), "in_sample": ([], [], [], [])}
    for p in paths:
        others = [[runs[other_seed(p, n, seed)][0] for n in p.ns] for seed in seeds]
        others_ours = np.array([[r.ours_bps for r in seed_runs] for seed_runs in others])
        others_cross = np.array([[r.cross_bps for r in seed_runs] for seed_runs in others])
        others_cross0 = np.array([runs[other_seed(p, 0, seed)][0].cross_bps for seed in seeds])
        for kind, ours, cross, cross0 in (
                ("out_of_sample", others_ours, others_cross, others_cross0),
                ("in_sample", np.vstack([others_ours, p.ours_bps]), np.vstack([others_cross, p.cross_bps]),
                 np.append(others_cross0, p.cross0_bps))):
            per_path, cross_errors, advice, advice_with_margin = errors[kind]
            ours, cross = np.median(ours, axis=0), np.median(cross, axis=0)
            per_path.append(float(np.mean(np.abs(ours / p.ours_bps - 1))))
            cross_errors.extend(np.abs(cross / p.cross_bps - 1).tolist())
            impact = 1.0 - cross / float(np.median(cross0))
            advice.extend(known_curve_advice(p, ours, impact))
            advice_with_margin.extend(known_curve_advice(p, ours, impact, settings.margin))
    scenarios = [p.scenario for p in paths]
    return {"seeds": tuple(seeds), **_floor_row(*errors["out_of_sample"], scenarios),
            "in_sample": _floor_row(*errors["in_sample"], scenarios)}


def _mean(values) -> float:
    """Mean of ``values``, nan if there are none."""
    values = list(values)
    return float(np.mean(values)) if values else float("nan")


def summary(scores: dict[str, ModelScore]) -> dict[str, dict[str, float]]:
    """The headline numbers of each model (the goals of issue 5 are stated against these)."""
    rows = {}
    for name, sc in scores.items():
        per_path = np.array(sc.per_path_error)
        cross = np.abs(np.array(sc.cross_error))
        row = {
            "paths": len(per_path),
            "thr_median": float(np.median(per_path)) if per_path.size else float("nan"),
            "thr_p90": float(np.quantile(per_path, 0.9)) if per_path.size else float("nan"),
            "cross_p50": float(np.median(cross)) if cross.size else float("nan"),
            "cross_p90": float(np.quantile(cross, 0.9)) if cross.size else float("nan"),
            "probes": float(np.mean(sc.probes_used)) if sc.probes_used else float("nan"),
            # Per path, mean over paths: seconds, stream-seconds, displaced Mbit and share (ProbeCost).
            "probe_s": _mean(c.seconds for c in sc.probe_cost),
            "probe_stream_s": _mean(c.stream_seconds for c in sc.probe_cost),
            "displaced_mbit": _mean(c.displaced_bits / 1e6 for c in sc.probe_cost),
            "displaced_share": _mean(c.displaced_share for c in sc.probe_cost),
            "displaced_share_p90": (float(np.quantile([c.displaced_share for c in sc.probe_cost], 0.9))
                                    if sc.probe_cost else float("nan")),
            "failures": len(sc.failures),
        }
        for suffix, ratios, exceeded in (("", sc.advice_ratio, sc.advice_exceeded),
                                         ("_bare", sc.advice_ratio_bare, sc.advice_exceeded_bare),
                                         ("_opened", sc.advice_ratio_opened, sc.advice_exceeded_opened)):
            for budget in BUDGETS:
                r, e = ratios.get(budget, []), exceeded.get(budget, [])
                row[f"adv{suffix}_{budget}"] = float(np.median(r)) if r else float("nan")
                row[f"exc{suffix}_{budget}"] = float(np.mean(e)) if e else float("nan")
            every_r = [x for b in BUDGETS for x in ratios.get(b, [])]
            every_e = [x for b in BUDGETS for x in exceeded.get(b, [])]
            row[f"adv{suffix}_all"] = float(np.median(every_r)) if every_r else float("nan")
            row[f"exc{suffix}_all"] = float(np.mean(every_e)) if every_e else float("nan")
        row["without_whole"] = len(sc.within_opened_without_whole)
        row["within_opened_without_whole"] = sum(sc.within_opened_without_whole)
        scenarios = sorted(set(sc.per_path_scenario))
        row["by_scenario"] = {s: float(np.median([e for e, t in zip(sc.per_path_error, sc.per_path_scenario) if t == s]))
                              for s in scenarios}
        advice_by_scenario = {}
        for by_budget, scenario in zip(sc.advice_by_path, sc.per_path_scenario):
            advice_by_scenario.setdefault(scenario, []).extend(r for _, _, r, _ in by_budget.values() if r is not None)
        row["adv_by_scenario"] = {s: float(np.median(v)) for s, v in sorted(advice_by_scenario.items()) if v}
        rows[name] = row
    return rows


def margin_arg(text: str) -> ImpactMargin:
    """``RELATIVE,ABSOLUTE`` (fractions, e.g. 0.15,0.02) as an ImpactMargin; argparse reports a bad one."""
    try:
        relative, absolute = (float(x) for x in text.split(","))
        return ImpactMargin(relative, absolute)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected RELATIVE,ABSOLUTE as two numbers >= 0, e.g. 0.15,0.02; got {text!r} ({exc})") from None


def argument_parser(**kwargs) -> argparse.ArgumentParser:
    """The benchmark's options; ``kwargs`` go to ArgumentParser (``add_help=False`` to use it as a parent)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], **kwargs)
    parser.add_argument("--quick", action="store_true", help="scenarios 2,3,6 x m 5,20 x n 1,2,4,8,16,31")
    parser.add_argument("--holdout", action="store_true",
                        help="the held-out scenarios 7-10 (not in Lu's Fig. 2) x m 5,15,25 x n 1..31")
    parser.add_argument("--scenarios", help="comma-separated scenario numbers (overrides the preset)")
    parser.add_argument("--ms", help="comma-separated cross-flow counts (overrides the preset)")
    parser.add_argument("--ns", help="comma-separated stream counts (overrides the preset)")
    parser.add_argument("--models", help="comma-separated model names (default: all registered)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--truth-duration", type=float, default=80.0, help="ground-truth seconds measured")
    parser.add_argument("--truth-omit", type=float, default=10.0, help="ground-truth warm-up seconds")
    parser.add_argument("--plan", choices=sorted(PLANS), default="standard",
                        help="the named probe plan (probes.plan.PLANS) whose durations and adaptive cap the probes "
                             "take unless the options below say otherwise (default: standard, the service's)")
    parser.add_argument("--probe-duration", type=float, help="probe seconds measured (default: the plan's)")
    parser.add_argument("--probe-max-duration", type=float,
                        help="longest a probe is extended to while its rate has not settled (default: the plan's)")
    parser.add_argument("--probe-omit", type=float, help="probe warm-up seconds (default: the plan's)")
    parser.add_argument("--probe-max-adaptive", type=int, metavar="STREAMS",
                        help="cap the adaptive probe's streams (default: the plan's; 0 for no cap)")
    parser.add_argument("--probe-round", type=int, default=0, metavar="R",
                        help="probe each path as at another time: the probes' seeds shifted by R (default 0), the "
                             "ground truth unchanged; plans compared over several rounds tell their difference "
                             "from the probes' own noise")
    parser.add_argument("--reuse-adaptive", action="store_true",
                        help="score a refresh: the fixed levels probed again at another time, the adaptive probe "
                             "re-used from the first probing (the cost counts the fresh probes alone)")
    parser.add_argument("--queue", default="DropTail", choices=QUEUES)
    parser.add_argument("--floor-seed", metavar="SEED[,SEED...]",
                        help="also run the ground truth with these seeds and report how well their per-n median "
                             "predicts seed --seed's (the noise floor no model fed by probes can beat)")
    parser.add_argument("--margin", type=margin_arg, default=DEFAULT_MARGIN, metavar="RELATIVE,ABSOLUTE",
                        help="score the advice with this margin for the impact's error instead of the service's "
                             f"({DEFAULT_MARGIN.relative:g},{DEFAULT_MARGIN.absolute:g}): a predicted impact i "
                             "counts as i (1 + RELATIVE) + ABSOLUTE")
    parser.add_argument("--fractional-margin", type=margin_arg, default=DEFAULT_FRACTIONAL_MARGIN,
                        metavar="RELATIVE,ABSOLUTE",
                        help="hold the served advice's fractional stream against this margin instead of the "
                             f"service's ({DEFAULT_FRACTIONAL_MARGIN.relative:g},{DEFAULT_FRACTIONAL_MARGIN.absolute:g})")
    parser.add_argument("--fractional-models", default=DEFAULT_MODEL, metavar="MODEL[,MODEL...]",
                        help="models whose served advice is also simulated as the transfer opens it, its fractional "
                             f"stream included (default {DEFAULT_MODEL}, the service's; 'none' for none)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=ROOT / "benchmarks" / "cache")
    parser.add_argument("--out", type=Path, help="report directory (default benchmarks/results/quick or full)")
    return parser


def settings_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Settings, Path]:
    """The run's settings and report directory from options parsed by a parser built on :func:`argument_parser`."""
    if args.quick and args.holdout:
        parser.error("--quick and --holdout are different presets; give one")
    if args.probe_round < 0:
        parser.error(f"--probe-round must be 0 or more, got {args.probe_round}")
    preset = QUICK if args.quick else HOLDOUT if args.holdout else FULL
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    plan = PLANS[args.plan]
    given = lambda value, default: default if value is None else value  # noqa: E731
    cap = given(args.probe_max_adaptive, plan.max_adaptive_streams)
    settings = Settings(
        scenarios=ints(args.scenarios) if args.scenarios else preset["scenarios"],
        ms=ints(args.ms) if args.ms else preset["ms"],
        ns=ints(args.ns) if args.ns else preset["ns"],
        seed=args.seed,
        truth_duration_s=args.truth_duration,
        truth_omit_s=args.truth_omit,
        probe_duration_s=given(args.probe_duration, plan.duration_s),
        probe_max_duration_s=given(args.probe_max_duration, plan.max_duration_s),
        probe_omit_s=given(args.probe_omit, plan.omit_s),
        probe_max_adaptive_streams=cap or None,
        reuse_adaptive=args.reuse_adaptive,
        probe_round=args.probe_round,
        queue=args.queue,
        workers=max(1, min(args.workers, 2)),
        cache_dir=args.cache,
        models=tuple(args.models.split(",")) if args.models else (),
        floor_seeds=ints(args.floor_seed) if args.floor_seed else (),
        margin=args.margin,
        fractional_margin=args.fractional_margin,
        fractional_models=() if args.fractional_models == "none" else tuple(args.fractional_models.split(",")),
    )
    unknown = sorted(set(settings.fractional_models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model in --fractional-models: {', '.join(unknown)}; known: {', '.join(sorted(MODELS))}, "
                     "or 'none'")
    out = args.out or ROOT / "benchmarks" / "results" / ("quick" if args.quick else "holdout" if args.holdout else "full")
    return settings, out


def parse_args(argv=None) -> tuple[Settings, Path]:
    """The run's settings and report directory from the command line."""
    parser = argument_parser()
    return settings_from(parser.parse_args(argv), parser)


def main(argv=None) -> int:
    from benchmarks.accuracy_report import write_report

    settings, out = parse_args(argv)
    start = time.monotonic()
    paths, scores = evaluate(settings)
    rows = summary(scores)
    floor = seed_floor(paths, settings) if settings.floor_seeds else None
    form = summary(form_scores(paths, settings))
    elapsed = time.monotonic() - start
    command = " ".join(["python -m benchmarks.accuracy", *map(shlex.quote, sys.argv[1:])])
    write_report(out, settings, paths, scores, rows, elapsed, command, floor, form)
    for name, row in rows.items():
        print(f"{name:>10}: thr median {row['thr_median']:.3f} p90 {row['thr_p90']:.3f}  "
              f"cross p50 {row['cross_p50']:.3f} p90 {row['cross_p90']:.3f}  "
              f"advice (all budgets) {row['adv_all']:.2f} exceeded {row['exc_all']:.0%} "
              f"[bare rule {row['adv_bare_all']:.2f}, {row['exc_bare_all']:.0%}]  "
              + ("" if np.isnan(row["adv_opened_all"]) else
                 f"[opened with its fractional stream {row['adv_opened_all']:.2f}, {row['exc_opened_all']:.0%}]  ")
              + f"probes {row['probes']:.1f} ({row['probe_s']:.0f} s, {row['probe_stream_s']:.0f} stream-s, "
              f"displaced {row['displaced_mbit']:.0f} Mbit = {row['displaced_share']:.0%} of the cross traffic)")
    if floor is not None:
        for label, row in ((f"seed(s) {','.join(map(str, floor['seeds']))} as a model", floor),
                           ("the same with this seed's in the median", floor["in_sample"])):
            print(f"{label}: thr median {row['thr_median']:.3f} p90 {row['thr_p90']:.3f}  "
                  f"cross p50 {row['cross_p50']:.3f} p90 {row['cross_p90']:.3f}  "
                  f"advice (all budgets) {row['adv_all']:.2f} exceeded {row['exc_all']:.0%} "
                  f"[with the margin {row['adv_margin_all']:.2f}, {row['exc_margin_all']:.0%}]  "
                  f"by scenario (median/max) " + ", ".join(
                      f"s{s} {v:.3f}/{row['thr_max_by_scenario'][s]:.3f}" for s, v in row["thr_median_by_scenario"].items()))
    print(f"report: {out / 'README.md'} ({elapsed:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
