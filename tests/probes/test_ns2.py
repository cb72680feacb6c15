import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

from benchmarks import accuracy, accuracy_report
from benchmarks.studies import (cross_breakdown, explain_path, impact_bound_study, margin_by_form, margin_sweep,
                                probe_length)
from probes.errors import SimulatorError
from probes.ns2 import (
    ATTEMPT_SEED_STRIDE, SCENARIOS, Ns2Config, Ns2Driver, cache_key, parse_ns2_output, probe_result, simulate,
)
from probes.plan import ProbePlan, idle_streams, run_plan

ROOT = Path(__file__).resolve().parents[2]


DATA = Path(__file__).parent / "data"


def _seven_percent_path(accuracy, ns):
    """A made-up path of the benchmark: our throughput 10 Mbit/s per stream, the cross traffic (100 Mbit/s
    alone) losing 7 % per stream, so the true impact is 0.07 n: nothing fits 0.05, n <= 1 fits 0.1,
    n <= 2 fits 0.2, n <= 4 fits 0.3."""
    return accuracy.PathResult(2, 5, tuple(ns), ours_bps=np.array([10e6 * n for n in ns]),
                               cross_bps=np.array([100e6 * (1 - 0.07 * n) for n in ns]), cross0_bps=100e6)


def _short_real_path_settings(accuracy, cache_dir, **overrides):
    """Benchmark settings for a short real ns-2 path: s2, 5 cross flows, n = 1..4 unless overridden, 5 s runs."""
    return accuracy.Settings(**{"scenarios": (2,), "ms": (5,), "ns": (1, 2, 3, 4), "truth_duration_s": 5.0,
                                "truth_omit_s": 2.0, "probe_duration_s": 5.0, "probe_omit_s": 1.0,
                                "probe_max_duration_s": 5.0, "cache_dir": cache_dir, **overrides})


def test_parse_recorded_run_gives_per_flow_throughput_retransmits_and_rtt():
    run = parse_ns2_output((DATA / "s2_m5_n2_seed1.out").read_text())
    # Window 12 s .. 17 s. ours 0 acked 350 -> 3570: 3220 packets * 8000 bit / 5 s = 5.152 Mb/s;
    # ours 1 acked 395 -> 4705: 4310 * 8000 / 5 = 6.896 Mb/s; each retransmitted 1 packet.
    ours = run.group("ours")
    assert_allclose([f.throughput_bps for f in ours], [5.152e6, 6.896e6])
    assert [f.retransmits for f in ours] == [1, 1]
    # ours 0 srtt at ticks 12..16 s and at the end: 3 x 0.058875, 2 x 0.059, 1 x 0.060 -> mean 0.354625 / 6.
    assert_allclose(ours[0].rtt_mean_s, 0.354625 / 6)
    assert_allclose((ours[0].rtt_min_s, ours[0].rtt_max_s), (0.058875, 0.060))
    # cross acked 12654 + 5333 + 7307 + 7583 + 7972 = 40849 packets in 5 s.
    assert_allclose(run.cross_bps, 40849 * 8000 / 5)
    # ours per second: 925, 1481, 1139, 1707, 2278 packets (sum 7530 = 3220 + 4310).
    assert_allclose(run.ours_interval_bps, [x * 8000 for x in (925, 1481, 1139, 1707, 2278)])
    assert len(run.cross_interval_bps) == 5


def test_probe_result_reports_aggregate_and_unsettled_ramp():
    run = parse_ns2_output((DATA / "s2_m5_n2_seed1.out").read_text())
    result = probe_result(run, "ns2:s2", 2, omit_s=2.0)
    assert_allclose(result.throughput_bps, 12.048e6)
    assert result.retransmits == 2
    assert result.duration_s == 5.0
    # First half 925+1481 packets/2 s vs second half (1139+1707+2278)/3 s: the rate was still rising.
    assert not result.settled


def test_parse_run_without_our_flows():
    run = parse_ns2_output((DATA / "s6_m5_n0_seed3.out").read_text())
    assert run.group("ours") == ()
    assert run.ours_bps == 0
    # Scenario 6: a 60-packet window per 0.058875 s RTT, over the 3 s window, plus at most one
    # window in flight at the window's edges, for each of the 5 flows.
    assert 0 < run.cross_bps <= 5 * (60 * 3 / 0.058875 + 60) * 8000 / 3


def test_parse_rejects_truncated_output():
    text = (DATA / "s2_m5_n2_seed1.out").read_text()
    with pytest.raises(SimulatorError):
        parse_ns2_output(text.replace("done", ""))
    with pytest.raises(SimulatorError):
        parse_ns2_output(text.replace("end 17.000000 ours 0 3570", "end 17.000000 ours 0 x"))


def test_config_rejects_seed_zero_and_unknown_scenario():
    with pytest.raises(ValueError, match="seed"):
        Ns2Config(2, 5, 1, 0, 5.0, 1.0)
    with pytest.raises(ValueError, match="scenario"):
        Ns2Config(11, 5, 1, 1, 5.0, 1.0)
    with pytest.raises(ValueError, match="queue must be 'DropTail' or 'RED', got 'CoDel'"):
        Ns2Config(2, 5, 1, 1, 5.0, 1.0, "CoDel")


def test_held_out_scenarios_are_not_lus():
    # Lu's Fig. 2 has scenarios 1-6; the benchmark's --holdout preset uses the others.
    from probes.ns2 import HELD_OUT

    assert set(SCENARIOS) == set(range(1, 7)) | set(HELD_OUT)
    assert not set(HELD_OUT) & set(range(1, 7))


def test_cache_key_changes_with_every_parameter():
    base = Ns2Config(2, 5, 2, 1, 5.0, 2.0)
    others = [Ns2Config(2, 5, 2, 2, 5.0, 2.0), Ns2Config(2, 5, 3, 1, 5.0, 2.0), Ns2Config(2, 5, 2, 1, 5.0, 2.0, "RED")]
    assert len({cache_key(c) for c in [base, *others]}) == 4


