"""A test bed of several links sharing one bottleneck: two source sites, two destinations.

Topology (``N`` is the bed's name; every namespace is ``tps-N-<role>``)::

    tps-N-s1 (source 1, 10.212.1.1) ─┐                                    ┌─ tps-N-d1 (destination 1, 10.212.2.1)
                                     ├─ tps-N-r1 ──bottleneck──▶ tps-N-r2 ─┤
    tps-N-s2 (source 2, 10.212.3.1) ─┘   (10.212.9.1)    (10.212.9.2)      └─ tps-N-d2 (destination 2, 10.212.4.1)

All four links (s1 or s2 to d1 or d2) cross one tbf bottleneck of ``rate_bps`` with a queue of
``queue_bytes`` on r1's interface towards r2, and, with ``rtt_s`` > 0, the NFQUEUE delay line on r1 (half
the RTT each way), as in :mod:`probes.testbed`, whose state file, ownership marks, process records and teardown this reuses
(its private helpers: one package, one way of owning what a bed creates):
what :func:`up` creates is recorded under ``/run/tameparallel/shared/`` as it is created, and :func:`down`
removes exactly that. A failed :func:`up` removes what it had built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from probes import delayline, testbed
from probes.netns import TestbedError, TestbedExists, exec_in, netns_inode, run

PREFIX = "tps"
DEFAULT_STATE_DIR = testbed.DEFAULT_STATE_DIR / "shared"
SOURCES = {"s1": "10.212.1.1", "s2": "10.212.3.1"}
DESTINATIONS = {"d1": "10.212.2.1", "d2": "10.212.4.1"}
_CORE = ("10.212.9.1", "10.212.9.2")  # r1's and r2's ends of the bottleneck link
_BOTTLENECK_IF = "tps-core"
_HOST_IF = "tps0"
_ROLES = ("s1", "s2", "r1", "r2", "d1", "d2")


@dataclass(frozen=True)
class SharedSpec:
    """The shared bottleneck: ``rate_bps`` bits/s (link layer), ``queue_bytes`` of queue, ``rtt_s`` of
    round-trip propagation delay (0: none); ``name``, 1-12 lowercase letters or digits."""

    rate_bps: float
    queue_bytes: int
    rtt_s: float = 0.0
    name: str = "sb0"

    def __post_init__(self) -> None:
        # The single-path bed's checks: the same ranges hold here.
        testbed.TestbedSpec(rate_bps=self.rate_bps, rtt_s=self.rtt_s, queue_bytes=self.queue_bytes, name=self.name)


@dataclass(frozen=True)
class SharedBed:
    """Handle on a running shared bed: each source's and destination's namespace and address."""

    spec: SharedSpec
    source_ns: dict[str, str]
    source_addr: dict[str, str]
    dest_ns: dict[str, str]
    dest_addr: dict[str, str]

    @property
    def name(self) -> str:
        return self.spec.name


def ns_name(name: str, role: str) -> str:
    return f"{PREFIX}-{name}-{role}"


def handle(spec: SharedSpec) -> SharedBed:
    return SharedBed(spec, {s: ns_name(spec.name, s) for s in SOURCES}, dict(SOURCES),
                     {d: ns_name(spec.name, d) for d in DESTINATIONS}, dict(DESTINATIONS))


def up(spec: SharedSpec, state_dir: Path = DEFAULT_STATE_DIR) -> SharedBed:
    """Build the bed; on any failure remove what was built and raise TestbedError."""
    if os.geteuid() != 0:
        raise TestbedError("the shared test bed needs root (network namespaces, tc, iptables)")
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"{spec.name}.json"
    for role in _ROLES:
        if netns_inode(ns_name(spec.name, role)) is not None:
            raise TestbedExists(f"namespace {ns_name(spec.name, role)} exists; not touching it "
                                f"(if it is ours: tame's probes.sharedbed.down({spec.name!r}))")
    binary = delayline.binary() if spec.rtt_s > 0 else None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError as exc:
        raise TestbedExists(f"shared test bed {spec.name!r} is already up (state file {path})") from exc
    os.close(fd)
    state = testbed._State(path, spec)
    state.save()
    try:
        _build(spec, state, binary, state_dir)
        state.data["complete"] = True
        state.save()
    except BaseException as exc:
        try:
            testbed._teardown(state)
        except TestbedError as cleanup_exc:
            exc.add_note(f"cleanup after the failure was incomplete: {cleanup_exc}")
        if isinstance(exc, Exception) and not isinstance(exc, TestbedError):
            raise TestbedError(f"building shared test bed {spec.name!r} failed: {exc}") from exc
        raise
    return handle(spec)


def down(name: str, state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """Remove shared bed ``name``: exactly what its state file records (probes.testbed.down's rules)."""
    testbed.down(name, state_dir)


def _veth(ns_a: str, if_a: str, addr_a: str, ns_b: str, if_b: str, addr_b: str) -> None:
    run(["ip", "-n", ns_a, "link", "add", if_a, "type", "veth", "peer", "name", if_b, "netns", ns_b])
    for ns, ifname, addr in ((ns_a, if_a, addr_a), (ns_b, if_b, addr_b)):
        run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname])
        run(exec_in(ns, ["ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off"]))
        run(["ip", "-n", ns, "link", "set", ifname, "up"])


