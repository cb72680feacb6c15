"""Markdown + PNG report of the accuracy benchmark (benchmarks.accuracy)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from advisor.tame import DEFAULT_MARGIN, DEFAULT_MODEL  # noqa: E402

BUDGETS = (0.05, 0.1, 0.2, 0.3)


def margin_text(margin) -> str:
    """How the report names the margin the advice was scored with."""
    text = f"x {1 + margin.relative:g} + {margin.absolute:g}"
    if margin == DEFAULT_MARGIN:
        return f"advisor.tame.DEFAULT_MARGIN, {text}"
    return f"--margin {margin.relative:g},{margin.absolute:g}: {text}"


def _save(fig, ax, path: Path) -> None:
    """Grid, legend, tight layout; write the PNG and free the figure."""
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _fig_per_path(path: Path, scores) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, sc in scores.items():
        x = np.sort(sc.per_path_error)
        if x.size:
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=name)
    ax.set_xlabel("per-path mean |relative error| of throughput (Lu Fig. 10)")
    ax.set_ylabel("fraction of paths")
    ax.set_xlim(0, 1)
    _save(fig, ax, path)


def _fig_vs_n(path: Path, scores) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, sc in scores.items():
        ns = sorted(sc.error_vs_n)
        if ns:
            ax.plot(ns, [np.mean(sc.error_vs_n[n]) for n in ns], marker="o", ms=3, label=name)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("parallel streams n")
    ax.set_ylabel("mean relative error (signed, Lu Fig. 12)")
    _save(fig, ax, path)


def _fig_cross(path: Path, scores) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, sc in scores.items():
        x = np.sort(sc.cross_error)
        if x.size:
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=name)
    ax.set_xlabel("relative error of predicted cross-traffic throughput (Lu Fig. 14)")
    ax.set_ylabel("CDF")
    ax.set_xlim(-1, 1)
    _save(fig, ax, path)


def _fig_paths(path: Path, paths) -> None:
    cols = min(len(paths), 6)
    rows = int(np.ceil(len(paths) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.2 * rows), squeeze=False)
    for ax, p in zip(axes.flat, paths):
        ax.plot(p.ns, p.ours_bps / 1e6, label="ours")
        ax.plot(p.ns, p.cross_bps / 1e6, label="cross")
        ax.axhline(p.cross0_bps / 1e6, color="gray", ls=":", lw=1)
        ax.set_title(f"s{p.scenario} m={p.m}", fontsize=8)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(paths):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("n", fontsize=8)
    fig.supylabel("Mb/s (ground truth)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _probe_table(paths) -> list[str]:
    """Each probe against the ground truth at its own n, with the evidence 'auto' reads from it."""
    from models.evidence import loss_dispersion, loss_limited, loss_rate, reno_fraction

    lines = [
        "## Probes against the ground truth",
        "",
        "Per probe: streams, seconds measured, (probe rate / long-transfer rate at the same n) - 1 "
        "(blank when the sweep has no such n), the streams' rate as a fraction of their Reno rate (Padhye, T0 = 1 s) "
        "(0: no losses), the verdict of models.evidence.loss_limited (L: loss-limited, c: clean, ?: "
        "cannot tell) and the share of segments retransmitted (models.evidence.loss_rate; 'auto' takes the "
        "timeout regime above 2.3 % at the lowest probe), and for probes of several streams with enough "
        "losses the index of dispersion of their streams' loss counts (models.evidence.loss_dispersion; "
        "'auto' weights its fair share by loss counts when the lowest such probe's is 1 or more: random drops).",
        "",
        "| path | probes |",
        "|---|---|",
    ]
    for p in paths:
        cells = []
        for n in sorted(p.probes):
            point = p.probes[n]
            error = ""
            if n in p.ns:
                error = f" {point.throughput_bps / p.ours_bps[p.ns.index(n)] - 1:+.0%}"
            fraction = reno_fraction(point)
            verdict = {True: "L", False: "c", None: "?"}[loss_limited(point)]
            lost = loss_rate(point)
            dispersion = loss_dispersion(point)
            cells.append(f"{n}: {point.duration_s:.0f} s{error}, "
                         f"{'' if fraction is None else f'{fraction:.2f} '}{verdict}"
                         f"{'' if lost is None else f', {lost:.1%} lost'}"
                         f"{'' if dispersion is None else f', dispersion {dispersion:.2f}'}")
        lines.append(f"| s{p.scenario} m{p.m} | " + "; ".join(cells) + " |")
    return lines + [""]


def _scenario_cells(row, scenarios, key: str = "by_scenario", fmt: str = "{:.3f}") -> str:
    """A summary row's per-scenario medians (row[key]) as Markdown cells (blank where the model has none)."""
    return " | ".join(fmt.format(row[key][s]) if s in row[key] else "" for s in scenarios)


