"""Parsers of ping and iperf3 output, on outputs recorded from the test bed (tests/probes/data/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from numpy.testing import assert_allclose

from probes import pathcheck
from probes.netns import TestbedCommandFailed

DATA = Path(__file__).with_name("data")


def test_parse_ping_reads_samples_and_summary():
    # Recorded at 20 Mbit/s, 40 ms RTT: 20 replies, the first one slowed by neighbour discovery (43.7 ms).
    stats = pathcheck.parse_ping((DATA / "ping_40ms_2pct_loss.txt").read_text())
    assert stats.sent == 20 and len(stats.samples_s) == 20 and stats.loss_rate == 0.0
    assert_allclose(stats.samples_s[0], 0.0437)
    assert_allclose(stats.mdev_s, 0.741e-3)  # ping's own summary line
    # Sorted: fourteen samples of 40.2-40.3 ms first, so the median (10th of 20) is 40.2 ms and p99 (20th) the max.
    assert_allclose(stats.p50_s, 0.0402)
    assert_allclose(stats.p99_s, 0.0437)
    assert_allclose(stats.jitter_s, 0.0035)


def test_parse_ping_without_replies_raises():
    text = "PING 10.201.2.1 (10.201.2.1) 56(84) bytes of data.\n\n--- 10.201.2.1 ping statistics ---\n" \
           "3 packets transmitted, 0 received, 100% packet loss, time 2030ms\n"
    with pytest.raises(TestbedCommandFailed, match="no replies"):
        pathcheck.parse_ping(text)


def test_parse_iperf3_tcp_takes_receiver_rate():
    assert_allclose(pathcheck.parse_iperf3_tcp((DATA / "iperf3_tcp_2streams.json").read_text()), 16007350.108176995)


def test_parse_iperf3_udp_counts_lost_datagrams():
    result = pathcheck.parse_iperf3_udp((DATA / "iperf3_udp_5M.json").read_text())
    assert (result.packets, result.lost) == (521, 13)
    assert_allclose(result.loss_rate, 13 / 521)


def test_parse_iperf3_error_is_reported():
    with pytest.raises(TestbedCommandFailed, match="unable to connect"):
        pathcheck.parse_iperf3_tcp('{"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server"}')
