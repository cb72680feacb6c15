"""advisor.opening.how_to_open: the one place that says how to open an advice, and its command line."""

import shlex

import pytest

from advisor.advice import Advice
from advisor.commands.cc import setting_for
from advisor.opening import ADDRESS_PLACEHOLDER, how_to_open, opening_text
from advisor.tame import fractional_multiplier_for
from models.tame_share import LAWS


def advice(n_star: float, num_flows: int, fm: float | None, control: str | None = None) -> Advice:
    return Advice(num_flows=num_flows, fractional_multiplier=fm, tcp_equivalent_streams=n_star,
                  max_nondisruptive_throughput_bps=1e8, cross_traffic_impact=0.05, max_impact=0.1,
                  per_stream_buffer_bytes=None, model="lu", params={}, regime="congested", congestion_control=control)


def test_a_fractional_n_star_opens_whole_standard_streams_and_one_tame_stream_at_the_theory_fm():
    # "bbr" is not a measured control, so the FM^-1/2 theory holds: the remainder 0.5 needs FM 1/0.5^2 = 4.
    assert "bbr" not in LAWS
    got = how_to_open(advice(2.5, 2, 4.0, "bbr"), "10.0.0.2:5201", rtt_s=0.04)
    assert got == {"form": "fractional", "standard_streams": 2, "tame_streams": 1, "congestion_control": "tame",
                   "standard_control": "bbr", "fractional_multiplier": 4.0, "tcp_equivalent_streams": 2.5,
                   "rtt_s": 0.04, "address": "10.0.0.2",
                   "command": "tame cc apply 10.0.0.2 --tcp-equivalent 2.5 --rtt 0.04 --standard-control bbr",
                   "note": None, "max_aggregate_streams": 172}


@pytest.mark.parametrize("rtt_s", [0.0183, 0.04, 0.18])
@pytest.mark.parametrize("throughput_bps", [1e6, 1.3e7, 1e8])
def test_max_aggregate_streams_is_the_most_that_tame_transfer_opens_unwarned(rtt_s, throughput_bps):
    from advisor.tame import window_floor_warning

    got = how_to_open(Advice(**{**advice(2.5, 2, 4.0, "cubic").to_json(),
                                "max_nondisruptive_throughput_bps": throughput_bps}), "10.0.0.2", rtt_s=rtt_s)
    most, n_star_bps = got["max_aggregate_streams"], throughput_bps * 2.5 / 2
    assert window_floor_warning(most + 1, rtt_s, 2.5, n_star_bps) is not None
    assert most == 0 or window_floor_warning(most, rtt_s, 2.5, n_star_bps) is None
    # 2 segments of 1448 bytes a round trip per stream, below 0.8 of n*'s throughput together
    assert most * 2 * 1448 * 8 / rtt_s < 0.8 * n_star_bps <= (most + 1) * 2 * 1448 * 8 / rtt_s


@pytest.mark.parametrize("throughput_bps, says", [
    # n* 2.5 takes 125 Mbit/s: 172 streams' floors (579 kbit/s each at 40 ms) stay below 0.8 of it
    (1e8, "at most 172 scale to n* (tame transfer --streams N)"),
    # 1.25 Mbit/s: one stream's floor is 0.46 of it, two 0.93; the aggregate form needs 3
    (1e6, "none scale to n* at this RTT (their 2-segment windows alone send more)"),
])
def test_the_printed_advice_says_how_many_streams_of_one_control_scale_to_n_star(capsys, throughput_bps, says):
    from advisor.commands.common import print_advice

    got = Advice(**{**advice(2.5, 2, 4.0, "cubic").to_json(), "max_nondisruptive_throughput_bps": throughput_bps})
    print_advice(got, how_to_open(got, "10.0.0.2", rtt_s=0.04))
    assert f"N streams of one control:   {says}\n" in capsys.readouterr().out


def test_max_aggregate_streams_is_null_without_an_rtt():
    assert how_to_open(advice(2.5, 2, 4.0, "cubic"), "10.0.0.2", rtt_s=None)["max_aggregate_streams"] is None


@pytest.mark.parametrize("control", sorted(LAWS) + [None])
@pytest.mark.parametrize("n_star, rtt_s", [(2.3747, 0.04), (0.4668, 0.0123456789), (7.31, None)])
def test_the_fm_is_the_one_its_command_sets(control, n_star, rtt_s):
    got = how_to_open(advice(n_star, int(n_star) or 1, 1.5, control), "10.0.0.2", rtt_s=rtt_s)
    argv = shlex.split(got["command"])
    assert argv[:4] == ["tame", "cc", "apply", "10.0.0.2"]
    options = dict(zip(argv[4::2], argv[5::2]))
    # What `tame cc apply` computes from the command's own arguments (it parses them with float()).
    rtt = float(options["--rtt"]) if "--rtt" in options else None
    applied = setting_for(float(options["--tcp-equivalent"]), None, rtt, options.get("--standard-control"))
    assert applied.fractional_multiplier == got["fractional_multiplier"]
    assert applied.standard_streams == got["standard_streams"]
    assert got["fractional_multiplier"] == fractional_multiplier_for(n_star, rtt_s, control)


def test_a_whole_n_star_opens_plain_streams_and_no_command():
    got = how_to_open(advice(3.0, 3, None), "10.0.0.2", rtt_s=0.04)
    assert got["form"] == "standard" and got["standard_streams"] == 3 and got["tame_streams"] == 0
    assert got["command"] is None and got["congestion_control"] is None and got["fractional_multiplier"] is None
    assert opening_text(got) == "3 standard streams; no tame stream needed"


def test_below_one_stream_the_tame_stream_is_the_whole_transfer():
    got = how_to_open(advice(0.25, 1, 16.0, "bbr"), "[fd00::2]:5201")  # FM 1/0.25^2
    assert (got["standard_streams"], got["tame_streams"], got["fractional_multiplier"]) == (0, 1, 16.0)
    assert got["address"] == "fd00::2" and got["command"].startswith("tame cc apply fd00::2 ")
    assert opening_text(got).startswith("1 tame stream alone at FM 16")


def test_a_host_name_gets_a_placeholder_and_a_note_saying_to_resolve_it():
    got = how_to_open(advice(2.5, 2, 4.0), "dtn1.example.org:5201")
    assert got["address"] is None
    assert shlex.split(got["command"])[3] == ADDRESS_PLACEHOLDER
    assert "resolve dtn1.example.org" in got["note"]


def test_an_rtt_the_command_would_refuse_is_left_out():
    for bad in (0.0, -1.0, float("nan"), 11.0):
        got = how_to_open(advice(2.5, 2, 4.0), "10.0.0.2", rtt_s=bad)
        assert got["rtt_s"] is None and "--rtt" not in got["command"]
