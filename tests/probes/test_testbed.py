"""The namespace test bed, measured for real: RTT, jitter, bottleneck rate, loss, clean removal.

Every test here builds its own bed with a unique name and a private state directory,
so runs never touch each other's namespaces. They need root (CI runs them as root).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.auto import RANDOM_DROP_DISPERSION
from models.evidence import loss_dispersion
from models.parallel import ProbePoint
from probes import delayline, pathcheck, testbed
from probes.netns import process_start_ticks

netns = pytest.mark.netns
PORT = 5201


def _prefixed_namespaces(name: str) -> list[str]:
    return [n for n in os.listdir("/run/netns") if n.startswith(f"tpt-{name}-")] if os.path.isdir("/run/netns") else []


@pytest.fixture(scope="module")
def wan100(tmp_path_factory, bed_name):
    """100 Mbit/s, 40 ms RTT, one bandwidth-delay product of queue (500 kB), no loss or cross traffic."""
    state_dir = tmp_path_factory.mktemp("state")
    spec = testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.040, queue_bytes=500_000, name=bed_name("w"))
    tb = testbed.up(spec, state_dir=state_dir)
    try:
        yield tb
    finally:
        testbed.down(spec.name, state_dir=state_dir)


@netns
def test_up_then_down_leaves_nothing(tmp_path, bed_name):
    spec = testbed.TestbedSpec(rate_bps=20e6, rtt_s=0.010, queue_bytes=50_000, loss_rate=0.01, cross_flows=2,
                               name=bed_name("u"))
    tb = testbed.up(spec, state_dir=tmp_path)
    try:
        _check_complete(tb, tmp_path)
    except BaseException:
        testbed.down(spec.name, state_dir=tmp_path)
        raise
    record = json.loads((tmp_path / f"{spec.name}.json").read_text())
    pids = [p["pid"] for p in record["processes"]]

    testbed.down(spec.name, state_dir=tmp_path)

    assert _prefixed_namespaces(spec.name) == []
    assert all(process_start_ticks(pid) is None for pid in pids)
    assert list(tmp_path.iterdir()) == []  # state file and logs gone
    assert [b for b in testbed.status(state_dir=tmp_path) if b.name.startswith(f"tpt-{spec.name}-")] == []


def _check_complete(tb: testbed.Testbed, state_dir: Path) -> None:
    spec = tb.spec
    record = json.loads((state_dir / f"{spec.name}.json").read_text())
    pids = [p["pid"] for p in record["processes"]]
    assert sorted(_prefixed_namespaces(spec.name)) == sorted([tb.sender_ns, tb.router_ns, tb.receiver_ns, tb.cross_sender_ns])
    assert {p["label"] for p in record["processes"]} == {"delay-forward", "delay-reverse", "cross-server", "cross-client"}
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    assert tb.default_congestion_control in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    [bed] = [b for b in testbed.status(state_dir=state_dir) if b.name == spec.name]
    assert bed.complete and all(bed.namespaces.values()) and all(bed.processes.values())
    def bottleneck():
        return json.loads(subprocess.run(tb.exec_in(tb.router_ns, ["tc", "-s", "-j", "qdisc", "show", "dev", "tpt-d"]),
                                         capture_output=True, text=True, check=True, timeout=10).stdout)[0]

    assert bottleneck()["kind"] == "tbf"
    # The cross flows cross the bottleneck: 1 MB through it (under half a second at 20 Mbit/s). Polled with a
    # generous bound, not timed: with 1 % loss a flow can sit out a retransmission timeout first.
    deadline = time.monotonic() + 30
    while bottleneck()["bytes"] <= 1e6:
        assert time.monotonic() < deadline, "the cross flows moved under 1 MB through the bottleneck in 30 s"
        time.sleep(0.2)


# This VM's host sometimes stalls the machine for milliseconds, and in some minutes often: seen, single replies
# at 47-55 ms, p99 - p50 over 2 ms in three runs in a row, and 84 Mbit/s through a 100 Mbit/s bed in the same
# half minute (kdamond was running). A stall only ever adds delay and takes rate. So these tests check what a
# stall cannot fake, on the best of up to STALL_TRIES measurements: the configured delay is there (not missing,
# not doubled), no queue builds up, the rate is there. Sub-millisecond jitter is a figure, not a test:
# ``python -m benchmarks.testbed_check`` prints mean, mdev, p99 - p50 and the delay line's own lateness.
STALL_TRIES = 3


def _best_of(measure, acceptable):
    """The first of up to STALL_TRIES measurements that is ``acceptable``, else the last one."""
    for _ in range(STALL_TRIES):
        result = measure()
        if acceptable(result):
            break
    return result


def _holds_configured_rtt(rtt: pathcheck.RttStats) -> bool:
    """The delay line holds the configured 40 ms: median within 1 ms of it, 9 in 10 replies within 2 ms of the median."""
    ordered = sorted(rtt.samples_s)
    p90_s = ordered[math.ceil(0.9 * len(ordered)) - 1]
    return 0.040 <= rtt.p50_s <= 0.041 and p90_s - rtt.p50_s <= 0.002


@netns
def test_rtt_is_configured_rtt(wan100):
    rtt = _best_of(lambda: pathcheck.ping(wan100, count=200, interval_s=0.01), _holds_configured_rtt)
    # The delay line holds each direction 20 ms; veths, forwarding and the verdict round trip add ~0.1-0.3 ms.
    assert rtt.loss_rate == 0.0
    assert 0.040 <= min(rtt.samples_s)
    assert _holds_configured_rtt(rtt), rtt


@netns
def test_delay_line_keeps_rtt_stable_at_100_mbit(tmp_path, bed_name):
    # 100 Mbit/s of UDP crosses the delay line while we ping. The bottleneck is raised to 1 Gbit/s so that no
    # queue forms behind the (bursty) UDP sender: what is left of the RTT variation is the delay line's own.
    spec = testbed.TestbedSpec(rate_bps=1e9, rtt_s=0.040, queue_bytes=5_000_000, name=bed_name("j"))
    tb = testbed.up(spec, state_dir=tmp_path)
    try:
        with pathcheck.iperf3_server(tb, PORT):
            rtt = _best_of(lambda: pathcheck.ping_under_udp_load(tb, PORT, load_bps=100e6, count=200, interval_s=0.01),
                           _holds_configured_rtt)
    finally:
        testbed.down(spec.name, state_dir=tmp_path)
    assert _holds_configured_rtt(rtt), rtt


@netns
def test_bottleneck_rate_is_configured_rate(wan100):
    # tbf counts 1514-byte frames, of which 1448 bytes are TCP payload (20 IP + 32 TCP with timestamps + 14
    # Ethernet): a full pipe carries 100e6 * 1448 / 1514 = 95.6 Mbit/s of goodput.
    def carries_configured_rate(goodput_bps: float) -> bool:
        return 0.90 * 100e6 <= goodput_bps <= 100e6

    with pathcheck.iperf3_server(wan100, PORT):
        goodput_bps = _best_of(lambda: pathcheck.tcp_throughput(wan100, PORT, seconds=3, streams=2, omit_s=1),
                               carries_configured_rate)
    assert carries_configured_rate(goodput_bps), goodput_bps


@netns
def test_loss_rate_is_applied(tmp_path, bed_name):
    spec = testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.010, queue_bytes=200_000, loss_rate=0.05, name=bed_name("l"))
    tb = testbed.up(spec, state_dir=tmp_path)
    try:
        with pathcheck.iperf3_server(tb, PORT):
            result = pathcheck.udp_transfer(tb, PORT, rate_bps=20e6, seconds=2, size_bytes=1200)
    finally:
        testbed.down(spec.name, state_dir=tmp_path)
    # 20 Mbit/s of 1200-byte datagrams for 2 s is ~4170 packets; binomial sd = sqrt(4170 * 0.05 * 0.95) = 14
    # packets = 0.34 %. The kernel's numgen random cannot be seeded, so allow 5 sd (1.7 %).
    assert result.packets > 3000
    assert abs(result.loss_rate - 0.05) < 0.017, result


@netns
def test_down_refuses_a_name_it_did_not_create(tmp_path, bed_name):
    name = bed_name("f")
    foreign = f"tpt-{name}-s"
    subprocess.run(["ip", "netns", "add", foreign], check=True, timeout=10)
    try:
        with pytest.raises(testbed.TestbedNotOwned):
            testbed.down(name, state_dir=tmp_path)
        with pytest.raises(testbed.TestbedExists):
            testbed.up(testbed.TestbedSpec(rate_bps=10e6, rtt_s=0.01, queue_bytes=20_000, name=name), state_dir=tmp_path)
        assert foreign in _prefixed_namespaces(name)  # left alone
        assert [b.owned for b in testbed.status(state_dir=tmp_path) if b.name == foreign] == [False]
    finally:
        subprocess.run(["ip", "netns", "del", foreign], check=True, timeout=10)


@netns
def test_down_leaves_a_namespace_that_was_replaced(tmp_path, bed_name):
    spec = testbed.TestbedSpec(rate_bps=10e6, rtt_s=0.0, queue_bytes=20_000, name=bed_name("r"))
    tb = testbed.up(spec, state_dir=tmp_path)
    # Someone deletes our receiver namespace and creates their own under the same name.
    subprocess.run(["ip", "netns", "del", tb.receiver_ns], check=True, timeout=10)
    subprocess.run(["ip", "netns", "add", tb.receiver_ns], check=True, timeout=10)
    try:
        with pytest.raises(testbed.TestbedNotOwned, match=tb.receiver_ns):
            testbed.down(spec.name, state_dir=tmp_path)
        assert _prefixed_namespaces(spec.name) == [tb.receiver_ns]
    finally:
        subprocess.run(["ip", "netns", "del", tb.receiver_ns], check=True, timeout=10)


@netns
def test_down_leaves_a_namespace_without_our_mark(tmp_path, bed_name):
    # Same namespace (inode) but our mark on its interface is gone: we can no longer prove it is ours.
    spec = testbed.TestbedSpec(rate_bps=10e6, rtt_s=0.0, queue_bytes=20_000, name=bed_name("m"))
    tb = testbed.up(spec, state_dir=tmp_path)
    subprocess.run(["ip", "-n", tb.sender_ns, "link", "set", "lo", "alias", "someone-else"], check=True, timeout=10)
    try:
        with pytest.raises(testbed.TestbedNotOwned, match="lacks our mark"):
            testbed.down(spec.name, state_dir=tmp_path)
        assert _prefixed_namespaces(spec.name) == [tb.sender_ns]
    finally:
        subprocess.run(["ip", "netns", "del", tb.sender_ns], check=True, timeout=10)


@netns
def test_failed_up_removes_what_it_built(tmp_path, monkeypatch, bed_name):
    # A delay line that cannot start makes up() fail after the namespaces, links and qdiscs exist.
    cache = tmp_path / "cache"
    monkeypatch.setenv("TAMEPARALLEL_CACHE", str(cache))
    cache.mkdir()
    broken = delayline.binary()
    broken.write_text("#!/bin/sh\necho 'cannot bind queue' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    state_dir = tmp_path / "state"
    spec = testbed.TestbedSpec(rate_bps=10e6, rtt_s=0.02, queue_bytes=20_000, name=bed_name("b"))
    with pytest.raises(testbed.TestbedError, match="cannot bind queue"):
        testbed.up(spec, state_dir=state_dir)
    assert _prefixed_namespaces(spec.name) == []
    assert list(state_dir.iterdir()) == []


@netns
def test_fixture_path_serves_iperf3_through_the_bottleneck(testbed_path):
    done = subprocess.run(testbed_path.client_argv("-J", "-t", "2", "-O", "1"), capture_output=True, text=True,
                          timeout=20)
    goodput_bps = pathcheck.parse_iperf3_tcp(done.stdout)
    # One new flow against 5 established cross flows on 50 Mbit/s (47.8 Mbit/s of goodput): about a sixth,
    # 8 Mbit/s, less while it is still growing; far below half unless the cross traffic were missing.
    assert 0 < goodput_bps < 25e6


@netns
def test_accuracy_benchmark_fits_the_default_to_the_probes_the_service_runs(tmp_path):
    # The buffer-limited bed (64 KB socket buffers, 100 Mbit/s, 40 ms): one stream is window-limited and sees no
    # losses, ten fill the link. The default model can only call that a knee from the probes' losses and RTT, and
    # it adds its third probe at 4 x 10 = 40 streams; a throughput-only fit would be the fair share on two probes.
    report = tmp_path / "testbed.md"
    root = Path(__file__).resolve().parents[2]

    def run_benchmark() -> dict:
        done = subprocess.run([sys.executable, "-m", "benchmarks.testbed_accuracy", "--quick",
                               "--paths", "buffer", "--output", str(report)],
                              cwd=root, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        [result] = json.loads(report.with_suffix(".json").read_text())["results"]
        return result["plan"]["probes"][0]

    # The one stream (16 Mbit/s, window-limited far below the link) loses nothing to congestion, but a stray
    # retransmission (a tail-loss probe, a delay-line stall on a busy machine) now and then lands in its 5 s probe,
    # and one retransmission of its ~7,000 segments reads as its Reno rate (models.evidence: fraction 0.55). The
    # quick preset's probe is too short to tell one stray loss from congestion; the service's 30 s probe is not
    # (fraction 0.23). Such a run is measured once more; a second stray loss in a row fails the test.
    if run_benchmark()["retransmits"]:
        assert not run_benchmark()["retransmits"], "the window-limited stream lost segments in two runs in a row"
    text = report.read_text()
    probes = next(line for line in text.splitlines() if line.startswith("Probes (idle RTT"))
    assert [int(n) for n in re.findall(r"n=(\d+):", probes)] == [1, 10, 40]
    assert "n=1: " in probes and probes.split("n=10:")[0].rstrip(", ").endswith("not loss-limited)")
    auto = next(line for line in text.splitlines() if line.startswith("Model `auto`"))
    assert "linear_until_streams=1," in auto and "plateau_until_streams=10," in auto
    # lu is fitted to its own two levels, not to the adaptive probe.
    assert re.search(r"Model `lu`: regime \w+, a_prime=", text)
    auto_section = text.split("Model `auto`")[1].split("Model `lu`")[0]
    measured = {int(n) for n in re.findall(r"^\| (\d+)(?: \(advised\))? \| [\d.]+ \|", auto_section, flags=re.M)}
    assert {1, 2, 4, 8, 16, 32} <= measured
    # Every budget's advice is measured where it lands: the advised n is one of the measured rows.
    advice = re.findall(r"^\| (0\.05|0\.1|0\.2|0\.3) \| (\d+) \| [\d.]+ \| ([\d.]+) \|", auto_section, flags=re.M)
    assert [b for b, _, _ in advice] == ["0.05", "0.1", "0.2", "0.3"]
    assert all(int(n) in measured for _, n, _ in advice)
    assert re.search(r"^\| buffer \| auto \| [\d.]+% \| - \| ([\d.]+ / ){3}[\d.]+ \| 0 of 4 \|$", text, flags=re.M)
    # What was measured is kept beside the report; the report written again from it (no root, no network) is the
    # same but for the command line.
    again = tmp_path / "again.md"
    redone = subprocess.run([sys.executable, "-m", "benchmarks.testbed_accuracy", "--from-json",
                             str(report.with_suffix(".json")), "--output", str(again)],
                            cwd=root, capture_output=True, text=True, timeout=120)
    assert redone.returncode == 0, redone.stderr[-2000:]
    body = [line for line in text.splitlines() if not line.startswith("Command:")]
    assert [line for line in again.read_text().splitlines() if not line.startswith("Command:")] == body
    assert "report written again from its measurements" in again.read_text()


@netns
def test_dispersion_benchmark_reads_the_index_auto_reads_from_the_service_s_probe(tmp_path):
    # A 25-packet drop-tail queue shared with 5 cubic flows: ten streams lose about 1 % of their segments, so
    # an 8 s probe counts a few hundred retransmissions, enough (5 a stream) for the index to be read.
    output = tmp_path / "dispersion.md"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "benchmarks.studies.testbed_dispersion", "--beds",
                           "droptail-small", "--runs", "1", "--seconds", "8", "--omit", "2", "--output", str(output)],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [row] = json.loads(output.with_suffix(".json").read_text())
    assert row["bed"] == "droptail-small" and len(row["stream_retransmits"]) == len(row["stream_bps"]) == 10
    assert sum(row["stream_retransmits"]) == row["retransmits"] > 50 and 0 < row["loss_rate"] < 0.2
    # The index is the one auto reads (models.evidence.loss_dispersion over the per-stream counts and rates).
    point = ProbePoint(streams=10, throughput_bps=row["throughput_bps"], retransmits=row["retransmits"],
                       rtt_s=0.04, mss_bytes=1448, duration_s=row["duration_s"], stream_bps=tuple(row["stream_bps"]),
                       stream_retransmits=tuple(row["stream_retransmits"]))
    assert row["dispersion"] == pytest.approx(loss_dispersion(point))
    assert row["reads_random"] == (row["dispersion"] >= RANDOM_DROP_DISPERSION)
    assert f"| droptail-small | 1 | {row['throughput_bps'] / 1e6:.2f} |" in output.read_text()
