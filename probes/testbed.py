"""An emulated WAN path on this machine, built from network namespaces.

Topology (``N`` is the test bed name; every namespace is ``tpt-N-<role>``)::

    tpt-N-s  (sender, 10.201.1.1) ─┐
                                   ├─ tpt-N-r (router) ──bottleneck──▶ tpt-N-d (receiver, 10.201.2.1
    tpt-N-c  (cross,  10.201.3.1) ─┘                                       and 10.201.2.2 for cross traffic)

On the router, traffic towards the receiver passes

* a propagation delay of ``rtt_s / 2`` each way, from the NFQUEUE delay line
  (``delayline.c``; the kernel has no netem),
* random loss with probability ``loss_rate`` (0–1, per packet, sender → receiver
  direction only; acknowledgements are not dropped), from nftables ``numgen random``,
* a tbf bottleneck of ``rate_bps`` bits/s (link-layer bytes, 14-byte Ethernet header
  included) with a queue of ``queue_bytes`` bytes.

The delay comes before the bottleneck queue (netfilter's forward hook runs before the
egress qdisc); a constant delay commutes with a FIFO, so flows see the same path. The
delay line carried ~870 Mbit/s of TCP here (2 busy cores), and adds 0.1–0.3 ms of fixed
processing time to the RTT.

TSO, GSO and GRO are off on every veth so that queues hold real packets.

``cross_flows`` long-running TCP flows (one ``iperf3 -P m`` client in ``tpt-N-c``)
share the bottleneck with whatever runs from ``tpt-N-s``.

Congestion control: the kernel lets a namespace default to an algorithm only if the host
lists it in ``tcp_allowed_congestion_control``; otherwise namespaces keep the host's default
(reported as ``Testbed.default_congestion_control``) and senders must choose per socket
(``iperf3 -C``), as the cross traffic does.

Everything :func:`up` creates is recorded in a state file under ``/run/tameparallel``
(namespaces with their inode numbers, processes with their start times) as it is
created, and every namespace carries a random mark in its loopback alias. :func:`down`
removes exactly that, refuses names it has no record of and namespaces whose inode or
mark differ. A failed :func:`up` removes what it had built.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from probes import delayline
from probes.netns import (
    TestbedCommandFailed,
    TestbedError,
    TestbedExists,
    TestbedNotOwned,
    exec_in,
    netns_inode,
    netns_pids,
    process_start_ticks,
    run,
    stop_process,
)

__all__ = [
    "TestbedSpec",
    "Testbed",
    "TestbedStatus",
    "TestbedError",
    "TestbedCommandFailed",
    "TestbedExists",
    "TestbedNotOwned",
    "up",
    "down",
    "status",
    "exec_in",
]

PREFIX = "tpt"
DEFAULT_STATE_DIR = Path("/run/tameparallel")
NAME_RE = re.compile(r"^[a-z0-9]{1,12}$")
FRAME_BYTES = 1514  # one full-size Ethernet frame as tbf counts it (MTU 1500 + 14-byte header)
CROSS_PORT = 5301
READY_TIMEOUT_S = 5.0

SENDER_ADDR = "10.201.1.1"
RECEIVER_ADDR = "10.201.2.1"
CROSS_SENDER_ADDR = "10.201.3.1"
CROSS_RECEIVER_ADDR = "10.201.2.2"

# (role, router-side interface, address of the far end, address of the router end)
_LINKS = (
    ("s", "tpt-s", SENDER_ADDR, "10.201.1.254"),
    ("c", "tpt-c", CROSS_SENDER_ADDR, "10.201.3.254"),
    ("d", "tpt-d", RECEIVER_ADDR, "10.201.2.254"),
)
_ROLES = ("s", "c", "r", "d")
_HOST_IF = "tpt0"


@dataclass(frozen=True)
class TestbedSpec:
    """One emulated path.

    rate_bps: bottleneck rate in bits/s (link layer). rtt_s: round-trip propagation
    delay in seconds, split evenly between the two directions. queue_bytes: bottleneck
    queue limit in bytes. loss_rate: random drop probability 0–1 per packet towards
    the receiver. cross_flows: number of long-running TCP flows sharing the bottleneck.
    congestion_control: TCP algorithm for every namespace of the bed (e.g. "cubic").
    name: test bed id, 1–12 lowercase letters or digits.
    """

    __test__ = False

    rate_bps: float
    rtt_s: float
    queue_bytes: int
    loss_rate: float = 0.0
    cross_flows: int = 0
    congestion_control: str = "cubic"
    name: str = "tb0"

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ValueError(f"name must be 1-12 lowercase letters or digits, got {self.name!r}")
        if not 1e5 <= self.rate_bps <= 10e9:
            raise ValueError(f"rate_bps must be between 1e5 and 1e10 bits/s, got {self.rate_bps!r}")
        if not 0.0 <= self.rtt_s <= 2.0:
            raise ValueError(f"rtt_s must be between 0 and 2 seconds, got {self.rtt_s!r}")
        if not 2 * FRAME_BYTES <= self.queue_bytes <= 1 << 30:
            raise ValueError(f"queue_bytes must be between {2 * FRAME_BYTES} and 2**30, got {self.queue_bytes!r}")
        if not 0.0 <= self.loss_rate < 1.0:
            raise ValueError(f"loss_rate must be a fraction in [0, 1), got {self.loss_rate!r}")
        if not 0 <= self.cross_flows <= 128:
            raise ValueError(f"cross_flows must be between 0 and 128 (one iperf3 client), got {self.cross_flows!r}")
        if not re.match(r"^[a-z0-9_]{1,16}$", self.congestion_control):
            raise ValueError(f"congestion_control must be a kernel algorithm name, got {self.congestion_control!r}")

    @property
    def bdp_bytes(self) -> float:
        """Bandwidth-delay product in bytes."""
        return self.rate_bps * self.rtt_s / 8


@dataclass(frozen=True)
class Testbed:
    """Handle on a running test bed: namespace names and addresses for running iperf3 in it."""

    __test__ = False

    spec: TestbedSpec
    sender_ns: str
    router_ns: str
    receiver_ns: str
    cross_sender_ns: str
    sender_addr: str = SENDER_ADDR
    receiver_addr: str = RECEIVER_ADDR
    cross_receiver_addr: str = CROSS_RECEIVER_ADDR
    # What a socket gets when it does not choose: the host may forbid spec.congestion_control as a namespace
    # default (only tcp_allowed_congestion_control may be), so compare and pass it per socket (iperf3 -C) if they differ.
    default_congestion_control: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def exec_in(self, ns: str, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside namespace ``ns`` (one of this bed's)."""
        if ns not in (self.sender_ns, self.router_ns, self.receiver_ns, self.cross_sender_ns):
            raise ValueError(f"{ns!r} is not a namespace of test bed {self.name!r}")
        return exec_in(ns, argv)