def test_a_fractional_stream_keys_its_own_runs_and_leaves_the_others_keys_as_they_were():
    import hashlib
    import json
    import os
    import shutil
    from dataclasses import asdict

    from probes.ns2 import TEMPLATE

    base = Ns2Config(2, 5, 2, 1, 5.0, 2.0)
    # The key of a config without a fractional stream is the one every cached run was stored under before the
    # option existed: its parameters without the new field, and the scenario script alone.
    before = dict(asdict(base))
    del before["fractional_multiplier"]
    material = {"config": before, "template": TEMPLATE.read_text(), "ns": os.path.realpath(shutil.which("ns") or "ns")}
    assert cache_key(base) == hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]
    fractional = {cache_key(replace(base, fractional_multiplier=fm)) for fm in (1.0, 4.0, 4.5)}
    assert len(fractional | {cache_key(base)}) == 4
    for bad in (0.5, 0.0, -2.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="fractional_multiplier"):
            Ns2Config(2, 5, 2, 1, 5.0, 2.0, fractional_multiplier=bad)


@pytest.mark.ns2
def test_a_fractional_stream_is_one_more_flow_of_ours_that_grows_by_one_over_fm_a_round_trip(tmp_path):
    # FM = 1 is a standard Reno stream: n = 1 plus it is exactly the run of n = 2.
    two, _ = simulate(Ns2Config(2, 5, 2, 1, 20.0, 10.0), 120)
    one_plus_one, _ = simulate(Ns2Config(2, 5, 1, 1, 20.0, 10.0, fractional_multiplier=1.0), 120)
    assert one_plus_one == two
    # FM = 4: the window grows by a quarter of a segment a round trip, so at the loss rate and RTT the others see
    # it moves about 1 / sqrt(4) of a standard stream (0.51 of ours in this run), counted as our last flow.
    run, _ = simulate(Ns2Config(2, 5, 1, 1, 80.0, 10.0, fractional_multiplier=4.0), 120)
    standard, fractional = run.group("ours")
    assert 0.35 < fractional.throughput_bps / standard.throughput_bps < 0.7
    assert run.ours_bps == standard.throughput_bps + fractional.throughput_bps
    # With no standard stream of ours, the fractional one runs alone.
    alone, _ = simulate(Ns2Config(2, 5, 0, 1, 20.0, 10.0, fractional_multiplier=4.0), 120)
    assert len(alone.group("ours")) == 1 and alone.ours_bps > 0


def test_tuned_window_covers_the_bandwidth_delay_product():
    for s in SCENARIOS.values():
        bdp_packets = s.l3_bps * s.idle_rtt_s / 8000
        assert s.window_packets >= bdp_packets if s.tuned else s.window_packets == 60


@pytest.mark.ns2
def test_streams_locked_out_of_a_probe_show_as_idle_and_a_later_attempt_runs_them():
    # Held-out scenario 7 (10 Mbit/s) with 25 cross flows and the benchmark's probe seed: 7 of 10 streams
    # started together carry nothing for the whole probe. The same probe at another time (attempt 1, its own
    # seed) runs all ten, and the plan keeps that attempt.
    driver = Ns2Driver(scenario=7, m=25, seed=1007)
    first = driver.run("ns2:s7", 10, duration_s=30.0, omit_s=5.0, deadline_s=120)
    assert len(first.stream_bps) == 10 and sum(first.stream_bps) == pytest.approx(first.throughput_bps)
    assert len(first.stream_retransmits) == 10 and sum(first.stream_retransmits) == first.retransmits
    assert idle_streams(first) == 7 and sorted(first.stream_bps)[:7] == [0.0] * 7
    later = driver.run("ns2:s7", 10, duration_s=30.0, omit_s=5.0, deadline_s=120, attempt=1)
    assert idle_streams(later) == 0 and later.throughput_bps > 2 * first.throughput_bps
    assert later.throughput_bps == Ns2Driver(scenario=7, m=25, seed=1007 + ATTEMPT_SEED_STRIDE).run(
        "ns2:s7", 10, duration_s=30.0, omit_s=5.0, deadline_s=120).throughput_bps
    kept = run_plan(driver, "ns2:s7", ProbePlan(levels=(10,))).probes[0]
    assert idle_streams(kept) == 0 and kept.stream_bps == later.stream_bps
    with pytest.raises(ValueError, match="attempt"):
        driver.run("ns2:s7", 10, duration_s=30.0, omit_s=5.0, deadline_s=120, attempt=-1)


@pytest.mark.ns2
def test_short_real_run_is_plausible_and_repeatable(tmp_path):
    driver = Ns2Driver(scenario=2, m=5, seed=7)
    first = driver.run("ns2:s2", 2, duration_s=3.0, omit_s=1.0, deadline_s=60)
    again = driver.run("ns2:s2", 2, duration_s=3.0, omit_s=1.0, deadline_s=60)
    assert 0 < first.throughput_bps <= SCENARIOS[2].l3_bps
    assert first.rtt_mean_s >= 0.058
    assert (first.throughput_bps, first.retransmits, first.rtt_mean_s) == (
        again.throughput_bps, again.retransmits, again.rtt_mean_s)
    other = Ns2Driver(scenario=2, m=5, seed=8).run("ns2:s2", 2, duration_s=3.0, omit_s=1.0, deadline_s=60)
    assert other.throughput_bps != first.throughput_bps


@pytest.mark.ns2
def test_cached_run_is_read_back(tmp_path):
    config = Ns2Config(1, 2, 1, 1, 2.0, 1.0)
    run, raw = simulate(config, 60, tmp_path)
    assert len(list(tmp_path.glob("*.out"))) == 1
    again, raw_again = simulate(config, 60, tmp_path)
    assert (again, raw_again) == (run, raw)
    assert 0 < run.ours_bps + run.cross_bps <= SCENARIOS[1].l3_bps


