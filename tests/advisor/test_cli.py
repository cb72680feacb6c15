import json
import math
import os
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
    # n* = sqrt(12) = 3.46: three standard streams and one fractional stream, with what to open when the tool
    # has no fractional stream. Its FM is said once, on the line that says how to open it: the FM the tame
    # control is set to beside this host's control (models.tame_share), not the model's 1 / 0.4641^2 = 4.64.
    assert ("streams:                    open 4 streams: 3 standard + 1 fractional, or 3 standard "
            "streams if your tool cannot open a fractional stream") in result.stdout
    assert "how to open:                3 standard + 1 tame stream at FM " in result.stdout
    assert result.stdout.count("FM") == 1
    assert "on 3 standard streams" in result.stdout and "n*:  3.4641\n" in result.stdout
    # Below one stream the fractional stream is the transfer: n* = 0.657, FM 1 / 0.657^2 = 2.31.
    below = tame("fit", *PROBE_ARGS, "--max-impact", "0.05", "--model", "lu", "--no-margin")
    assert ("open 1 stream: 1 fractional, or 1 standard stream if your tool cannot open a "
            "fractional stream") in below.stdout
    assert "1 tame stream alone at FM " in below.stdout and "FM" not in below.stdout.splitlines()[0]
    # n* = 2 exactly (impact 1 - sqrt(4/8) = 0.2929 at 2 streams): no fractional stream to explain.
    whole = tame("fit", *PROBE_ARGS, "--max-impact", str(1 - math.sqrt(0.5) + 1e-6), "--model", "lu", "--no-margin")
    assert "streams:                    open 2 streams (all standard)\n" in whole.stdout
    # Below the smallest fractional stream nothing fits the budget: the streams line says so, as "how to open"
    # does (and `tame transfer`, which opens nothing), rather than "open 1 stream".
    none = tame("fit", *PROBE_ARGS, "--max-impact", "0.0002", "--model", "lu", "--no-margin")
    assert ("streams:                    none within the budget (n* 0.04); 1 standard stream is the fewest, "
            "over it\n") in none.stdout
    assert "how to open:                nothing: " in none.stdout and "open 1 stream" not in none.stdout


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


def test_curve_table_marks_the_advised_streams_within_a_budget_a_hair_below_a_bound():
    # The review's probe run bounds 3 streams at 0.806676 (auto, default margin); 1e-9 below it, the table and
    # the advice both stop at 2 streams, as the schedulers' view does.
    curve = json.loads(tame("curve", "--probe", "1:42e6", "--probe", "10:88e6", "--n-max", "5", "--json").stdout)["curve"]
    budget = curve[2]["impact_bound"] - 1e-9
    result = tame("curve", "--probe", "1:42e6", "--probe", "10:88e6", "--n-max", "5", "--max-impact", repr(budget))
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:6]]
    assert [row[-1] for row in rows] == ["yes", "yes", "no", "no", "no"], result.stdout
    (advised,) = [line for line in result.stdout.splitlines() if line.startswith("at budget")]
    assert "2 standard" in advised and "3 standard" not in advised, advised


