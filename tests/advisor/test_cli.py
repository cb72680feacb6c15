import json
import math
import subprocess
import sys

import pytest
from numpy.testing import assert_allclose

from advisor.cli import COMMANDS
from advisor.tame import DEFAULT_FRACTIONAL_MARGIN, DEFAULT_MARGIN

A, B = 1e-16, 4e-16


def rate(n):
    return n / math.sqrt(A * n * n + B)


def tame(*args):
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, timeout=60)


PROBE_ARGS = ["--probe", f"1:{rate(1)!r}", "--probe", f"10:{rate(10)!r}"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_prints_its_help(command):
    # argparse %-formats help strings; a stray percent sign (the margin's "15%") once made
    # `tame fit --help`, `curve --help` and `advise --help` crash with a traceback.
    result = tame(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: tame {command}")
    assert "Traceback" not in result.stderr


def test_margin_help_names_the_service_margin():
    result = tame("fit", "--help")
    text = " ".join(result.stdout.split())
    for margin in (DEFAULT_MARGIN, DEFAULT_FRACTIONAL_MARGIN):
        assert f"{margin.relative:.0%} + {margin.absolute:g}" in text


def test_fit_json_fields_and_values():
    result = tame("fit", *PROBE_ARGS, "--max-impact", "0.5", "--model", "lu", "--no-margin", "--json")
    assert result.returncode == 0, result.stderr
    advice = json.loads(result.stdout)
    assert {"num_flows", "fractional_multiplier", "max_nondisruptive_throughput_bps", "cross_traffic_impact",
            "tcp_equivalent_streams", "per_stream_buffer_bytes", "model", "params", "regime", "warnings"} <= advice.keys()
    assert advice["model"] == "lu" and advice["num_flows"] == 3
    assert_allclose(advice["params"]["a_prime"], A, rtol=1e-6)
    assert_allclose(advice["tcp_equivalent_streams"], math.sqrt(12), atol=1e-4)


def test_fit_human_output():
    result = tame("fit", *PROBE_ARGS, "--max-impact", "0.5", "--model", "lu", "--no-margin")
    assert result.returncode == 0
    assert "streams to open:            3" in result.stdout
    # n* = sqrt(12) = 3.46: three standard streams and one fractional stream of FM 1 / 0.4641^2 = 4.64.
    assert "n*:  3.46, opened as 3 standard streams + 1 fractional stream (fractional multiplier 4.64)" in result.stdout
    # Below one stream the fractional stream is the transfer: n* = 0.657, FM 1 / 0.657^2 = 2.31.
    below = tame("fit", *PROBE_ARGS, "--max-impact", "0.05", "--model", "lu", "--no-margin")
    assert "n*:  0.66, opened as 1 fractional stream (fractional multiplier 2.31)" in below.stdout


def test_fit_keeps_a_margin_for_the_prediction_error_by_default():
    # Lu's curve: impact(n) = 1 - sqrt(4 / (n^2 + 4)). With the default margin the budget 0.5 holds
    # 1.15 impact + 0.02 <= 0.5, i.e. impact <= 0.41739: n = 2.7909, two whole streams; the fractional
    # stream's margin holds 1.2 impact + 0.03 <= 0.5, i.e. impact <= 0.39167: n* = 2.6094 as opened.
    result = tame("fit", *PROBE_ARGS, "--max-impact", "0.5", "--model", "lu", "--json")
    advice = json.loads(result.stdout)
    assert advice["num_flows"] == 2
    n_star = math.sqrt(4 * (1 / (1 - 0.47 / 1.2) ** 2 - 1))
    assert_allclose(advice["tcp_equivalent_streams"], n_star, atol=1e-4)
    assert_allclose(advice["fractional_multiplier"], 1 / (n_star - 2) ** 2, rtol=1e-3)


def test_curve_json():
    result = tame("curve", *PROBE_ARGS, "--n-max", "5", "--model", "lu", "--json")
    payload = json.loads(result.stdout)
    assert payload["model"] == "lu" and set(payload["params"]) == {"a_prime", "b_prime"}
    assert [p["streams"] for p in payload["curve"]] == [1, 2, 3, 4, 5]
    assert_allclose([p["throughput_bps"] for p in payload["curve"]], [rate(n) for n in range(1, 6)], rtol=1e-6)
    assert_allclose(payload["curve"][1]["impact"], 1 - math.sqrt(0.5), rtol=1e-6)
    # The bound is the impact raised by the default margin: 1.15 x 0.29289 + 0.02.
    assert_allclose(payload["curve"][1]["impact_bound"], 1.15 * (1 - math.sqrt(0.5)) + 0.02, rtol=1e-6)


def test_curve_table():
    result = tame("curve", *PROBE_ARGS, "--n-max", "3")
    assert result.returncode == 0 and len(result.stdout.strip().splitlines()) == 4


@pytest.mark.parametrize("args, fragment", [
    (["--probe", "0:1e6", "--probe", "2:3e6"], "stream count must be >= 1"),
    (["--probe", "1:-5", "--probe", "2:3e6"], "positive"),
    (["--probe", "1:abc", "--probe", "2:3e6"], "STREAMS:BITS_PER_SECOND"),
    (["--probe", "1:1e6", "--probe", "1:2e6"], "different stream counts"),
    (["--probe", "1:1e6", "--probe", "5:2e6", "--max-impact", "1.5"], "outside [0, 1]"),
    (["--probe", "1:1e6", "--probe", "5:2e6", "--max-impact", "x"], "not a number"),
    (["--probe", "1:1e6", "--probe", "5:2e6", "--model", "full2"], "3 different stream counts"),
])
def test_bad_input_exits_nonzero_with_one_line(args, fragment):
    result = tame("fit", *args)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