def _per_path_table(title: str, note: str, paths, scores, values_of, fmt: str) -> list[str]:
    """A Markdown table: one row per path, one column per model, cells values_of(score)[path index]."""
    lines = ["", f"## {title}", ""] + ([note, ""] if note else []) + [
        "| path | " + " | ".join(scores) + " |",
        "|---" * (len(scores) + 1) + "|",
    ]
    for i, p in enumerate(paths):
        cells = [fmt.format(values_of(sc)[i]) if i < len(values_of(sc)) and not sc.failures else ""
                 for sc in scores.values()]
        lines.append(f"| s{p.scenario} m{p.m} | " + " | ".join(cells) + " |")
    return lines


def _advice_table(paths, score) -> list[str]:
    """Per path and budget, the default model's advice against the best in-budget n."""
    lines = ["", f"## Advice per path ({score.name}, the default, as the service gives it)", "",
             "Per budget: advised n / best n whose true impact is within the budget (true throughput at the "
             "advice / at the best); '!' where the advised n truly exceeds the budget, 'none' where no n is within it.",
             "", "| path | " + " | ".join(f"{b:g}" for b in BUDGETS) + " |", "|---" * (len(BUDGETS) + 1) + "|"]
    for p, by_budget in zip(paths, score.advice_by_path):
        cells = []
        for budget in BUDGETS:
            advised, best, ratio, over = by_budget[budget]
            cells.append(f"{advised} / {'none' if best is None else best}"
                         + ("" if ratio is None else f" ({ratio:.2f})") + (" !" if over else ""))
        lines.append(f"| s{p.scenario} m{p.m} | " + " | ".join(cells) + " |")
    return lines


def _opened_rows(rows) -> list[str]:
    """Each model's served advice simulated as the transfer opens it, its fractional stream included."""
    opened = {name: r for name, r in rows.items() if not np.isnan(r["adv_opened_all"])}
    if not opened:
        return []
    lines = ["## Advice as the transfer opens it: whole streams and the fractional stream", "",
             "The served advice (with the margin) is n* TCP-equivalent streams: floor(n*) standard streams and one "
             "fractional stream of multiplier FM = 1 / remainder^2 (a Reno flow whose window grows by 1/FM "
             "segments a round trip; below one stream the fractional stream alone). The tables above score floor(n*) "
             "alone; here each advice with a fractional stream is a ground-truth run of its own (same seed and "
             "length) and is scored against the same best in-budget whole n.", "",
             "Where even one stream exceeds the budget (no whole n within it) these ratios leave the case out, as "
             "above; the last column counts how often the opened advice stays within the budget there.", "",
             "| model | " + " | ".join(f"adv {b:g} (exc)" for b in BUDGETS)
             + " | all budgets | whole streams only | within budget where no whole n is |",
             "|---" * (len(BUDGETS) + 4) + "|"]
    for name, r in opened.items():
        adv = " | ".join(f"{r[f'adv_opened_{b}']:.2f} ({r[f'exc_opened_{b}']:.0%})" for b in BUDGETS)
        lines.append(f"| {name} | {adv} | {r['adv_opened_all']:.2f} ({r['exc_opened_all']:.0%}) | "
                     f"{r['adv_all']:.2f} ({r['exc_all']:.0%}) | "
                     f"{r['within_opened_without_whole']} of {r['without_whole']} |")
    return lines + [""]


def _cost_table(paths, score) -> list[str]:
    """Per path, what the default model's probes cost (benchmarks.accuracy.ProbeCost)."""
    lines = ["", f"## Probe cost per path ({score.name})", "",
             "Seconds of probing, stream-seconds, cross traffic displaced (Mbit and share of what it carries alone), "
             "and the streams of each probe.", "",
             "| path | probes (streams) | seconds | stream-s | displaced Mbit | displaced share |", "|---" * 6 + "|"]
    for p, cost, levels in zip(paths, score.probe_cost, score.probe_levels):
        lines.append(f"| s{p.scenario} m{p.m} | {', '.join(map(str, levels))} | {cost.seconds:.0f} | {cost.stream_seconds:.0f} | "
                     f"{cost.displaced_bits / 1e6:.0f} | {cost.displaced_share:.0%} |")
    return lines