@dataclass(frozen=True)
class TestbedStatus:
    """What is known about one test bed: its spec, which namespaces and processes are alive."""

    __test__ = False

    name: str
    spec: TestbedSpec | None
    complete: bool
    namespaces: dict[str, bool] = field(default_factory=dict)
    processes: dict[str, bool] = field(default_factory=dict)
    owned: bool = True


def ns_name(name: str, role: str) -> str:
    """Namespace name of ``role`` (s, c, r or d) in test bed ``name``."""
    return f"{PREFIX}-{name}-{role}"


def handle(spec: TestbedSpec, default_congestion_control: str | None = None) -> Testbed:
    """The handle for a bed built from ``spec`` (does not check that it is up)."""
    return Testbed(
        spec=spec,
        default_congestion_control=default_congestion_control,
        sender_ns=ns_name(spec.name, "s"),
        router_ns=ns_name(spec.name, "r"),
        receiver_ns=ns_name(spec.name, "d"),
        cross_sender_ns=ns_name(spec.name, "c"),
    )


# --- state file -------------------------------------------------------------------------------


class _State:
    """The record of what one bed created; written to disk after every creation step."""

    def __init__(self, path: Path, spec: TestbedSpec) -> None:
        self.path = path
        # The token is written into the loopback's alias in every namespace: with the inode it proves, at down
        # time, that a namespace is still the one we built (inode numbers of deleted namespaces get reused).
        self.data: dict = {"name": spec.name, "spec": asdict(spec), "token": f"tameparallel:{secrets.token_hex(8)}",
                           "netns": [], "processes": [], "complete": False}

    @classmethod
    def load(cls, path: Path) -> "_State":
        obj = cls.__new__(cls)
        obj.path = path
        try:
            obj.data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise TestbedError(f"cannot read state file {path}: {exc}") from exc
        return obj

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)

    def add_netns(self, ns: str, inode: int) -> None:
        self.data["netns"].append({"name": ns, "inode": inode, "marked_if": None})
        self.save()

    def mark(self, ns: str, ifname: str) -> None:
        for entry in self.data["netns"]:
            if entry["name"] == ns:
                entry["marked_if"] = ifname
        self.save()

    def add_process(self, label: str, ns: str, pid: int, start_ticks: int | None, argv: list[str]) -> None:
        self.data["processes"].append(
            {"label": label, "ns": ns, "pid": pid, "start_ticks": start_ticks, "argv": argv}
        )
        self.save()


