"""`tame advise` through a real namespace test bed: 50 Mbit/s, 40 ms RTT, 5 cross flows (issue 3)."""

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.iperf]


def test_advise_end_to_end(testbed_path):
    dest = f"{testbed_path.server_addr}:{testbed_path.server_port}"
    cc = testbed_path.testbed.spec.congestion_control
    done = subprocess.run(
        testbed_path.in_sender([sys.executable, "-m", "advisor", "advise", dest, "--max-impact", "0.2",
                                "--duration", "6", "--max-duration", "6", "--congestion-control", cc, "--json"]),
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    advice = json.loads(done.stdout)
    assert advice["dest"] == dest
    bottleneck = testbed_path.testbed.spec.rate_bps
    rates = {p["streams"]: p["throughput_bps"] for p in advice["probes"]}
    # The paired probes, then the default model's adaptive one at min(n_max = 64, 4 x 10) streams.
    assert set(rates) == {1, 10, 40}
    for streams, bps in rates.items():
        assert 0 < bps <= bottleneck, (streams, bps)
    # Against 5 long flows, 10 streams take a larger share of the bottleneck than 1 stream.
    assert rates[10] > rates[1]
    assert advice["num_flows"] >= 1 and 0 <= advice["cross_traffic_impact"] <= 1
    assert 0 < advice["max_nondisruptive_throughput_bps"] <= bottleneck * 1.05
    # progress was shown on stderr
    assert "stream(s)" in done.stderr


def test_advise_unreachable_fails_clearly(testbed_path):
    # A port with nothing listening in the receiver namespace: refused, exit 1, one clear line.
    done = subprocess.run(
        testbed_path.in_sender([sys.executable, "-m", "advisor", "advise", f"{testbed_path.server_addr}:5999",
                                "--max-impact", "0.1", "--json"]),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "nothing listening" in done.stderr