def _build(spec: SharedSpec, state, binary: Path | None, state_dir: Path) -> None:
    for role in _ROLES:
        testbed._add_namespace(state, ns_name(spec.name, role))
    r1, r2 = ns_name(spec.name, "r1"), ns_name(spec.name, "r2")
    for router in (r1, r2):
        run(exec_in(router, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]))
    _veth(r1, _BOTTLENECK_IF, _CORE[0], r2, _BOTTLENECK_IF, _CORE[1])
    for role, addr in SOURCES.items():
        gateway = addr.rsplit(".", 1)[0] + ".254"
        _veth(r1, f"tps-{role}", gateway, ns_name(spec.name, role), _HOST_IF, addr)
        run(["ip", "-n", ns_name(spec.name, role), "route", "add", "default", "via", gateway])
        run(["ip", "-n", r2, "route", "add", f"{addr.rsplit('.', 1)[0]}.0/24", "via", _CORE[0]])
    for role, addr in DESTINATIONS.items():
        gateway = addr.rsplit(".", 1)[0] + ".254"
        _veth(r2, f"tps-{role}", gateway, ns_name(spec.name, role), _HOST_IF, addr)
        run(["ip", "-n", ns_name(spec.name, role), "route", "add", "default", "via", gateway])
        run(["ip", "-n", r1, "route", "add", f"{addr.rsplit('.', 1)[0]}.0/24", "via", _CORE[1]])

    burst = max(2 * testbed.FRAME_BYTES, int(spec.rate_bps / 8 * 1e-3))  # about 1 ms of tokens, as the path bed
    run(exec_in(r1, ["tc", "qdisc", "replace", "dev", _BOTTLENECK_IF, "root", "tbf", "rate",
                     f"{int(spec.rate_bps)}bit", "burst", str(burst), "limit", str(int(spec.queue_bytes))]))
    if binary is not None:
        one_way_us = round(spec.rtt_s / 2 * 1e6)
        maxlen = max(65536, int(2 * spec.rate_bps * spec.rtt_s / 2 / (8 * 64)))
        for queue, label in ((0, "delay-forward"), (1, "delay-reverse")):
            testbed._spawn(state, state_dir, label, r1, [str(binary), str(queue), str(one_way_us), str(maxlen)],
                           ready_line="ready")
        for role in SOURCES:
            run(exec_in(r1, ["iptables", "-w", "5", "-t", "mangle", "-A", "FORWARD", "-i", f"tps-{role}",
                             "-j", "NFQUEUE", "--queue-num", "0"]))
        run(exec_in(r1, ["iptables", "-w", "5", "-t", "mangle", "-A", "FORWARD", "-i", _BOTTLENECK_IF,
                         "-j", "NFQUEUE", "--queue-num", "1"]))


def start_server(bed: SharedBed, dest: str, port: int, state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """An ``iperf3 -s`` on destination ``dest`` (d1 or d2) at ``port``, recorded so that :func:`down` stops it."""
    state = testbed._State.load(state_dir / f"{bed.name}.json")
    ns, addr = bed.dest_ns[dest], bed.dest_addr[dest]
    testbed._spawn(state, state_dir, f"iperf3-{dest}-{port}", ns, ["iperf3", "-s", "-B", addr, "-p", str(port)])
    testbed._wait_listening(ns, port)