@pytest.mark.ns2
def test_accuracy_benchmark_quick_preset_runs(tmp_path):
    # CI's smoke test of the benchmark (issue 5): the --quick preset narrowed to one of its paths (scenario 2,
    # 5 cross flows, all its stream counts), uncached, end to end: 10 s where the whole preset takes a minute.
    # It checks that the benchmark runs and reports every model, not the accuracy targets.
    import subprocess

    argv = [sys.executable, "-m", "benchmarks.accuracy", "--quick", "--scenarios", "2", "--ms", "5",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    completed = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr
    report = (tmp_path / "out" / "README.md").read_text()
    from models.registry import MODELS

    for model in MODELS:
        assert f"| {model} |" in report
    assert (tmp_path / "out" / "cross_traffic_cdf.png").stat().st_size > 0


@pytest.mark.ns2
def test_seed_floor_is_zero_for_the_same_seed_and_brackets_another(tmp_path):
    # The noise floor scores other seeds' ground truth as a model of this one's: the same seed
    # must score exactly 0 out of sample and in sample (runs are deterministic). With one other
    # seed, the in-sample median of two curves is their mean, (a + b) / 2, whose relative error
    # against a is |b / a - 1| / 2: exactly half the out-of-sample error at every n.

    settings = accuracy.Settings(scenarios=(1,), ms=(3,), ns=(1, 2), truth_duration_s=8.0, truth_omit_s=2.0,
                                 cache_dir=tmp_path, workers=1)
    runs = accuracy.run_all([settings.truth_config(1, 3, n) for n in (0, 1, 2)], settings)
    truth = [runs[settings.truth_config(1, 3, n)][0] for n in (1, 2)]
    path = accuracy.PathResult(1, 3, (1, 2), ours_bps=np.array([r.ours_bps for r in truth]),
                               cross_bps=np.array([r.cross_bps for r in truth]),
                               cross0_bps=runs[settings.truth_config(1, 3, 0)][0].cross_bps)
    same = accuracy.seed_floor([path], replace(settings, floor_seeds=(settings.seed,)))
    assert same["thr_median"] == 0.0 and same["cross_p90"] == 0.0
    assert same["thr_median_by_scenario"] == {1: 0.0}
    assert same["in_sample"]["thr_median"] == 0.0 and same["in_sample"]["cross_p90"] == 0.0
    # Knowing the truth, its advice is the best in-budget n wherever one exists, never over budget.
    in_budget = sum(bool((path.true_impact <= b).any()) for b in accuracy.BUDGETS)
    assert in_budget > 0
    assert same["adv_all"] == 1.0 and same["exc_all"] == 0.0
    other = accuracy.seed_floor([path], replace(settings, floor_seeds=(settings.seed + 1,)))
    assert other["seeds"] == (settings.seed + 1,)
    assert other["thr_median"] > 0.0
    assert_allclose(other["in_sample"]["thr_median"], other["thr_median"] / 2)
    assert_allclose(other["in_sample"]["cross_p90"], other["cross_p90"] / 2)
    # The report's per-path table carries both figures of the one path.
    table = accuracy_report._floor_table([path], other, None, settings.seed)
    assert table[-3] == "| path | out of sample | in sample |"
    assert table[-1] == f"| s1 m3 | {other['per_path'][0]:.3f} | {other['in_sample']['per_path'][0]:.3f} |"


@pytest.mark.ns2
def test_form_scores_fit_the_ground_truths_own_runs(tmp_path):
    # Fitted to the long transfers at its own two levels, Lu's two-parameter curve passes through
    # both, so scored at just those n its error is 0 (up to rounding); a model whose levels the
    # sweep lacks (yildirim probes 5 streams) is left out rather than scored on something else.

    settings = accuracy.Settings(scenarios=(2,), ms=(3,), ns=(1, 10), truth_duration_s=8.0, truth_omit_s=2.0,
                                 cache_dir=tmp_path, workers=1, models=("lu", "yildirim"))
    runs = accuracy.run_all([settings.truth_config(2, 3, n) for n in (0, 1, 10)], settings)
    truth = {n: runs[settings.truth_config(2, 3, n)][0] for n in (1, 10)}
    path = accuracy.PathResult(
        2, 3, (1, 10), ours_bps=np.array([truth[n].ours_bps for n in (1, 10)]),
        cross_bps=np.array([truth[n].cross_bps for n in (1, 10)]),
        cross0_bps=runs[settings.truth_config(2, 3, 0)][0].cross_bps,
        truth_points={n: accuracy.point_from_probe(accuracy.probe_result(r, "s2m3", n, 2.0)) for n, r in truth.items()},
    )
    scores = accuracy.form_scores([path], settings)
    assert len(scores["lu"].per_path_error) == 1
    assert scores["lu"].per_path_error[0] < 1e-9
    assert scores["yildirim"].per_path_error == []


def test_probe_length_path_argument_is_parsed_or_explained():
    import argparse

    assert probe_length.parse_path("7:25:5,10,31") == (7, 25, (5, 10, 31))
    with pytest.raises(argparse.ArgumentTypeError, match="scenario:m:n1,n2"):
        probe_length.parse_path("7-25")


@pytest.mark.ns2
def test_probe_length_prints_one_row_per_stream_count(tmp_path, capsys):
    import re

    assert probe_length.main(["--path", "1:3:1,2", "--lengths", "2,4", "--truth-seeds", "2",
                              "--cache", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| s1 m3 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]
    for row in rows:
        # two probe lengths and one other seed, each a signed percentage
        assert len(re.findall(r"[+-]\d+%", row)) == 3
    # the same seeds give the same table
    assert probe_length.main(["--path", "1:3:1,2", "--lengths", "2,4", "--truth-seeds", "2",
                              "--cache", str(tmp_path)]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("| s1 m3 |")] == rows


@pytest.mark.ns2
def test_explain_path_prints_the_models_prediction_against_the_truth_at_every_n(tmp_path, capsys):
    from models.registry import MODELS

    assert explain_path.main(["1:3", "--ns", "1,2,4", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {int(cells[1]): cells for cells in (line.split("|") for line in out.splitlines())
            if len(cells) == 11 and cells[1].strip().isdigit()}
    assert sorted(rows) == [1, 2, 4]
    # The same settings, read back from the cache the script filled, fitted here independently.
    settings = accuracy.Settings(scenarios=(1,), ms=(3,), ns=(1, 2, 4), models=("auto",), cache_dir=tmp_path)
    (path,), _ = accuracy.evaluate(settings)
    fitted = MODELS["auto"]([path.probes[1], path.probes[10]])
    fit_line = next(line for line in out.splitlines() if line.startswith("Fit: "))
    if fitted.capacity_bps is None:
        assert "capacity unbounded" in fit_line
    else:
        assert f"capacity {fitted.capacity_bps / 1e6:.3f} Mbit/s" in fit_line
    if "competing_flows" in fitted.params:
        assert f"M = {fitted.params['competing_flows']:.2f}" in fit_line
    for k, n in enumerate(path.ns):
        ours, predicted, error = (rows[n][i].strip() for i in (2, 3, 4))
        assert float(ours) == pytest.approx(path.ours_bps[k] / 1e6, abs=5e-4)
        assert float(predicted) == pytest.approx(fitted.throughput_bps(n) / 1e6, abs=5e-4)
        assert float(error.rstrip("%")) == pytest.approx((fitted.throughput_bps(n) / path.ours_bps[k] - 1) * 100, abs=0.06)
        total, share = (float(rows[n][i]) for i in (8, 9))
        assert total == pytest.approx((path.ours_bps[k] + path.cross_bps[k]) / 1e6, abs=5e-4)
        assert share == pytest.approx((path.ours_bps[k] / n) / (path.cross_bps[k] / 3), abs=5e-3)
    # One advice row per budget the benchmark scores.
    advice = [line for line in out.splitlines() if line.startswith(("| 0.05 |", "| 0.1 |", "| 0.2 |", "| 0.3 |"))]
    assert len(advice) == len(accuracy.BUDGETS)


def test_explain_path_reads_the_queue_it_is_given(tmp_path, capsys):
    assert explain_path.main(["1:3", "--ns", "1,2", "--queue", "RED", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "## s1 m3 (RED)" in out
    rows = {int(cells[1]): float(cells[2]) for cells in (line.split("|") for line in out.splitlines())
            if len(cells) == 11 and cells[1].strip().isdigit()}
    by_queue = {}
    for queue in ("RED", "DropTail"):
        settings = accuracy.Settings(scenarios=(1,), ms=(3,), ns=(1, 2), models=("auto",), queue=queue,
                                     cache_dir=tmp_path)
        (path,), _ = accuracy.evaluate(settings)
        by_queue[queue] = path.ours_bps / 1e6
    assert [rows[1], rows[2]] == pytest.approx(list(by_queue["RED"]), abs=5e-4)
    # The two queues are different simulations: the rows are not DropTail's.
    assert not np.allclose(by_queue["RED"], by_queue["DropTail"], rtol=1e-3)


def test_explain_path_argument_is_parsed_or_explained():
    import argparse

    assert explain_path.parse_path("6:10") == (6, 10)
    with pytest.raises(argparse.ArgumentTypeError, match="scenario:m"):
        explain_path.parse_path("6")


def test_explain_path_names_the_scenarios_when_given_an_unknown_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        explain_path.main(["11:5"])
    assert exit_info.value.code == 2
    assert "no scenario 11; the scenarios are 1, 2, 3, 4, 5, 6, 7, 8, 9, 10" in capsys.readouterr().err


def test_advice_is_recorded_per_path_and_budget_against_the_best_in_budget_n():
    # A made-up path: our throughput 10 Mbit/s per stream, the cross traffic losing 7 % per stream,
    # so the true impact is 0.07 n: nothing fits 0.05, n <= 1 fits 0.1, n <= 2 fits 0.2, n <= 4 fits 0.3.
    from advisor.tame import DEFAULT_MARGIN, advise
    from models.parallel import ProbePoint
    from models.registry import MODELS

    ns = tuple(range(1, 9))
    path = _seven_percent_path(accuracy, ns)
    probes = [ProbePoint(1, 10e6), ProbePoint(10, 60e6)]
    score = accuracy.ModelScore("lu")
    accuracy.score_model("lu", path, probes, score, accuracy.Settings(scenarios=(2,), ms=(5,), ns=ns))
    (by_budget,) = score.advice_by_path
    fitted = MODELS["lu"](probes)
    for budget, best in ((0.05, None), (0.1, 1), (0.2, 2), (0.3, 4)):
        advised, best_n, ratio, over = by_budget[budget]
        assert advised == advise(fitted, budget, n_max=8, margin=DEFAULT_MARGIN).num_flows
        assert best_n == best
        assert over == (0.07 * advised > budget)
        # Throughput is 10 n, so the ratio is advised / best; no best, no ratio, and nothing scored.
        assert ratio == (None if best is None else pytest.approx(advised / best))
    assert 0.05 not in score.advice_ratio and len(score.advice_ratio[0.3]) == 1
    # By scenario: the median over the budgets that have a best n (0.05 has none).
    ratios = [by_budget[b][2] for b in (0.1, 0.2, 0.3)]
    assert accuracy.summary({"lu": score})["lu"]["adv_by_scenario"] == {2: pytest.approx(float(np.median(ratios)))}
    row = accuracy_report._advice_table([path], score)[-1]
    advised, _, ratio, over = by_budget[0.3]
    assert row.startswith(f"| s2 m5 | {by_budget[0.05][0]} / none")
    assert f"{advised} / 4 ({ratio:.2f}){' !' if over else ''} |" in row


def test_the_opened_advice_holds_its_fractional_stream_to_the_fractional_margin():
    from advisor.tame import DEFAULT_MARGIN, ImpactMargin, advise
    from models.parallel import ProbePoint
    from models.registry import MODELS

    ns = tuple(range(1, 9))
    path = _seven_percent_path(accuracy, ns)
    probes = [ProbePoint(1, 10e6), ProbePoint(10, 60e6)]
    fitted = MODELS["lu"](probes)
    opened = {}
    for fractional_margin in (DEFAULT_MARGIN, ImpactMargin(0.5, 0.05)):
        score = accuracy.ModelScore("lu")
        settings = accuracy.Settings(scenarios=(2,), ms=(5,), ns=ns, fractional_margin=fractional_margin)
        accuracy.score_model("lu", path, probes, score, settings)
        (opened[fractional_margin],) = score.opened_by_path
        for budget, streams_and_fm in opened[fractional_margin].items():
            assert streams_and_fm == advise(fitted, budget, n_max=8, margin=DEFAULT_MARGIN,
                                            fractional_margin=fractional_margin).opened_streams()
    assert opened[DEFAULT_MARGIN] != opened[ImpactMargin(0.5, 0.05)], "the wider margin changed no fractional stream"


@pytest.mark.ns2
def test_served_advice_is_simulated_as_opened_with_its_fractional_stream(tmp_path):
    # A short real path (s2, 5 cross flows, n = 1..4): every advice with a fractional stream is a run of its own,
    # scored against the same best in-budget whole n as the whole-stream advice.
    settings = _short_real_path_settings(accuracy, tmp_path, models=("auto", "lu"))
    (path,), scores = accuracy.evaluate(settings)
    auto = scores["auto"]
    assert scores["lu"].opened_outcome_by_path == []  # only settings.fractional_models' advice is simulated
    (opened,), (outcome,) = auto.opened_by_path, auto.opened_outcome_by_path
    assert {fm for _, fm in opened.values()} - {None}, "no advice with a fractional stream to check"
    within, ratios, exceeded = [], {}, {}
    for budget, (streams, fm) in opened.items():
        if fm is None:
            index = list(path.ns).index(streams)
            expected = (path.ours_bps[index], path.true_impact[index])
        else:
            run, _ = simulate(settings.truth_config(2, 5, streams, fm), 60, tmp_path)
            assert len(run.group("ours")) == streams + 1
            expected = (run.ours_bps, 1 - run.cross_bps / path.cross0_bps)
        best = accuracy.best_within(path.ns, path.ours_bps, path.true_impact, budget)
        ratio = None if best is None else expected[0] / path.ours_bps[list(path.ns).index(best)]
        assert outcome[budget][:2] == pytest.approx(expected)
        assert outcome[budget][2] == (None if ratio is None else pytest.approx(ratio))
        if best is None:
            within.append(expected[1] <= budget)
        else:
            ratios[budget] = [pytest.approx(ratio)]
            exceeded[budget] = [expected[1] > budget]
    assert auto.advice_ratio_opened == ratios and auto.advice_exceeded_opened == exceeded
    assert auto.within_opened_without_whole == within
    row = accuracy.summary(scores)["auto"]
    assert row["without_whole"] == len(within) and row["within_opened_without_whole"] == sum(within)
    text = "\n".join(accuracy_report._opened_table([path], auto))
    streams, fm = opened[0.3]
    assert "| s2 m5 | " in text and (f"{streams} + FM {fm:.1f}:" if fm else f"{streams}:") in text


def test_cross_breakdown_counts_errors_within_the_tolerance_per_scenario():
    # Two paths of scenario 2 and one of scenario 6, three n each.
    score = accuracy.ModelScore("auto", per_path_scenario=[2, 6, 2],
                                cross_error=[0.01, -0.04, 0.2, -0.5, 0.05, 0.0, 0.06, -0.06, 0.03])
    by_scenario = cross_breakdown.errors_by_scenario(score, 3)
    assert sorted(by_scenario) == [2, 6]
    assert_allclose(by_scenario[2], [0.01, 0.04, 0.2, 0.06, 0.06, 0.03])
    lines = cross_breakdown.breakdown_lines(by_scenario, {}, 0.05)
    assert "| s2 | 3 / 6 (50%) | 0.050 | - | - |" in lines
    assert "| s6 | 2 / 3 (67%) | 0.050 | - | - |" in lines
    assert "| all | 5 / 9 (56%) | 0.050 | - | - |" in lines
    assert lines[-1] == "A p50 within 0.05 needs 5 of the 9 errors within it."


def test_cross_breakdown_refuses_a_tolerance_that_is_not_positive(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cross_breakdown.main(["--tolerance", "0"])
    assert exit_info.value.code == 2
    assert "--tolerance must be above 0, got 0" in capsys.readouterr().err


@pytest.mark.ns2
def test_cross_breakdown_agrees_with_the_benchmarks_own_cross_errors(tmp_path, capsys):
    # n = 10 is in the sweep so that the form (auto fitted to the truth at its levels 1 and 10) is scored too.
    assert cross_breakdown.main(["--scenarios", "1", "--ms", "3", "--ns", "1,2,4,10", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    settings = accuracy.Settings(scenarios=(1,), ms=(3,), ns=(1, 2, 4, 10), models=("auto",), cache_dir=tmp_path)
    paths, scores = accuracy.evaluate(settings)
    errors = np.abs(scores["auto"].cross_error)
    form = np.abs(accuracy.form_scores(paths, settings)["auto"].cross_error)
    assert len(errors) == len(form) == 4
    within = int(np.sum(errors <= 0.05))
    row = next(line for line in out.splitlines() if line.startswith("| s1 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1].startswith(f"{within} / 4 ")
    assert float(cells[2]) == pytest.approx(np.median(errors), abs=5e-4)
    assert cells[3].startswith(f"{int(np.sum(form <= 0.05))} / {form.size} ")


def test_margin_argument_is_parsed_or_explained():
    import argparse

    from advisor.tame import DEFAULT_FRACTIONAL_MARGIN, DEFAULT_MARGIN, ImpactMargin

    assert accuracy.margin_arg("0.1,0.01") == ImpactMargin(0.1, 0.01)
    for bad in ("0.1", "a,b", "-0.1,0.02", "0.1,0.02,0.3"):
        with pytest.raises(argparse.ArgumentTypeError, match="RELATIVE,ABSOLUTE"):
            accuracy.margin_arg(bad)
    settings, _ = accuracy.parse_args(["--quick"])
    assert settings.margin == DEFAULT_MARGIN
    assert settings.fractional_margin == DEFAULT_FRACTIONAL_MARGIN
    settings, _ = accuracy.parse_args(["--quick", "--margin", "0,0", "--fractional-margin", "0.3,0.04"])
    assert settings.margin == ImpactMargin(0.0, 0.0)
    assert settings.fractional_margin == ImpactMargin(0.3, 0.04)


def test_probe_cost_sums_seconds_stream_seconds_and_the_cross_traffic_displaced():
    runs = [accuracy.ProbeRun(1, 30.0, 5.0, 90e6), accuracy.ProbeRun(10, 30.0, 5.0, 60e6),
            accuracy.ProbeRun(10, 60.0, 5.0, 70e6)]
    cost = accuracy.ProbeCost.of(runs, cross0_bps=100e6)
    # 35 + 35 + 65 = 135 s; 1 x 35 + 10 x 35 + 10 x 65 = 1035 stream-s;
    # displaced 10e6 x 35 + 40e6 x 35 + 30e6 x 65 = 3.7e9 bits, of 100e6 x 135 = 13.5e9 bits alone.
    assert_allclose([cost.seconds, cost.stream_seconds, cost.displaced_bits], [135.0, 1035.0, 3.7e9])
    assert_allclose(cost.displaced_share, 3.7 / 13.5)


def test_probe_plan_options_take_the_named_plan_unless_told_otherwise():
    from probes.plan import PLANS

    settings, _ = accuracy.parse_args(["--quick"])
    standard = PLANS["standard"]
    assert (settings.probe_duration_s, settings.probe_max_duration_s, settings.probe_omit_s,
            settings.probe_max_adaptive_streams) == (standard.duration_s, standard.max_duration_s, standard.omit_s,
                                                     standard.max_adaptive_streams)
    settings, _ = accuracy.parse_args(["--quick", "--probe-duration", "15", "--probe-max-duration", "30",
                                       "--probe-max-adaptive", "16"])
    assert (settings.probe_duration_s, settings.probe_max_duration_s, settings.probe_max_adaptive_streams) == (15, 30, 16)
    assert settings.probe_plan((1, 10)).max_adaptive_streams == 16
    # The cap bounds the adaptive level the scoring picks too; 0 lifts it.
    assert settings.adaptive_n_max(31) == 16 and settings.adaptive_n_max(8) == 8
    assert accuracy.parse_args(["--quick", "--probe-max-adaptive", "0"])[0].adaptive_n_max(31) == 31
    # Another probe round probes at another time: the probes' seed moves, the ground truth's stays.
    later, _ = accuracy.parse_args(["--quick", "--probe-round", "2"])
    assert later.probe_driver(2, 5).seed == settings.probe_driver(2, 5).seed + 2
    assert later.truth_config(2, 5, 3) == settings.truth_config(2, 5, 3)


@pytest.mark.ns2
def test_the_benchmark_counts_every_run_of_the_plan_and_what_it_displaced(tmp_path):
    settings = _short_real_path_settings(accuracy, tmp_path, ns=(1, 2, 3, 4), models=("auto",),
                                         fractional_models=())
    paths, scores = accuracy.evaluate(settings)
    (path,) = paths
    # auto probes 1 and 10 streams, then its adaptive level: 4 x 10 capped at the sweep's n_max 4
    # is below 10, so no third probe; each probe is one 1 + 5 s run unless an idle-stream retry adds one.
    (cost,) = scores["auto"].probe_cost
    runs = [r for n in (1, 10) for r in path.probe_runs[n]]
    assert all(r.seconds == 6.0 for r in runs)
    assert cost.seconds == 6.0 * len(runs)
    assert cost.stream_seconds == sum(r.streams * 6.0 for r in runs)
    assert_allclose(cost.displaced_bits, sum((path.cross0_bps - r.cross_bps) * 6.0 for r in runs))
    # Ten streams against five cross flows on 100 Mbit/s take a large share from them.
    assert 0.2 < cost.displaced_share < 1.0


@pytest.mark.ns2
def test_a_refresh_probes_the_fixed_levels_again_and_re_uses_the_adaptive_probe(tmp_path):
    first_settings = _short_real_path_settings(accuracy, tmp_path, ns=(1, 12), models=("auto",), fractional_models=())
    (first,), _ = accuracy.evaluate(first_settings)
    (path,), scores = accuracy.evaluate(replace(first_settings, reuse_adaptive=True))
    # n_max 12 < 4 x 10: the adaptive probe is at 12 streams, kept from the first probing; 1 and 10 are
    # probed again with the next round's seed, so they differ, and the cost counts their runs alone.
    assert sorted(path.probes) == [1, 10, 12]
    assert path.probes[12] == first.probes[12]
    assert path.probes[10] != first.probes[10]
    assert path.probe_runs[12] == []
    (cost,) = scores["auto"].probe_cost
    assert cost.seconds == sum(r.seconds for n in (1, 10) for r in path.probe_runs[n])


def test_fractional_models_argument_is_parsed_or_explained(capsys):
    assert accuracy.parse_args(["--quick"])[0].fractional_models == ("auto",)
    assert accuracy.parse_args(["--quick", "--fractional-models", "none"])[0].fractional_models == ()
    assert accuracy.parse_args(["--quick", "--fractional-models", "lu,auto"])[0].fractional_models == ("lu", "auto")
    with pytest.raises(SystemExit):
        accuracy.parse_args(["--quick", "--fractional-models", "auto,nosuch"])
    assert "unknown model in --fractional-models: nosuch" in capsys.readouterr().err


def test_margin_sweep_scores_each_margins_advice_and_marks_the_goals():
    # The made-up path of the advice test above: 10 Mbit/s per stream, the cross traffic losing 7 % per
    # stream, so n <= 1 fits 0.1, n <= 2 fits 0.2, n <= 4 fits 0.3; Lu's model fitted to exact probes
    # predicts an impact the bare rule can follow to the budget and a wide margin cannot.
    from advisor.tame import DEFAULT_MARGIN, NO_MARGIN, ImpactMargin, advise
    from models.parallel import ProbePoint
    from models.registry import MODELS

    ns = tuple(range(1, 11))
    path = _seven_percent_path(accuracy, ns)
    path.probes.update({1: ProbePoint(1, 10e6), 10: ProbePoint(10, 60e6)})
    settings = accuracy.Settings(scenarios=(2,), ms=(5,), ns=ns, models=("lu",))
    wide = ImpactMargin(1.0, 0.1)
    rows = margin_sweep.sweep_rows([path], settings, [NO_MARGIN, DEFAULT_MARGIN, wide])
    fitted = MODELS["lu"](list(path.probes.values()))
    for margin, row in rows:
        for budget in (0.1, 0.2, 0.3):
            advised = advise(fitted, budget, n_max=10, margin=margin).num_flows
            best = {0.1: 1, 0.2: 2, 0.3: 4}[budget]
            assert row[f"adv_{budget}"] == pytest.approx(advised / best)
            assert row[f"exc_{budget}"] == float(0.07 * advised > budget)
    # A wider margin never advises more streams.
    assert rows[2][1]["adv_all"] <= rows[1][1]["adv_all"] <= rows[0][1]["adv_all"]
    lines = margin_sweep.table(rows)
    assert len(lines) == 2 + len(rows)
    assert lines[3].startswith("| 0.15 | 0.02 |") and "*" in lines[3].split("|")[-2]
    for line, (_, row) in zip(lines[2:], rows):
        meets = row["adv_all"] >= 0.95 and row["exc_all"] <= 0.10
        assert ("+" in line.split("|")[-2]) == meets


@pytest.mark.ns2
def test_fractional_margin_sweep_scores_the_advice_as_opened_per_margin(tmp_path):
    # The short real path of the opened-advice test: each margin's row is what benchmarks.accuracy reports with
    # --fractional-margin set to it.
    from advisor.tame import DEFAULT_FRACTIONAL_MARGIN, ImpactMargin

    settings = _short_real_path_settings(accuracy, tmp_path, models=("auto",), fractional_models=())
    paths, _ = accuracy.evaluate(settings)
    margins = [DEFAULT_FRACTIONAL_MARGIN, ImpactMargin(1.0, 0.1)]
    rows = margin_sweep.fractional_sweep_rows(paths, settings, margins)
    keys = [f"{kind}_opened_{b}" for kind in ("adv", "exc") for b in (*accuracy.BUDGETS, "all")]
    for margin, row in rows:
        _, scores = accuracy.evaluate(replace(settings, fractional_margin=margin, fractional_models=("auto",)))
        expected = accuracy.summary(scores)["auto"]
        for key in (*keys, "without_whole", "within_opened_without_whole"):
            assert row[key] == pytest.approx(expected[key], nan_ok=True), (margin, key)
    text = margin_sweep.table(rows, opened=True)
    service = f"| {DEFAULT_FRACTIONAL_MARGIN.relative:g} | {DEFAULT_FRACTIONAL_MARGIN.absolute:g} |"
    assert text[2].startswith(service) and "*" in text[2].split("|")[-3]
    assert text[3].startswith("| 1 | 0.1 |") and text[3].endswith(f" {rows[1][1]['within_opened_without_whole']} of "
                                                                  f"{rows[1][1]['without_whole']} |")


def test_margin_sweep_help_lists_its_own_options_and_the_benchmarks(capsys):
    with pytest.raises(SystemExit) as exited:
        margin_sweep.main(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "--relative" in shown and "--absolute" in shown and "--holdout" in shown
    with pytest.raises(SystemExit) as exited:
        margin_sweep.main(["--absolute", "0.01,-1"])
    assert exited.value.code == 2
    assert "margins must be numbers >= 0" in capsys.readouterr().err


def test_advice_of_a_known_curve_is_scored_against_the_truth():
    # The made-up path above (true impact 0.07 n; best in-budget n 1, 2, 4 for 0.1, 0.2, 0.3; none for 0.05).
    path = _seven_percent_path(accuracy, range(1, 9))
    ours, ns = path.ours_bps, path.ns
    # Knowing the truth itself: the best n at every budget that has one, never over.
    assert accuracy.known_curve_advice(path, ours, path.true_impact) == [(1.0, False)] * 3
    # A curve whose impact is half the truth's (0.035 n) advises 2, 5 and 8 streams; all over budget.
    assert accuracy.known_curve_advice(path, ours, path.true_impact / 2) == [(2.0, True), (2.5, True), (2.0, True)]
    # With a margin the budget is held to the raised impact: 0.07 n x 1.5 + 0.01 fits 0.2 up to n = 1 only.
    from advisor.tame import ImpactMargin
    assert accuracy.known_curve_advice(path, ours, path.true_impact, ImpactMargin(0.5, 0.01)) == [
        (1.0, False), (0.5, False), (0.5, False)]
    # A curve that sees every n over budget advises one stream.
    assert accuracy.known_curve_advice(path, ours, np.ones(len(ns))) == [(1.0, False), (0.5, False), (0.25, False)]


def test_impact_bound_study_scores_the_service_advice_at_zero_weight_and_only_widens_the_bound(tmp_path):
    # On the short real path: with no jackknife weight the study's advice is the service's whole
    # streams as benchmarks.accuracy scores them; a weight and a link-rate floor only raise the bound, so they
    # never advise more streams nor exceed the budget more often.
    from advisor.tame import DEFAULT_MARGIN
    from models.registry import MODELS, model_probes

    # n up to 40, so that the plan adds its third probe (at 40 streams) and each probe can be left out.
    settings = _short_real_path_settings(accuracy, tmp_path, models=("auto",), fractional_models=(),
                                         ns=(1, 2, 5, 10, 20, 40))
    paths, scores = accuracy.evaluate(settings)
    expected = accuracy.summary(scores)["auto"]
    (none, _, weighted), = [impact_bound_study.spread_rows(paths, "auto", [DEFAULT_MARGIN], [0.0, 0.5, 4.0])]
    assert none[2]["advice"] == pytest.approx(expected["adv_all"])
    assert none[2]["exceeded"] == pytest.approx(expected["exc_all"])
    assert none[2]["cross_p50"] == pytest.approx(expected["cross_p50"])
    assert weighted[2]["over"] <= none[2]["over"]
    (path,) = paths
    probes = model_probes("auto", path.probes, max(path.ns))
    fitted = MODELS["auto"](probes)
    left_out = impact_bound_study.left_out_fits("auto", probes)
    assert len(left_out) == len(probes) == 3
    ns = np.array([1.0, 5.0, 20.0, 40.0])
    spread = impact_bound_study.BoundedImpact.around(fitted, DEFAULT_MARGIN, 1.0, left_out).spread(ns)
    assert (spread >= 0).all() and spread.any()
    constant = np.asarray(impact_bound_study.BoundedImpact.around(fitted, DEFAULT_MARGIN).impact(ns))
    widened = impact_bound_study.BoundedImpact.around(fitted, DEFAULT_MARGIN, 1.0, left_out)
    assert (np.asarray(widened.impact(ns)) >= constant).all()
    # A link rate far below our throughput: impact 1.
    floored = impact_bound_study.BoundedImpact.around(fitted, DEFAULT_MARGIN, link_bps=1e6)
    assert np.allclose(floored.predicted_impact(ns), 1.0)
    capacity = impact_bound_study.capacity_score(paths, "auto", DEFAULT_MARGIN)
    assert capacity["over"] <= none[2]["over"] and capacity["cases"] == none[2]["cases"]


def test_margin_by_form_holds_each_fit_to_the_margin_of_its_own_form():
    from advisor.tame import NO_MARGIN, ImpactMargin
    from models.parallel import ProbePoint, fit_lu

    # Lu's fit names no form of its own: its form is its regime.
    fitted = fit_lu([ProbePoint(1, 44.7e6), ProbePoint(10, 98.1e6)])
    wide = ImpactMargin(0.5, 0.1)
    assert margin_by_form.form_of(fitted) == fitted.regime
    assert margin_by_form.MarginByForm(NO_MARGIN, ((fitted.regime, wide),)).for_fit(fitted) == wide
    assert margin_by_form.MarginByForm(NO_MARGIN, (("knee", wide),)).for_fit(fitted) == NO_MARGIN


def test_margin_by_form_study_keeps_the_service_advice_with_its_margin_and_adds_no_over_budget_case(tmp_path):
    # On the short real path: with the service's margin as the only choice, every form keeps it and the
    # study scores the advice exactly as benchmarks.accuracy does; with the whole grid, each form's chosen margin
    # adds no over-budget case and gets at least the service margin's mean ratio on that form's cases.
    from advisor.tame import DEFAULT_MARGIN, ImpactMargin

    settings = _short_real_path_settings(accuracy, tmp_path, models=("auto",), fractional_models=("auto",),
                                         ns=(1, 2, 5, 10, 20, 40))
    paths, scores = accuracy.evaluate(settings)
    expected = accuracy.summary(scores)["auto"]
    fits = margin_by_form.fitted_paths(paths, "auto")
    only_service, _ = margin_by_form.choose(fits, grid=(DEFAULT_MARGIN,))
    assert only_service.forms and all(margin == DEFAULT_MARGIN for _, margin in only_service.forms)
    row = margin_by_form.scored(paths, settings, only_service)
    for key in ("adv_all", "exc_all", "adv_opened_all", "exc_opened_all"):
        assert row[key] == pytest.approx(expected[key], nan_ok=True)
    # A margin that advises fewer streams for no budget kept is not chosen over the service's.
    wide = ImpactMargin(3.0, 0.3)
    chosen, rows = margin_by_form.choose(fits, grid=(wide, DEFAULT_MARGIN))
    assert dict(chosen.forms) == {"congested": DEFAULT_MARGIN}
    (_, _, _, _, _, wide_mean), (_, _, _, _, _, service_mean) = rows
    assert wide_mean < service_mean
    chosen, rows = margin_by_form.choose(fits)
    forms = {margin_by_form.form_of(fitted) for _, fitted in fits}
    assert {form for form, *_ in rows} == {form for form, _ in chosen.forms} == forms
    for form, margin in chosen.forms:
        tried = {m: (over, allowed, mean) for f, m, _, over, allowed, mean in rows if f == form}
        over, allowed, mean = tried[margin]
        assert over <= allowed and mean >= tried[DEFAULT_MARGIN][2]
