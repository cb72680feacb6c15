"""`tame testbed` option parsing (pure) and one real up/status/down round trip (root)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from numpy.testing import assert_allclose

from advisor.cli import UsageError, build_parser, main
from advisor.commands import testbed as cmd


@pytest.mark.parametrize("text, bps", [("100M", 100e6), ("100Mbit", 100e6), ("1e8", 1e8), ("2.5G", 2.5e9), ("500k", 5e5)])
def test_parse_rate(text, bps):
    assert_allclose(cmd.parse_rate(text), bps)


@pytest.mark.parametrize("text, seconds", [("40ms", 0.04), ("0.04", 0.04), ("0.04s", 0.04), ("40000us", 0.04)])
def test_parse_rtt(text, seconds):
    assert_allclose(cmd.parse_rtt(text), seconds)


@pytest.mark.parametrize("text, nbytes", [("500000", 500_000), ("500k", 500_000), ("100p", 151_400), ("1M", 1_000_000)])
def test_parse_queue(text, nbytes):
    assert cmd.parse_queue(text) == nbytes


@pytest.mark.parametrize("text, fraction", [("0.001", 0.001), ("0.1%", 0.001), ("0", 0.0)])
def test_parse_loss(text, fraction):
    assert_allclose(cmd.parse_loss(text), fraction)


@pytest.mark.parametrize("parse, text, hint", [
    (cmd.parse_rate, "fast", "--rate 100M"),
    (cmd.parse_rtt, "-5ms", "--rtt 40ms"),
    (cmd.parse_queue, "lots", "--queue 300p"),
    (cmd.parse_loss, "150%", "below 1"),
    # Were: 0 bytes, and OverflowError (inf) on the way to int.
    (cmd.parse_queue, "0.1", "--queue '0.1': give bytes"),
    (cmd.parse_queue, "1e308M", "--queue '1e308M': give bytes"),
    (cmd.parse_queue, "1e300p", "--queue '1e300p': give bytes"),
    (cmd.parse_rate, "1e300G", "--rate '1e300G': give bits/s"),
])
def test_bad_values_say_what_to_fix(parse, text, hint):
    with pytest.raises(UsageError, match=hint):
        parse(text)


def test_bad_spec_is_a_usage_error(capsys):
    assert main(["testbed", "up", "--name", "Not_Valid"]) == 2
    assert "lowercase letters or digits" in capsys.readouterr().err


def test_default_queue_is_one_bdp():
    parsed = build_parser().parse_args(["testbed", "up", "--rate", "50M", "--rtt", "40ms"])
    # 50e6 bit/s * 0.04 s / 8 = 250 000 bytes.
    assert cmd.spec_from_args(parsed).queue_bytes == 250_000


@pytest.mark.netns
def test_cli_up_status_down(capsys):
    name = f"c{os.getpid()}"[:12]
    assert main(["testbed", "up", "--rate", "10M", "--rtt", "10ms", "--name", name]) == 0
    try:
        assert f"tpt-{name}-s" in capsys.readouterr().out
        assert main(["testbed", "status"]) == 0
        assert f"{name}: up, 10 Mbit/s, RTT 10 ms" in capsys.readouterr().out
    finally:
        assert main(["testbed", "down", "--name", name]) == 0
    assert main(["testbed", "down", "--name", name]) == 1
    assert "no test bed" in capsys.readouterr().err


def test_the_shared_bed_takes_no_loss_cross_traffic_or_control(capsys):
    for extra in (["--loss", "0.01"], ["--cross-flows", "2"], ["--cc", "reno"]):
        assert main(["testbed", "up", "--shared", "--name", "nope", *extra]) == 2
        assert "--shared takes --rate, --rtt, --queue and --name only" in capsys.readouterr().err


@pytest.mark.netns
def test_cli_up_down_shared(capsys):
    name = f"s{os.getpid()}"[:12]
    assert main(["testbed", "up", "--shared", "--rate", "20M", "--rtt", "0", "--name", name, "--json"]) == 0
    try:
        bed = json.loads(capsys.readouterr().out)
        assert set(bed["sources"]) == {"s1", "s2"} and set(bed["destinations"]) == {"d1", "d2"}
        for dest in bed["destinations"].values():
            host, port = dest["addr"].split(":")
            # Each destination's iperf3 answers from either source, through the one bottleneck.
            for src_ns in bed["sources"].values():
                done = subprocess.run(["ip", "netns", "exec", src_ns, "iperf3", "-c", host, "-p", port, "-t", "1",
                                       "-J"], capture_output=True, text=True, timeout=30)
                assert done.returncode == 0, done.stdout[-500:]
                assert 0 < json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"] < 21e6
    finally:
        assert main(["testbed", "down", "--shared", "--name", name]) == 0
    assert not [ns for ns in os.listdir("/run/netns") if ns.startswith(f"tps-{name}-")]
    assert main(["testbed", "down", "--shared", "--name", name]) == 1


@pytest.mark.parametrize("argv, says", [
    # Were OverflowError tracebacks: the default queue, int(rate * rtt / 8), was computed before the spec was checked.
    (["--rate", "1e300G"], "--rate '1e300G': give bits/s"),
    (["--rtt", "1e308s"], "rtt_s must be between 0 and 2 seconds"),
    (["--rate", "10G", "--rtt", "1e308"], "rtt_s must be between 0 and 2 seconds"),
    (["--shared", "--rtt", "1e308s"], "rtt_s must be between 0 and 2 seconds"),
])
def test_out_of_range_rates_and_rtts_exit_2_before_anything_is_built(monkeypatch, capsys, argv, says):
    def nothing_built(*args, **kwargs):
        raise AssertionError("a refused test bed was built")

    monkeypatch.setattr(cmd.testbed, "up", nothing_built)
    monkeypatch.setattr(cmd.sharedbed, "up", nothing_built)
    assert main(["testbed", "up", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tame testbed: ") and says in err, err
