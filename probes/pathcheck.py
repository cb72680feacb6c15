"""Measurements across a running test bed: RTT (ping), TCP throughput and UDP loss (iperf3).

Times are seconds, rates bits/s (decimal, iperf3's receiver-side goodput), loss a
fraction 0–1. Parsing is pure (``parse_*``); the functions that run ping or iperf3
take a deadline and kill what they start.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from probes.netns import TestbedCommandFailed, run
from probes.testbed import Testbed


@dataclass(frozen=True)
class RttStats:
    """Round-trip times of one ping run, seconds; ``jitter_s`` is p99 − p50, ``mdev_s`` ping's mean deviation."""

    samples_s: tuple[float, ...]
    sent: int
    mean_s: float
    mdev_s: float
    p50_s: float
    p99_s: float

    @property
    def jitter_s(self) -> float:
        return self.p99_s - self.p50_s

    @property
    def loss_rate(self) -> float:
        return 1.0 - len(self.samples_s) / self.sent if self.sent else 0.0


@dataclass(frozen=True)
class UdpResult:
    """One iperf3 UDP run: datagrams sent, lost, and the receiver's rate in bits/s."""

    packets: int
    lost: int
    receiver_bps: float

    @property
    def loss_rate(self) -> float:
        return self.lost / self.packets if self.packets else 0.0


_TIME_RE = re.compile(r"time=([0-9.]+) ms")
_SENT_RE = re.compile(r"(\d+) packets transmitted")
_MDEV_RE = re.compile(r"= [0-9.]+/[0-9.]+/[0-9.]+/([0-9.]+) ms")


def _percentile(sorted_values: list[float], q: float) -> float:
    # Nearest-rank percentile: no interpolation, so p99 of 200 samples is the 198th value.
    rank = max(1, min(len(sorted_values), math.ceil(q * len(sorted_values))))
    return sorted_values[rank - 1]


def parse_ping(text: str) -> RttStats:
    """Parse iputils ping output (not -q) into RTT statistics in seconds."""
    samples = [float(m) / 1e3 for m in _TIME_RE.findall(text)]
    sent_match = _SENT_RE.search(text)
    if not samples or sent_match is None:
        raise TestbedCommandFailed(f"ping got no replies: {text.strip()[-300:]}")
    mdev_match = _MDEV_RE.search(text)
    ordered = sorted(samples)
    return RttStats(
        samples_s=tuple(samples),
        sent=int(sent_match.group(1)),
        mean_s=statistics.fmean(samples),
        mdev_s=float(mdev_match.group(1)) / 1e3 if mdev_match else statistics.pstdev(samples),
        p50_s=_percentile(ordered, 0.50),
        p99_s=_percentile(ordered, 0.99),
    )


def parse_iperf3_tcp(text: str) -> float:
    """Receiver-side throughput in bits/s from ``iperf3 -J`` TCP output."""
    data = json.loads(text)
    if "error" in data:
        raise TestbedCommandFailed(f"iperf3: {data['error']}")
    return float(data["end"]["sum_received"]["bits_per_second"])


def parse_iperf3_udp(text: str) -> UdpResult:
    """Datagrams sent and lost, and the receiver's rate, from ``iperf3 -J -u`` output."""
    data = json.loads(text)
    if "error" in data:
        raise TestbedCommandFailed(f"iperf3: {data['error']}")
    total = data["end"]["sum"]
    return UdpResult(packets=int(total["packets"]), lost=int(total["lost_packets"]),
                     receiver_bps=float(total["bits_per_second"]))


def ping(tb: Testbed, count: int = 100, interval_s: float = 0.01, warmup: int = 3) -> RttStats:
    """Ping the receiver from the sender namespace ``count`` times, ``interval_s`` apart.

    ``warmup`` pings go first and are not counted: the first packet on a fresh path
    waits for neighbour discovery on each hop (seen: +3.5 ms), which is not path delay.
    """
    if warmup:
        _run_ping(tb, warmup, interval_s)
    return parse_ping(_run_ping(tb, count, interval_s))