def _state_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.json"


# --- up ---------------------------------------------------------------------------------------

# Popen objects of processes this Python process started, so that down() in the same process reaps them.
_children: dict[int, subprocess.Popen] = {}


def up(spec: TestbedSpec, state_dir: Path = DEFAULT_STATE_DIR) -> Testbed:
    """Build the bed described by ``spec``; on any failure remove what was built and raise TestbedError."""
    if os.geteuid() != 0:
        raise TestbedError("the test bed needs root (network namespaces, tc, nftables)")
    state_dir.mkdir(parents=True, exist_ok=True)
    path = _state_path(state_dir, spec.name)
    if path.exists():
        raise TestbedExists(f"test bed {spec.name!r} is already up (state file {path}); run 'tame testbed down --name {spec.name}'")
    for role in _ROLES:
        if netns_inode(ns_name(spec.name, role)) is not None:
            raise TestbedExists(f"namespace {ns_name(spec.name, role)} exists but is not recorded as ours; not touching it")
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    if spec.congestion_control not in available:
        raise TestbedError(f"congestion control {spec.congestion_control!r} not available here; choose one of {available}")
    binary = delayline.binary() if spec.rtt_s > 0 else None

    state = _State(path, spec)
    # O_EXCL claims the name atomically against a concurrent up() with the same name.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError as exc:
        raise TestbedExists(f"test bed {spec.name!r} is already up (state file {path})") from exc
    os.close(fd)
    state.save()
    try:
        _build(spec, state, binary, state_dir)
        state.data["default_congestion_control"] = run(
            exec_in(ns_name(spec.name, "s"), ["sysctl", "-n", "net.ipv4.tcp_congestion_control"])).strip()
        state.data["complete"] = True
        state.save()
    except BaseException as exc:
        try:
            _teardown(state)
        except TestbedError as cleanup_exc:
            exc.add_note(f"cleanup after the failure was incomplete: {cleanup_exc}")
        if isinstance(exc, TestbedError):
            raise
        if isinstance(exc, Exception):
            raise TestbedError(f"building test bed {spec.name!r} failed: {exc}") from exc
        raise
    return handle(spec, state.data["default_congestion_control"])


