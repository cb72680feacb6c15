"""The FM -> share law of the tame congestion control (models.tame_share)."""

import math
import re
from pathlib import Path

import pytest
from numpy.testing import assert_allclose

from models.tame_share import AGGREGATE_LAWS, LAWS, SHARED_LOSS_THEORY, ShareLaw, aggregate_law_for, law_for

LAW = ShareLaw(exponent=0.6, base_share=((0.010, 1.0), (0.100, 0.5)), measured=True, source="test")


def test_base_share_is_interpolated_in_log_rtt_and_held_outside_the_measured_range():
    assert LAW.base(0.010) == 1.0 and LAW.base(0.100) == 0.5
    assert_allclose(LAW.base(math.sqrt(0.010 * 0.100)), 0.75)  # halfway in log RTT
    assert LAW.base(0.001) == 1.0 and LAW.base(1.0) == 0.5
    assert LAW.base(None) == 0.5  # unknown RTT: the middle measured point (here the second of two)


@pytest.mark.parametrize("fm", [1.0, 1.5, 4.0, 10.0, 30.0, 100.0])
@pytest.mark.parametrize("rtt_s", [0.005, 0.02, 0.1])
def test_multiplier_for_inverts_share(fm, rtt_s):
    assert_allclose(LAW.multiplier_for(LAW.share(fm, rtt_s), rtt_s), fm)


def test_a_share_above_what_fm_one_takes_gets_fm_one():
    assert LAW.multiplier_for(0.9, 0.100) == 1.0  # s1 = 0.5 at 100 ms: tame falls short, never over


def test_theory_for_unmeasured_controls_is_one_over_r_squared():
    assert law_for("bbr") is SHARED_LOSS_THEORY and law_for(None) is SHARED_LOSS_THEORY
    assert not SHARED_LOSS_THEORY.measured
    assert_allclose(SHARED_LOSS_THEORY.multiplier_for(0.5, 0.04), 4.0)
    assert_allclose(SHARED_LOSS_THEORY.share(9.0, None), 1 / 3)


def _check_law_against_its_report(name, law):
    """The law's k and every s1 as its source report printed them (returned), in a plausible range."""
    root = Path(__file__).resolve().parents[2]
    assert law.measured and law.source.startswith("benchmarks/results/"), name
    report = (root / law.source).read_text()
    assert f"k = {law.exponent:.3f}" in report, name  # the fitted exponent as the benchmark printed it
    printed_s1 = [float(v) for v in re.findall(r"s1\([0-9.]+ ms\) = ([0-9.]+)", report)]
    assert [s for _, s in law.base_share] == printed_s1, name  # and every s1, in RTT order
    # about shared-loss AIMD (1/2) up to synchronised AIMD (1)
    assert 0.45 <= law.exponent <= 1.0, name
    rtts = [r for r, _ in law.base_share]
    assert rtts == sorted(rtts) and all(0 < s <= 1.5 for _, s in law.base_share), name
    return report


def test_measured_laws_come_from_the_results_file_they_name():
    root = Path(__file__).resolve().parents[2]
    # The fractional form's s1 is keyed by the RTT the service measured on those paths (benchmarks.tame_cc rtt
    # --standard NAME), row for row
    for name, law in LAWS.items():
        _check_law_against_its_report(name, law)
        rtt_report = (root / "benchmarks/results" / ("tame-cc-rtt.md" if name == "cubic" else f"tame-cc-rtt-{name}.md"))
        measured = [ms for ms in re.findall(r"^\| [0-9.]+ ms \| ([0-9.]+) ms \|", rtt_report.read_text(),
                                                         re.MULTILINE)]
        assert [f"{r * 1000:.1f}" for r, _ in law.base_share] == measured, name
    # the aggregate form's by the RTT its own run measured, printed in its report
    for name, law in AGGREGATE_LAWS.items():
        report = _check_law_against_its_report(name, law)
        for rtt_s, _ in law.base_share:
            assert f"s1({rtt_s * 1000:.1f} ms)" in report, (name, rtt_s)
        fitted_fms = re.search(r"FM ([0-9.]+)-([0-9.]+);", report)
        assert float(fitted_fms[2]) == law.max_calibrated_fm, name  # the top of the range it was fitted over


def test_the_aggregate_form_falls_back_to_the_fractional_form_s_law():
    assert aggregate_law_for("cubic") is AGGREGATE_LAWS["cubic"]
    assert aggregate_law_for("reno") is LAWS["reno"] and aggregate_law_for("bbr") is SHARED_LOSS_THEORY


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_bad_shares_and_multipliers_are_refused(bad):
    with pytest.raises(ValueError):
        LAW.multiplier_for(bad, 0.04)


@pytest.mark.parametrize("fm", [0.5, float("nan")])
def test_fm_below_one_is_refused(fm):
    with pytest.raises(ValueError):
        LAW.share(fm, 0.04)


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"
REBUILT_REPORTS = sorted({law.source for law in [*LAWS.values(), *AGGREGATE_LAWS.values()]}
                         | {f"benchmarks/results/{p.name}" for p in RESULTS.glob("tame-cc-aggregate*.md")})


@pytest.mark.parametrize("source", REBUILT_REPORTS)
def test_each_law_s_report_is_what_the_benchmark_makes_of_its_measured_runs(source):
    """The fit a law copies is the benchmark's own, from the runs kept beside the report (.json): the report rebuilt
    from them is the file, fit line and all; so is every aggregate report, law or validation."""
    import json

    from benchmarks import tame_cc

    report = (Path(__file__).resolve().parents[2] / source)
    text = report.read_text()
    record = json.loads(report.with_suffix(".json").read_text())
    runs = [tame_cc.Run(**r) for r in record["runs"]]
    command = tame_cc.report_command(report)
    if " aggregate " in command:
        lines = tame_cc.aggregate_report(runs, command, tame_cc.report_n_star(report), record.get("measured_by"))
    else:
        lines = tame_cc.share_report(runs, command)
    assert "\n".join(lines) + "\n" == text


def test_a_law_covers_the_rtts_it_was_measured_at_and_a_reach_either_side():
    from models.tame_share import RTT_REACH

    assert LAW.covers_rtt(0.010) and LAW.covers_rtt(0.100) and LAW.covers_rtt(0.04)
    assert LAW.covers_rtt(0.010 / RTT_REACH) and LAW.covers_rtt(0.100 * RTT_REACH)
    assert not LAW.covers_rtt(0.010 / RTT_REACH * 0.99) and not LAW.covers_rtt(0.100 * RTT_REACH * 1.01)
