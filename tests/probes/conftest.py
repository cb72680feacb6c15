"""Fixtures that build real namespace test beds (root only; see probes/testbed.py)."""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, replace

import pytest

from probes import pathcheck, testbed

_counter = itertools.count()

# The end-to-end path: 50 Mbit/s, 40 ms RTT, one BDP of queue, 5 long cross-traffic flows.
DEFAULT_PATH = testbed.TestbedSpec(rate_bps=50e6, rtt_s=0.040, queue_bytes=250_000, cross_flows=5, name="x")
IPERF3_PORT = 5201
# Long-running cross flows start in slow start and overshoot together; give them time to reach their steady
# sawtooth before a test measures against them (at 40 ms RTT the first loss comes within ~0.5 s).
CROSS_WARMUP_S = 2.0


def unique_name(tag: str) -> str:
    """A test bed name no other test or concurrent pytest run uses (namespace names are host-wide)."""
    return f"{tag}{os.getpid()}{next(_counter)}"[:12]


@pytest.fixture(scope="session")
def bed_name():
    """Factory of unique test bed names: bed_name("u") -> "u12345" ."""
    return unique_name


@dataclass(frozen=True)
class TestbedPath:
    """A running test bed with an iperf3 server at ``server_addr:server_port`` in its receiver namespace."""

    __test__ = False

    testbed: testbed.Testbed
    server_addr: str
    server_port: int

    def client_argv(self, *args: str) -> list[str]:
        """iperf3 client argv that runs in the sender namespace against the server, with the bed's congestion control.

        The algorithm is passed per socket because the namespace default may differ from it (see
        Testbed.default_congestion_control): here the host only allows reno and bbr as namespace defaults.
        """
        cc = self.testbed.spec.congestion_control
        return self.testbed.exec_in(self.testbed.sender_ns,
                                    ["iperf3", "-c", self.server_addr, "-p", str(self.server_port), "-C", cc, *args])

    def in_sender(self, argv: list[str]) -> list[str]:
        """Any argv, run inside the sender namespace (e.g. `tame advise` against the server)."""
        return self.testbed.exec_in(self.testbed.sender_ns, argv)


@pytest.fixture
def testbed_path(request, tmp_path):
    """A test bed (default DEFAULT_PATH; parametrize indirectly with a TestbedSpec) and an iperf3 server on 5201.

    Cross traffic, if any, has been running for CROSS_WARMUP_S seconds when the test starts. E.g.::

        @pytest.mark.netns
        def test_advise_end_to_end(testbed_path):
            dest = f"{testbed_path.server_addr}:{testbed_path.server_port}"
            done = subprocess.run(testbed_path.in_sender([sys.executable, "-m", "advisor", "advise", dest,
                                                          "--max-impact", "0.1", "--json"]),
                                  capture_output=True, text=True, timeout=120)

        @pytest.mark.parametrize("testbed_path", [TestbedSpec(rate_bps=20e6, rtt_s=0.1, queue_bytes=250_000,
                                                              loss_rate=0.001)], indirect=True)
        def test_on_a_lossy_path(testbed_path): ...
    """
    spec = getattr(request, "param", DEFAULT_PATH)
    spec = replace(spec, name=unique_name("p"))
    tb = testbed.up(spec, state_dir=tmp_path)
    try:
        if spec.cross_flows:
            time.sleep(CROSS_WARMUP_S)
        with pathcheck.iperf3_server(tb, IPERF3_PORT):
            yield TestbedPath(tb, tb.receiver_addr, IPERF3_PORT)
    finally:
        testbed.down(spec.name, state_dir=tmp_path)