def _opened_table(paths, score) -> list[str]:
    """Per path and budget, the default model's advice as opened: streams, FM, true throughput over the best."""
    lines = ["", f"## Advice per path as opened ({score.name}, with its fractional stream)", "",
             "Per budget: standard streams + the fractional stream's FM (none: whole streams only), true throughput "
             "over the best in-budget whole n's, and its true impact; '!' where that exceeds the budget.",
             "", "| path | " + " | ".join(f"{b:g}" for b in BUDGETS) + " |", "|---" * (len(BUDGETS) + 1) + "|"]
    for p, opened, outcome in zip(paths, score.opened_by_path, score.opened_outcome_by_path):
        cells = []
        for budget in BUDGETS:
            streams, fm = opened[budget]
            _, impact, ratio = outcome[budget]
            ratio_text = "" if ratio is None else f" {ratio:.2f},"
            cells.append(f"{streams}{'' if fm is None else f' + FM {fm:.1f}'}:{ratio_text} {impact:.2f}"
                         + (" !" if impact > budget else ""))
        lines.append(f"| s{p.scenario} m{p.m} | " + " | ".join(cells) + " |")
    return lines


def _floor_table(paths, floor, default, seed: int) -> list[str]:
    """Per path, the noise floor's throughput error out of and in sample, beside the default model's."""
    seeds = ", ".join(map(str, floor["seeds"]))
    model = [] if default is None or default.failures else [default.name]
    lines = ["", "## Noise floor per path (mean |relative error| of throughput)", "",
             f"The per-n median of seeds {seeds}'s ground truth as a model of seed {seed}'s (out of sample), "
             f"the same with seed {seed}'s own run in the median (in sample); the path's expected curve lies "
             "between the two.",
             "", "| " + " | ".join(["path", "out of sample", "in sample", *model]) + " |", "|---" * (3 + len(model)) + "|"]
    for i, p in enumerate(paths):
        cells = [f"{floor['per_path'][i]:.3f}", f"{floor['in_sample']['per_path'][i]:.3f}"]
        if model:
            cells.append(f"{default.per_path_error[i]:.3f}")
        lines.append(f"| s{p.scenario} m{p.m} | " + " | ".join(cells) + " |")
    return lines


