"""`python -m benchmarks.tame_cc aggregate --merge`: several one-path aggregate reports fitted as one (no root, no
bed: it measures nothing)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"
MERGED = RESULTS / "tame-cc-aggregate-rtts.md"  # the aggregate law's report, merged from three one-path runs


def _merge_as(what: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.tame_cc", what, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def _merge(*args: str) -> subprocess.CompletedProcess:
    return _merge_as("aggregate", *args)


def _parts() -> list[Path]:
    """The reports the law's report was merged from, as the command on its first line names them."""
    from benchmarks.tame_cc import report_command

    words = report_command(MERGED).split()
    return [ROOT / p for p in words[words.index("--merge") + 1].split(",")]


def test_merging_the_law_s_three_runs_again_gives_its_report(tmp_path):
    out = tmp_path / "merged.md"
    done = _merge("--merge", ",".join(str(p) for p in _parts()), "--output", str(out))
    assert done.returncode == 0, done.stderr
    # all but the first line, which names this command
    assert out.read_text().splitlines()[1:] == MERGED.read_text().splitlines()[1:]
    assert json.loads(out.with_suffix(".json").read_text()) == json.loads(MERGED.with_suffix(".json").read_text())


def test_merge_without_output_is_refused_and_overwrites_nothing(tmp_path):
    before = {p: p.read_bytes() for p in RESULTS.glob("tame-cc-aggregate*")}
    try:
        done = _merge("--merge", ",".join(str(p) for p in _parts()))
        assert done.returncode == 2 and "--merge needs --output" in done.stderr
        assert {p: p.read_bytes() for p in RESULTS.glob("tame-cc-aggregate*")} == before
    finally:  # a regression must not leave the committed reports overwritten
        for p, content in before.items():
            p.write_bytes(content)


def test_merging_one_path_twice_or_another_n_star_is_refused(tmp_path):
    ten = RESULTS / "tame-cc-aggregate-10ms.md"
    out = tmp_path / "merged.md"
    done = _merge("--merge", f"{ten},{ten}", "--output", str(out))
    assert done.returncode != 0 and "that no other report holds" in done.stderr and not out.exists()
    # a report whose runs were scaled to n* = 3, merged as n* = 2
    three = tmp_path / "three.md"
    three.write_text(ten.read_text().replace("scaled to n* = 2 ", "scaled to n* = 3 ", 1))
    shutil.copy(ten.with_suffix(".json"), three.with_suffix(".json"))
    done = _merge("--merge", f"{three},{RESULTS / 'tame-cc-aggregate-100ms.md'}", "--output", str(out))
    assert done.returncode != 0 and "scaled its runs to n* = 3, not --n-star 2" in done.stderr and not out.exists()


@pytest.mark.parametrize("what", ["plan", "share"])
def test_merge_is_for_aggregate_reports_only(tmp_path, what):
    out = tmp_path / "x.md"
    done = _merge_as(what, "--merge", str(RESULTS / "tame-cc-aggregate-10ms.md"), "--output", str(out))
    assert done.returncode == 2 and "--merge is for aggregate reports" in done.stderr and not out.exists()


@pytest.mark.parametrize("first_line", ["", "# Aggregate form: N tame streams scaled to n* = . (`x`)",
                                        "# Share law (`python -m benchmarks.tame_cc share`)"])
def test_a_file_that_is_no_aggregate_report_is_refused_by_name(tmp_path, first_line):
    bogus = tmp_path / "bogus.md"
    bogus.write_text(first_line + "\n" if first_line else "")
    shutil.copy(RESULTS / "tame-cc-aggregate-10ms.json", bogus.with_suffix(".json"))
    out = tmp_path / "merged.md"
    done = _merge("--merge", f"{bogus},{RESULTS / 'tame-cc-aggregate-100ms.md'}", "--output", str(out))
    assert done.returncode != 0 and f"{bogus} is no aggregate report" in done.stderr and not out.exists()
    assert "Traceback" not in done.stderr