@pytest.mark.parametrize("args, fragment", [
    (["--probe", "0:1e6", "--probe", "2:3e6"], "stream count must be a whole number between 1 and 1024"),
    (["--probe", "1:-5", "--probe", "2:3e6"], "from 1 up to 1e+15"),
    # The API's limits: a throughput of 1 Pbit/s or more is refused, not fitted with overflow warnings.
    (["--probe", "1:1e308", "--probe", "10:1e308"], "from 1 up to 1e+15"),
    (["--probe", "1:1e300", "--probe", "10:2e300"], "from 1 up to 1e+15"),
    (["--probe", "1:1e15", "--probe", "10:2e6"], "from 1 up to 1e+15"),
    (["--probe", "1:0.5", "--probe", "10:2e6"], "from 1 up to 1e+15"),
    (["--probe", "1:nan", "--probe", "10:2e6"], "STREAMS:BITS_PER_SECOND"),
    (["--probe", "1:inf", "--probe", "10:2e6"], "STREAMS:BITS_PER_SECOND"),
    (["--probe", "2000:1e6", "--probe", "10:2e6"], "between 1 and 1024"),
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


@pytest.mark.parametrize("model", ["auto", "full2", "yildirim"])
def test_too_few_levels_names_an_example_that_fits(model):
    # The message's example once gave two probes whatever the model needed: `--model full2` then failed again.
    result = tame("fit", "--probe", "1:1e6", "--model", model)
    assert result.returncode == 2
    example = result.stderr.split("(e.g. ", 1)[1].split(")", 1)[0].split()
    probes = [example[i + 1] for i, word in enumerate(example) if word == "--probe"]
    again = tame("fit", *example, "--model", model)
    assert again.returncode == 0 and len({p.split(":")[0] for p in probes}) >= (3 if model != "auto" else 2), \
        (result.stderr, again.stderr)


def test_curve_marks_the_budget_and_says_what_the_advice_opens():
    # Lu's curve with the bare rule at budget 0.5: impact(n) = 1 - sqrt(4 / (n^2 + 4)) <= 0.5 up to n = sqrt(12).
    result = tame("curve", *PROBE_ARGS, "--n-max", "5", "--model", "lu", "--no-margin", "--max-impact", "0.5",
                  "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["num_flows"] == 3 and payload["max_impact"] == 0.5
    assert_allclose(payload["tcp_equivalent_streams"], math.sqrt(12), atol=1e-4)
    assert [p["advisable"] and p["impact_bound"] <= 0.5 for p in payload["curve"]] == [True, True, True, False, False]
    table = tame("curve", *PROBE_ARGS, "--n-max", "5", "--model", "lu", "--no-margin", "--max-impact", "0.5")
    assert "at budget 50.0%: open 4 streams: 3 standard + 1 fractional at FM 4.64" in table.stdout


@pytest.mark.parametrize("option", [["--n-max", "5"], ["--model", "lu"], ["--no-margin"]])
def test_curve_of_a_known_dest_refuses_options_it_cannot_honour(tmp_path, option):
    result = subprocess.run([sys.executable, "-m", "advisor", "curve", "127.0.0.1", *option], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2 and option[0] in result.stderr and "stored fit" in result.stderr
    assert not list(tmp_path.iterdir())  # refused before opening any store


@pytest.mark.parametrize("levels, fragment", [("1", "2 to 8 different stream counts"),
                                              ("1,2,3,4,5,6,7,8,9", "2 to 8 different stream counts"),
                                              ("1,200", "more than iperf3 allows"),
                                              # Digits str.isdigit takes and int() does not ('²'), or reads as
                                              # another number (Arabic-Indic 10): whole ASCII numbers only.
                                              ("1,\u00b2", "not a positive integer"),
                                              ("1,\u0661\u0660", "not a positive integer")])
def test_advise_takes_the_levels_the_service_takes(levels, fragment):
    result = tame("advise", "127.0.0.1:9", "--max-impact", "0.1", "--levels", levels)
    assert result.returncode == 2 and fragment in result.stderr, result.stderr
    assert "iperf3" not in result.stderr.replace("iperf3 allows", "")  # refused before probing


@pytest.mark.parametrize("repeats", ["0", "\u00b2", "-1"])
def test_probe_repeats_must_be_a_positive_ascii_number(repeats):
    result = tame("probe", "127.0.0.1:9", "--repeats", repeats)
    assert result.returncode == 2 and "--repeats" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_url_as_destination_is_named_as_one():
    result = tame("advise", "http://127.0.0.1:5201/", "--max-impact", "0.1")
    assert result.returncode == 2
    assert "looks like a URL" in result.stderr and "brackets" not in result.stderr


@pytest.mark.parametrize("duration", ["500", "0.5", "x", "nan"])
def test_advise_takes_the_probe_duration_the_service_takes(duration):
    result = tame("advise", "127.0.0.1:9", "--max-impact", "0.1", "--duration", duration)
    assert result.returncode == 2 and "--duration" in result.stderr and "1 to 300" in result.stderr, result.stderr


def test_the_readme_s_fit_example_is_what_tame_fit_prints():
    # The README's first advice is a console block: its command, run now, prints exactly the lines shown.
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("```console\n$ tame fit ", 1)[1].split("```", 1)[0]
    command, shown = block.split("\n", 1)
    result = tame("fit", *command.split())
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown


@pytest.mark.parametrize("name, says", [
    # Were: a FileNotFoundError traceback, a matplotlib ValueError traceback, and PATH.png written silently.
    ("missing/curve.png", "cannot write it (No such file or directory)"),
    ("a-directory.png", "cannot write it (Is a directory)"),
    ("out.txt", "argument --plot: 'out.txt' does not end in .png"),
    ("no-extension", "argument --plot: 'no-extension' does not end in .png"),
])
def test_curve_plot_to_a_path_it_cannot_write_exits_2_writing_nothing(tmp_path, name, says):
    (tmp_path / "a-directory.png").mkdir()
    done = subprocess.run([sys.executable, "-m", "advisor", "curve", *PROBE_ARGS, "--plot", name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("tame curve: ") and says in done.stderr, done
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-directory.png"]


def test_curve_plot_writes_exactly_the_png_path_given(tmp_path):
    done = tame("curve", *PROBE_ARGS, "--plot", str(tmp_path / "Curve.PNG"))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["Curve.PNG"]
    assert (tmp_path / "Curve.PNG").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("probe", ["1_0:90e6", "\uff11\uff10:90e6", "10:9_0e6", "10:\uff19\uff10e6"])
def test_fit_probe_numbers_take_ascii_digits_only(probe):
    # Were read by int(): '1_0' and '１０' as 10 streams.
    done = tame("fit", "--probe", f"1:{rate(1)!r}", "--probe", probe, "--max-impact", "0.1")
    assert done.returncode == 2 and done.stderr.startswith(f"tame fit: --probe {probe!r}: "), done
    assert "Traceback" not in done.stderr


LONG = "x" * 100_000


@pytest.mark.parametrize("argv, env, starts", [
    (["fit", "--probe", "1:40e6", "--probe", LONG], {}, "tame fit: --probe 'xxx"),
    (["fit", "--probe", "1:40e6", "--probe", "10:90e6", "--max-impact", LONG], {},
     "tame fit: argument --max-impact: 'xxx"),
    (["paths"], {"TAME_TTL_S": LONG}, "tame paths: TAME_TTL_S='xxx"),
    (["paths"], {"TAME_DATABASE_URL": "sqlite:///" + LONG + "?"}, "tame paths: TAME_DATABASE_URL='sqlite:///xxx"),
])
def test_a_very_long_bad_value_is_not_echoed_whole(tmp_path, argv, env, starts):
    # Was echoed whole: 100 KB of value, 300 KB of stderr once escaped.
    done = subprocess.run([sys.executable, "-m", "advisor", *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/t.db", **env})
    assert done.returncode == 2 and done.stderr.startswith(starts), done.stderr[:200]
    assert len(done.stderr) < 1200 and "characters left out" in done.stderr, len(done.stderr)
    assert list(tmp_path.iterdir()) == []