def write_report(out: Path, settings, paths, scores, rows, elapsed_s: float, command: str, floor=None,
                 form=None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _fig_per_path(out / "throughput_per_path.png", scores)
    _fig_vs_n(out / "throughput_vs_n.png", scores)
    _fig_cross(out / "cross_traffic_cdf.png", scores)
    _fig_paths(out / "ground_truth.png", paths)
    lines = [
        "# Accuracy on ns-2 (Lu et al. 2004 topology)",
        "",
        f"Command: `{command}` ({elapsed_s:.0f} s wall clock, cached runs included).",
        "",
        f"Scenarios {list(settings.scenarios)} x m {list(settings.ms)} x n {list(settings.ns)}; {settings.queue}; "
        f"seed {settings.seed}. Ground truth: {settings.truth_duration_s:g} s transfers after "
        f"{settings.truth_omit_s:g} s warm-up (n = 0 gives the cross traffic alone). Probes: separate runs of "
        f"the real probe plan (probes.plan.run_plan over the ns-2 driver): {settings.probe_duration_s:g} s after "
        f"{settings.probe_omit_s:g} s warm-up, re-run twice as long while the rate has not settled, up to "
        f"{settings.probe_max_duration_s:g} s; "
        + ("" if settings.probe_max_adaptive_streams is None
           else f"the adaptive probe at most {settings.probe_max_adaptive_streams} streams; ")
        + ("a refresh: the fixed levels probed again at another time (another seed), the adaptive probe re-used "
           "from the first probing, the cost the fresh probes' alone; " if settings.reuse_adaptive else "")
        + "a seed apart from the ground truth"
        + (f" (probe round {settings.probe_round}: the seeds shifted by {settings.probe_round})"
           if settings.probe_round else "") + ".",
        "",
        "Relative error = (predicted - measured) / measured (Lu eq. 14). Throughput: per path, the mean "
        "|relative error| over n; median and p90 over paths. Cross traffic: predicted = measured cross "
        "throughput at n = 0 x (1 - impact(n)), |relative error| over all paths and n. Advice: true "
        "throughput at the advised n / best true throughput among n whose true impact is within the budget "
        "(median over paths that have such an n), and the share of advice whose true impact exceeds the budget; "
        "advice as the service gives it, holding the budget to the predicted impact raised by the margin for its "
        f"error ({margin_text(settings.margin)}); the same under Lu's bare rule further down.",
        "",
        "Probe cost, per path (mean over paths; benchmarks.accuracy.ProbeCost): seconds of probing (warm-up, "
        "extensions and retries included, the idle RTT left out), stream-seconds (streams x seconds summed over "
        "the probes' runs), and the cross traffic the probes displaced: the cross traffic alone (n = 0) minus "
        "the cross traffic while each run measured, x the run's seconds (warm-up counted at the measured rate), "
        "in Mbit and as a share of what the cross traffic alone would have carried meanwhile (mean; p90 over paths).",
        "",
        "| model | paths | thr median | thr p90 | cross p50 | cross p90 | "
        + " | ".join(f"adv {b:g} (exc)" for b in BUDGETS)
        + " | all budgets | probes | probe s | stream-s | displaced Mbit | displaced share (p90) | fit failures |",
        "|---" * (13 + len(BUDGETS)) + "|",
    ]
    for name, r in rows.items():
        adv = " | ".join(f"{r[f'adv_{b}']:.2f} ({r[f'exc_{b}']:.0%})" for b in BUDGETS)
        lines.append(
            f"| {name} | {r['paths']} | {r['thr_median']:.3f} | {r['thr_p90']:.3f} | {r['cross_p50']:.3f} | "
            f"{r['cross_p90']:.3f} | {adv} | {r['adv_all']:.2f} ({r['exc_all']:.0%}) | {r['probes']:.1f} | "
            f"{r['probe_s']:.0f} | {r['probe_stream_s']:.0f} | {r['displaced_mbit']:.0f} | "
            f"{r['displaced_share']:.0%} ({r['displaced_share_p90']:.0%}) | {r['failures']} |"
        )
    lines += [
        "",
        "Goals (issue 5): throughput median <= 0.04, p90 <= 0.10 with <= 3 probes; cross p50 <= 0.05, "
        "p90 <= 0.20; advice >= 0.95 of best on median, exceeded <= 10 %.",
        "",
    ]
    if floor is not None:
        seeds = ", ".join(map(str, floor["seeds"]))
        inside = floor["in_sample"]
        lines += [
            f"Noise floor: the per-n median of the ground truth of seed(s) {seeds} taken as a perfect model of seed "
            f"{settings.seed}'s: throughput median {floor['thr_median']:.3f}, p90 {floor['thr_p90']:.3f}; cross traffic "
            f"p50 {floor['cross_p50']:.3f}, p90 {floor['cross_p90']:.3f}. The probes run with a seed of their own, so "
            "no model fitted to them can expect to do better than the path's expected curve; this median has not "
            f"seen seed {settings.seed} and over-estimates that curve's error, the same median with seed "
            f"{settings.seed}'s own run in it under-estimates it: throughput median {inside['thr_median']:.3f}, p90 "
            f"{inside['thr_p90']:.3f}; cross traffic p50 {inside['cross_p50']:.3f}, p90 {inside['cross_p90']:.3f}. "
            "Advice of a model that knows the median curve (its best in-budget n), scored as the models' is: "
            f"{floor['adv_all']:.2f} of the best in-budget throughput ({floor['exc_all']:.0%} over budget) out of "
            f"sample, {inside['adv_all']:.2f} ({inside['exc_all']:.0%}) in sample, under Lu's bare rule; with the "
            f"margin ({margin_text(settings.margin)}) {floor['adv_margin_all']:.2f} "
            f"({floor['exc_margin_all']:.0%}) and {inside['adv_margin_all']:.2f} ({inside['exc_margin_all']:.0%}). "
            "By scenario (median / largest per-path throughput error, out of sample; in sample): "
            + ", ".join(f"s{s} {v:.3f} / {floor['thr_max_by_scenario'][s]:.3f}; "
                        f"{inside['thr_median_by_scenario'][s]:.3f} / {inside['thr_max_by_scenario'][s]:.3f}"
                        for s, v in floor["thr_median_by_scenario"].items()) + ".",
            "",
        ]
    lines += _opened_rows(rows)
    lines += [
        "## Advice under Lu's bare rule (predicted impact <= budget, no margin)",
        "",
        "| model | " + " | ".join(f"adv {b:g} (exc)" for b in BUDGETS) + " | all budgets |",
        "|---" * (len(BUDGETS) + 2) + "|",
    ]
    for name, r in rows.items():
        adv = " | ".join(f"{r[f'adv_bare_{b}']:.2f} ({r[f'exc_bare_{b}']:.0%})" for b in BUDGETS)
        lines.append(f"| {name} | {adv} | {r['adv_bare_all']:.2f} ({r['exc_bare_all']:.0%}) |")
    scenarios = sorted({s for r in rows.values() for s in r["by_scenario"]})
    lines += [
        "",
        "## By scenario (median over its paths of the per-path mean |relative error| of throughput)",
        "",
        "| model | " + " | ".join(f"s{s}" for s in scenarios) + " |",
        "|---" * (len(scenarios) + 1) + "|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | " + _scenario_cells(r, scenarios) + " |")
    lines += [
        "",
        "Advice by scenario (median over its paths and the budgets of true throughput at the advice / best "
        "in-budget, with the margin):",
        "",
        "| model | " + " | ".join(f"s{s}" for s in scenarios) + " |",
        "|---" * (len(scenarios) + 1) + "|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | " + _scenario_cells(r, scenarios, "adv_by_scenario", "{:.2f}") + " |")
    # Models whose probe levels the sweep lacks (every one, on --quick) have nothing to show here.
    form = {name: r for name, r in (form or {}).items() if r["paths"]}
    if form:
        lines += [
            "",
            "## Where the error comes from: each model fitted to the ground truth's own runs",
            "",
            "The same scoring, but each model is fitted to the long transfers of the ground truth at its own probe "
            "levels (the adaptive level included) instead of to the probes: no probe noise, so what is left is the "
            "error of the model's form between and beyond its levels. Paths whose sweep lacks a level are left out.",
            "",
            "| model | paths | thr median | thr p90 | cross p50 | cross p90 | advice (exc) | "
            + " | ".join(f"s{s}" for s in scenarios) + " |",
            "|---" * (7 + len(scenarios)) + "|",
        ]
        for name, r in form.items():
            lines.append(
                f"| {name} | {r['paths']} | {r['thr_median']:.3f} | {r['thr_p90']:.3f} | {r['cross_p50']:.3f} | "
                f"{r['cross_p90']:.3f} | {r['adv_all']:.2f} ({r['exc_all']:.0%}) | "
                + _scenario_cells(r, scenarios) + " |")
    lines += _per_path_table("Per path (mean |relative error| of throughput)", "", paths, scores,
                             lambda sc: sc.per_path_error, "{:.3f}")
    lines += _per_path_table(
        "Per path: median signed relative error of the predicted cross traffic",
        "Positive: the cross traffic lost more than predicted (impact under-predicted); negative: it kept more.",
        paths, scores, lambda sc: sc.per_path_cross_bias, "{:+.3f}")
    default = scores.get(DEFAULT_MODEL)
    if floor is not None:
        lines += _floor_table(paths, floor, default, settings.seed)
    if default is not None and not default.failures:
        lines += _advice_table(paths, default)
        if default.opened_outcome_by_path:
            lines += _opened_table(paths, default)
        lines += _cost_table(paths, default)
    lines += [
        "",
        "![per path](throughput_per_path.png)",
        "",
        "![vs n](throughput_vs_n.png)",
        "",
        "![cross traffic](cross_traffic_cdf.png)",
        "",
        "![ground truth](ground_truth.png)",
        "",
    ]
    lines += _probe_table(paths)
    failures = [f"- {name}: {f}" for name, sc in scores.items() for f in sc.failures]
    if failures:
        lines += ["## Fit failures", "", *failures, ""]
    (out / "README.md").write_text("\n".join(lines))