def _build(spec: TestbedSpec, state: _State, binary: Path | None, state_dir: Path) -> None:
    tb = handle(spec)
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    for role in _ROLES:
        ns = ns_name(spec.name, role)
        _add_namespace(state, ns)
        # A namespace's default algorithm may only be one the host allows (tcp_allowed_congestion_control);
        # otherwise the kernel says EPERM and senders must ask per socket (iperf3 -C), as the cross traffic does.
        if spec.congestion_control in allowed:
            run(exec_in(ns, ["sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={spec.congestion_control}"]))

    r = tb.router_ns
    run(exec_in(r, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]))
    for role, router_if, host_addr, router_addr in _LINKS:
        host_ns = ns_name(spec.name, role)
        # Created directly inside our namespaces, so nothing ever appears in the root namespace.
        run(["ip", "-n", r, "link", "add", router_if, "type", "veth", "peer", "name", _HOST_IF, "netns", host_ns])
        for ns, ifname, addr in ((r, router_if, router_addr), (host_ns, _HOST_IF, host_addr)):
            run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname])
            run(exec_in(ns, ["ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off"]))
            run(["ip", "-n", ns, "link", "set", ifname, "up"])
        run(["ip", "-n", host_ns, "route", "add", "default", "via", router_addr])
    run(["ip", "-n", tb.receiver_ns, "addr", "add", f"{CROSS_RECEIVER_ADDR}/24", "dev", _HOST_IF])

    burst = max(2 * FRAME_BYTES, int(spec.rate_bps / 8 * 1e-3))  # about 1 ms of tokens: smooth, yet above one frame
    run(exec_in(r, ["tc", "qdisc", "replace", "dev", "tpt-d", "root", "tbf",
                    "rate", f"{int(spec.rate_bps)}bit", "burst", str(burst), "limit", str(int(spec.queue_bytes))]))

    if spec.loss_rate > 0:
        threshold = round(spec.loss_rate * 1_000_000)
        run(exec_in(r, ["nft", "add", "table", "inet", PREFIX]))
        run(exec_in(r, ["nft", "add", "chain", "inet", PREFIX, "forward", "{", "type", "filter", "hook", "forward",
                        "priority", "0", ";", "policy", "accept", ";", "}"]))
        run(exec_in(r, ["nft", "add", "rule", "inet", PREFIX, "forward", "oifname", "tpt-d",
                        "numgen", "random", "mod", "1000000", "lt", str(threshold), "counter", "drop"]))

    if binary is not None:
        one_way_us = round(spec.rtt_s / 2 * 1e6)
        # Room for twice the packets one direction can carry during the delay, at 64-byte packets.
        maxlen = max(65536, int(2 * spec.rate_bps * spec.rtt_s / 2 / (8 * 64)))
        for queue, label in ((0, "delay-forward"), (1, "delay-reverse")):
            _spawn(state, state_dir, label, r, [str(binary), str(queue), str(one_way_us), str(maxlen)], ready_line="ready")
        for iface in ("tpt-s", "tpt-c"):
            run(exec_in(r, ["iptables", "-w", "5", "-t", "mangle", "-A", "FORWARD", "-i", iface, "-j", "NFQUEUE", "--queue-num", "0"]))
        run(exec_in(r, ["iptables", "-w", "5", "-t", "mangle", "-A", "FORWARD", "-i", "tpt-d", "-j", "NFQUEUE", "--queue-num", "1"]))

    if spec.cross_flows > 0:
        _spawn(state, state_dir, "cross-server", tb.receiver_ns,
               ["iperf3", "-s", "-B", CROSS_RECEIVER_ADDR, "-p", str(CROSS_PORT)])
        _wait_listening(tb.receiver_ns, CROSS_PORT)
        _spawn(state, state_dir, "cross-client", tb.cross_sender_ns,
               ["iperf3", "-c", CROSS_RECEIVER_ADDR, "-p", str(CROSS_PORT), "-P", str(spec.cross_flows),
                "-t", "86400", "-i", "0", "-C", spec.congestion_control])
        time.sleep(0.3)
        _check_alive(state)


def _add_namespace(state: _State, ns: str) -> None:
    """Create namespace ``ns``, record it and mark it (what down() checks before it deletes anything)."""
    run(["ip", "netns", "add", ns])
    inode = netns_inode(ns)
    if inode is None:
        raise TestbedCommandFailed(f"namespace {ns} vanished right after it was created")
    state.add_netns(ns, inode)
    # The loopback carries the mark: it lives as long as the namespace, unlike veths, which vanish with their peer.
    run(["ip", "-n", ns, "link", "set", "lo", "alias", state.data["token"]])
    state.mark(ns, "lo")
    run(["ip", "-n", ns, "link", "set", "lo", "up"])


def _spawn(state: _State, state_dir: Path, label: str, ns: str, argv: list[str], ready_line: str | None = None) -> None:
    log_path = state_dir / f"{state.data['name']}.{label}.log"
    full = exec_in(ns, argv)
    with open(log_path, "wb") as log:
        # A new session: the process outlives the `tame testbed up` command and ignores its terminal's signals.
        proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _children[proc.pid] = proc
    # `ip netns exec` execs the command, so this pid is the command's own.
    state.add_process(label, ns, proc.pid, process_start_ticks(proc.pid), full)
    if ready_line is None:
        return
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready_line in log_path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise TestbedCommandFailed(f"{label} did not start: {log_path.read_text(errors='replace').strip()[-500:]}")


