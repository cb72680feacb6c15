"""--congestion-control on the CLI: bad names and controls this kernel lacks exit 2 before anything runs;
`tame fit` calibrates the fractional stream against the control and names what would meet the budget."""

import json
import subprocess
import sys

import pytest

from advisor.alternatives import alternatives
from advisor.tame import tame_parallel_tcp
from models.parallel import ProbePoint
from probes.controls import available_controls

TAME = [sys.executable, "-m", "advisor"]
# A path where one stream costs the cross traffic 29 % (Lu's model with A = B: impact(1) = 1 - sqrt(1/2)).
PROBES = ["--probe", "1:35355339", "--probe", "10:49751859"]


def tame(*args, env=None):
    return subprocess.run([*TAME, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("command", [["probe", "127.0.0.1:9"], ["advise", "127.0.0.1:9", "--max-impact", "0.1"],
                                     ["fit", *PROBES], ["agent", "--dest-file", "/dev/null", "--once"]])
@pytest.mark.parametrize("name", ["BBR", "bbr!", "a" * 16, "1cubic", ""])
def test_a_bad_name_exits_2_saying_what_to_give(command, name, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TAME_DATABASE_URL": f"sqlite:///{tmp_path / 's.sqlite3'}"}
    done = tame(*command, "--congestion-control", name, env=env)
    assert done.returncode == 2, done.stderr
    assert "lowercase letters" in done.stderr and done.stdout == ""
    assert not (tmp_path / "s.sqlite3").exists()


@pytest.mark.parametrize("command", [["probe", "127.0.0.1:9"], ["advise", "127.0.0.1:9", "--max-impact", "0.1"],
                                     ["agent", "--dest-file", "/dev/null", "--once"]])
def test_a_local_probe_under_a_control_this_kernel_lacks_exits_2(command, tmp_path):
    assert "nosuchcc" not in available_controls()
    env = {"PATH": "/usr/bin:/bin", "TAME_DATABASE_URL": f"sqlite:///{tmp_path / 's.sqlite3'}"}
    done = tame(*command, "--congestion-control", "nosuchcc", env=env)
    assert done.returncode == 2
    assert "not available in this kernel" in done.stderr and "tcp_available_congestion_control" in done.stderr
    assert not (tmp_path / "s.sqlite3").exists()


def test_fit_calibrates_against_the_control_and_names_alternatives():
    done = tame("fit", *PROBES, "--model", "lu", "--max-impact", "0.1", "--congestion-control", "cubic", "--json")
    assert done.returncode == 0, done.stderr
    advice = json.loads(done.stdout)
    points = [ProbePoint(1, 35355339.0), ProbePoint(10, 49751859.0)]
    expected = tame_parallel_tcp(points, 0.1, model="lu", standard_control="cubic")
    assert advice["congestion_control"] == "cubic"
    # n* < 1: the fractional stream's FM comes from cubic's measured share law, not the theory bbr would get.
    assert advice["tcp_equivalent_streams"] < 1
    assert advice["fractional_multiplier"] == expected.fractional_multiplier
    assert advice["fractional_multiplier"] != tame_parallel_tcp(points, 0.1, model="lu",
                                                                standard_control="bbr").fractional_multiplier
    kinds = {a["congestion_control"]: a["kind"] for a in advice["alternatives"]}
    assert kinds["tame"] == "tame" and ("reno" not in available_controls() or kinds["reno"] == "probe")
    text = tame("fit", *PROBES, "--model", "lu", "--max-impact", "0.1", "--congestion-control", "cubic")
    assert "congestion control:         cubic" in text.stdout and "instead: " in text.stdout


def test_alternatives_are_empty_when_the_budget_is_met_and_skip_controls_not_offered():
    points = [ProbePoint(1, 35355339.0), ProbePoint(10, 49751859.0)]
    met = tame_parallel_tcp(points, 0.9, model="lu", standard_control="bbr")
    assert met.tcp_equivalent_streams >= 1 and alternatives("h:1", 0.9, "bbr", met, {}) == []
    unmet = tame_parallel_tcp(points, 0.1, model="lu", standard_control="bbr")
    out = alternatives("h:1", 0.1, "bbr", unmet, {}, available=("bbr", "cubic"))
    assert [a["congestion_control"] for a in out] == ["tame", "cubic"]
    # A measured control that fails too is named last, so nobody probes it again for nothing.
    out = alternatives("h:1", 0.1, "bbr", unmet, {"cubic": (unmet, 5.0)}, available=("bbr", "cubic", "reno"))
    assert [(a["congestion_control"], a["kind"], a["meets_budget"]) for a in out] == [
        ("tame", "tame", True), ("reno", "probe", None), ("cubic", "measured", False)]