def _run_ping(tb: Testbed, count: int, interval_s: float) -> str:
    argv = ["ping", "-n", "-c", str(count), "-i", f"{interval_s:g}", "-W", "2", tb.receiver_addr]
    deadline_s = count * interval_s + 5.0
    try:
        done = subprocess.run(tb.exec_in(tb.sender_ns, argv), capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired as exc:
        raise TestbedCommandFailed(f"ping did not finish within {deadline_s:g} s") from exc
    return done.stdout


@contextmanager
def iperf3_server(tb: Testbed, port: int) -> Iterator[int]:
    """An iperf3 server in the receiver namespace on ``receiver_addr:port`` for the duration of the block."""
    proc = subprocess.Popen(
        tb.exec_in(tb.receiver_ns, ["iperf3", "-s", "-B", tb.receiver_addr, "-p", str(port),
                                    "--idle-timeout", str(SERVER_IDLE_TIMEOUT_S)]),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 5.0
        while not run(tb.exec_in(tb.receiver_ns, ["ss", "-H", "-l", "-t", "-n", f"sport = :{port}"])).strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise TestbedCommandFailed(f"iperf3 server on port {port} did not start: {proc.stderr.read().decode()[-300:]}")
            time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=5)
        proc.stderr.close()


# A server left busy by a client that never finished resets after this many idle seconds.
SERVER_IDLE_TIMEOUT_S = 3
# A UDP run not done this long after its nominal length is taken as stuck in setup.
UDP_SLACK_S = 5.0
UDP_ATTEMPTS = 3


def _client(tb: Testbed, argv: list[str], seconds: float, slack_s: float = 15.0) -> str:
    full = tb.exec_in(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-J", *argv])
    deadline_s = seconds + slack_s
    try:
        done = subprocess.run(full, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired as exc:
        raise TestbedCommandFailed(f"iperf3 client did not finish within {deadline_s:g} s") from exc
    return done.stdout


def tcp_throughput(tb: Testbed, port: int, seconds: float = 3.0, streams: int = 1, omit_s: float = 1.0) -> float:
    """Receiver goodput in bits/s of ``streams`` TCP flows from sender to receiver, after ``omit_s`` warm-up."""
    out = _client(tb, ["-p", str(port), "-t", f"{seconds:g}", "-O", f"{omit_s:g}", "-P", str(streams),
                       "-C", tb.spec.congestion_control], seconds + omit_s)
    return parse_iperf3_tcp(out)


def udp_transfer(tb: Testbed, port: int, rate_bps: float, seconds: float = 2.0, size_bytes: int = 1200,
                 attempts: int = UDP_ATTEMPTS) -> UdpResult:
    """Send UDP at ``rate_bps`` (payload bits/s) from sender to receiver for ``seconds``.

    iperf3 3.12 sends its UDP setup datagram once: on a lossy bed it is lost now and then and
    the client waits for ever (seen at 5 % loss; at 30 %, 2 runs in 12), leaving the server busy
    until its idle timeout. Such a run is abandoned and tried again, up to ``attempts`` times.
    """
    argv = ["-p", str(port), "-u", "-b", str(int(rate_bps)), "-l", str(size_bytes), "-t", f"{seconds:g}"]
    failures = []
    for _ in range(attempts):
        try:
            return parse_iperf3_udp(_client(tb, argv, seconds, slack_s=UDP_SLACK_S))
        except TestbedCommandFailed as exc:
            failures.append(str(exc))
            time.sleep(SERVER_IDLE_TIMEOUT_S + 1)
    raise TestbedCommandFailed(f"UDP transfer failed {attempts} times: {'; '.join(failures)}")


def ping_under_udp_load(tb: Testbed, port: int, load_bps: float, count: int = 200, interval_s: float = 0.01) -> RttStats:
    """Ping while a UDP stream of ``load_bps`` crosses the path: the delay line's jitter at that rate."""
    seconds = count * interval_s + 1.5
    argv = tb.exec_in(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-J", "-p", str(port), "-u",
                                     "-b", str(int(load_bps)), "-t", f"{seconds:g}"])
    load = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        return ping(tb, count, interval_s)
    finally:
        try:
            load.wait(timeout=seconds + 10)
        except subprocess.TimeoutExpired:
            load.kill()
            load.wait(timeout=5)