def _wait_listening(ns: str, port: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if run(exec_in(ns, ["ss", "-H", "-l", "-t", "-n", f"sport = :{port}"])).strip():
            return
        time.sleep(0.05)
    raise TestbedCommandFailed(f"iperf3 server in {ns} is not listening on port {port} after {READY_TIMEOUT_S:g} s")


def _check_alive(state: _State) -> None:
    for proc in state.data["processes"]:
        if process_start_ticks(proc["pid"]) is None:
            raise TestbedCommandFailed(f"{proc['label']} ({' '.join(proc['argv'])}) exited right after starting")


# --- down / status ----------------------------------------------------------------------------


def down(name: str, state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """Remove test bed ``name``: what its state file records, in namespaces that still carry our inode and mark.

    Processes still running inside those namespaces (e.g. an iperf3 server a test started with exec_in)
    are stopped too: they would otherwise keep a deleted namespace alive. Raises TestbedNotOwned, having
    touched nothing of it, for a namespace that was replaced by someone else's.
    """
    if not NAME_RE.match(name):
        raise ValueError(f"name must be 1-12 lowercase letters or digits, got {name!r}")
    path = _state_path(state_dir, name)
    if not path.exists():
        raise TestbedNotOwned(f"no test bed {name!r} was created here (no state file {path}); nothing touched")
    _teardown(_State.load(path))


def _owned(entry: dict, token: str) -> str | None:
    """Why the recorded namespace is not ours any more (None if it is ours or already gone)."""
    ns, current = entry["name"], netns_inode(entry["name"])
    if current is None:
        return None
    if current != entry["inode"]:
        return f"namespace {ns} is not the one this tool created (inode {current}, recorded {entry['inode']}); left alone"
    if entry.get("marked_if"):
        try:
            links = json.loads(run(["ip", "-n", ns, "-j", "link", "show", "dev", entry["marked_if"]]))
        except (TestbedCommandFailed, ValueError):
            links = []
        if not links or links[0].get("ifalias") != token:
            return f"namespace {ns} is not the one this tool created (interface {entry['marked_if']} lacks our mark); left alone"
    return None


def _teardown(state: _State) -> None:
    problems: list[str] = []
    foreign: list[str] = []
    for proc in reversed(state.data["processes"]):
        try:
            stop_process(proc["pid"], proc["start_ticks"])
        except TestbedError as exc:
            problems.append(str(exc))
        child = _children.pop(proc["pid"], None)
        if child is not None:
            child.poll()
    # Decide ownership of every namespace before deleting any: deleting one end of a veth pair removes the
    # marked interface from the namespace at the other end.
    ours = []
    for entry in state.data["netns"]:
        reason = _owned(entry, state.data["token"])
        if reason is None:
            ours.append(entry)
        else:
            foreign.append(reason)
    for entry in reversed(ours):
        ns = entry["name"]
        if netns_inode(ns) is None:
            continue
        try:
            # Anything still inside a namespace we made (e.g. an iperf3 started with exec_in) would keep it alive.
            for pid in netns_pids(ns):
                stop_process(pid, process_start_ticks(pid))
            run(["ip", "netns", "del", ns])
        except TestbedError as exc:
            problems.append(str(exc))
    if foreign:
        raise TestbedNotOwned("; ".join(foreign + problems))
    if problems:
        raise TestbedCommandFailed("; ".join(problems))
    for log in state.path.parent.glob(f"{state.path.stem}.*.log"):
        log.unlink(missing_ok=True)
    state.path.unlink(missing_ok=True)


def status(state_dir: Path = DEFAULT_STATE_DIR) -> list[TestbedStatus]:
    """Every bed this tool has a record of, plus namespaces with our prefix that it has no record of (owned=False)."""
    found: list[TestbedStatus] = []
    recorded: set[str] = set()
    for path in sorted(state_dir.glob("*.json")) if state_dir.is_dir() else []:
        state = _State.load(path)
        spec = TestbedSpec(**state.data["spec"])
        namespaces = {}
        for entry in state.data["netns"]:
            recorded.add(entry["name"])
            namespaces[entry["name"]] = netns_inode(entry["name"]) is not None and _owned(entry, state.data["token"]) is None
        processes = {p["label"]: process_start_ticks(p["pid"]) == p["start_ticks"] for p in state.data["processes"]}
        found.append(TestbedStatus(spec.name, spec, bool(state.data["complete"]), namespaces, processes))
    if Path("/run/netns").is_dir():
        for entry in sorted(os.listdir("/run/netns")):
            if entry.startswith(f"{PREFIX}-") and entry not in recorded:
                found.append(TestbedStatus(entry, None, False, {entry: True}, {}, owned=False))
    return found
