"""The tame congestion control on the real kernel: registration, per-destination settings, routes, a transfer.

Registration is kernel-wide, so the root tests load and unload it themselves and fail if a `tame` is
already registered (someone else's, which they must not unload). Routes and transfers run in a veth
pair of namespaces of their own (tcc-<pid>-a, tcc-<pid>-b), removed whatever happens.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from models.tame_share import law_for
from probes import cc, cc_map, cc_routes, live_netns, testbed
from probes.errors import CcRouteConflict
from probes.netns import process_start_ticks, stop_process
from tests.probes.fm_map import fill_with_entries_of

netns = pytest.mark.netns
A4, B4 = "10.77.0.1", "10.77.0.2"
A6, B6 = "fd77::1", "fd77::2"
PORT = 5399


# -- pure: keys, values, addresses ----------------------------------------------------------

def test_map_key_is_the_namespace_cookie_then_ipv6_or_ipv4_mapped_and_round_trips():
    cookie = 0x0102030405060708
    v4 = ipaddress.ip_address("10.77.0.2")
    assert cc_map.map_key(v4, cookie) == bytes(range(8, 0, -1)) + bytes(10) + b"\xff\xff" + bytes([10, 77, 0, 2])
    assert cc_map.key_parts(cc_map.map_key(v4, cookie)) == (cookie, v4)
    v6 = ipaddress.ip_address("fd77::2")
    assert cc_map.map_key(v6, 1) == (1).to_bytes(8, "little") + v6.packed
    assert cc_map.key_parts(cc_map.map_key(v6, 1)) == (1, v6)


def test_canonical_address_maps_v4_mapped_to_v4_and_refuses_names():
    assert cc.canonical_address(" ::ffff:10.0.0.1 ") == ipaddress.ip_address("10.0.0.1")
    for bad in ("host.example", "10.0.0.1/32", "", "0.0.0.0", "ff02::1", "fe80::1%eth0"):
        with pytest.raises(ValueError):
            cc.canonical_address(bad)


def test_setting_value_is_fm_times_1000_and_flags_little_endian_and_refuses_fm_below_one_or_not_finite():
    assert cc_map.CcSetting(1).to_value() == (1000).to_bytes(4, "little") + bytes(4)
    assert cc_map.CcSetting(4.0).to_value() == (4000).to_bytes(4, "little") + bytes(4)
    assert cc_map.CcSetting(1.5, scale_slow_start=True).to_value() == (1500).to_bytes(4, "little") + (1).to_bytes(4, "little")
    for setting in (cc_map.CcSetting(1.5), cc_map.CcSetting(400.0, scale_slow_start=True)):
        assert cc_map.CcSetting.from_value(setting.to_value()) == setting
    for bad in (0.99, 0, -1, float("nan"), float("inf"), cc_map.MAX_FM * 2):
        with pytest.raises(ValueError):
            cc_map.CcSetting(bad)


# -- root: the real kernel ------------------------------------------------------------------

def _count(kind: str) -> int:
    return len(json.loads(subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True,
                                         check=True, timeout=20).stdout or "[]"))


def _counts() -> tuple[int, int]:
    return _count("prog"), _count("map")


def _settle_counts(expected: tuple[int, int], timeout_s: float = 5.0) -> tuple[int, int]:
    # Programs and maps are freed after an RCU grace period, not at unregister's return.
    deadline = time.monotonic() + timeout_s
    while (now := _counts()) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def _steady_counts(timeout_s: float = 10.0) -> tuple[int, int]:
    """The counts once they hold still for half a second: what an unload just before (another test's) frees goes
    after an RCU grace period."""
    last, deadline = _counts(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _counts()
        if now == last:
            break
        last = now
    return last


def _available() -> list[str]:
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        return f.read().split()


@pytest.fixture
def loaded():
    """tame registered for the test, unregistered after it; yields the (prog, map) counts from before."""
    assert cc.registration() is None, "a tame congestion control is already registered: not ours to unload"
    before = _steady_counts()
    cc.load()
    try:
        yield before
    finally:
        cc.unload()


@dataclass(frozen=True)
class Pair:
    a: str
    b: str


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True, timeout=10).stdout


@pytest.fixture
def pair():
    """Two namespaces joined by a veth pair: A 10.77.0.1 / fd77::1, B 10.77.0.2 / fd77::2."""
    tag = f"tcc-{os.getpid()}"
    p = Pair(f"{tag}-a", f"{tag}-b")
    made = []
    try:
        for ns in (p.a, p.b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", "tccva", "netns", p.a, "type", "veth", "peer", "name", "tccvb", "netns", p.b)
        for ns, dev, v4, v6 in ((p.a, "tccva", A4, A6), (p.b, "tccvb", B4, B6)):
            _ip("-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            _ip("-n", ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield p
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _tame(ns: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "advisor", "cc", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def _route(ns: str, addr: str) -> str:
    family = "-6" if ":" in addr else "-4"
    return _ip("-n", ns, family, "route", "show", "exact", str(ipaddress.ip_network(addr)))


@netns
def test_load_registers_and_unload_leaves_no_program_or_map():
    assert cc.registration() is None, "a tame congestion control is already registered: not ours to unload"
    before = _steady_counts()
    reg, new = cc.load()
    try:
        assert new
        status = json.loads(subprocess.run([sys.executable, "-m", "advisor", "cc", "status", "--json"],
                                           capture_output=True, text=True, timeout=30, check=True).stdout)
        assert status["registered"] is True and status["struct_ops_id"] == reg.struct_ops_id
        assert status["destinations"] == []
        assert "tame" in _available()
        # The struct_ops map, the FM map and the socket storage, and one program per callback (4).
        assert _counts() == (before[0] + 4, before[1] + 3)
        assert cc.load() == (reg, False)
    finally:
        assert cc.unload() is True
    assert _settle_counts(before) == before
    assert "tame" not in _available()
    assert cc.registration() is None
    assert cc.unload() is False
    # Not loaded: apply is told to load it first, as transfer is (exit 2), and changes nothing.
    done = subprocess.run([sys.executable, "-m", "advisor", "cc", "apply", "198.51.100.7", "--tcp-equivalent", "1.5"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "tame cc load" in done.stderr, done.stderr
    assert _ip("route", "show", "exact", "198.51.100.7/32") == ""


@netns
def test_an_older_build_left_registered_is_named_and_unloads(tmp_path, pair):
    # Registration outlives an upgrade: the build before per-namespace keys (16-byte keys) still registered. Every
    # command that reads its map says so and what to do (exit 2), rather than failing on bpftool's key format;
    # unload still removes it.
    assert cc.registration() is None, "a tame congestion control is already registered: not ours to unload"
    source = cc.SOURCE.read_text()
    for line in ("\t__u64 netns; /* net->net_cookie of the socket's namespace */\n",
                 "\tkey.netns = sk->__sk_common.skc_net.net->net_cookie;\n"):
        assert line in source
        source = source.replace(line, "")
    (tmp_path / "tame_cc.bpf.c").write_text(source)
    (tmp_path / "build.sh").write_text(cc.BUILD_SCRIPT.read_text())
    subprocess.run(["bash", str(tmp_path / "build.sh"), str(tmp_path / "old.o")], check=True, capture_output=True,
                   timeout=120)
    before = _steady_counts()
    subprocess.run(["bpftool", "struct_ops", "register", str(tmp_path / "old.o")], check=True, capture_output=True,
                   timeout=30)
    try:
        for argv in (["status"], ["load"], ["apply", "198.51.100.7", "--tcp-equivalent", "1.5"]):
            done = subprocess.run([sys.executable, "-m", "advisor", "cc", *argv], capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 2 and "older build" in done.stderr and "tame cc unload" in done.stderr, done
        # The routes it says to clear first: status lists them, and clear removes them (exit 0; the map's entries
        # go with the older build).
        _ip("-n", pair.a, "route", "add", f"{B4}/32", "dev", "tccva", "proto", cc_routes.ROUTE_PROTO, "congctl", "tame")
        done = _tame(pair.a, "status")
        assert done.returncode == 2 and f"\n  {B4} dev tccva " in done.stdout, done
        done = _tame(pair.a, "clear", B4)
        assert done.returncode == 0 and "route removed" in done.stdout and "tame cc unload" in done.stdout, done
        assert _route(pair.a, B4) == ""
        assert "no route tame cc apply added" in _tame(pair.a, "status").stdout
    finally:
        assert cc.unload() is True
    assert _settle_counts(before) == before


@netns
def test_apply_and_clear_change_the_map_entry_and_the_route(loaded, pair):
    # Fractional form, n* 2.5 beside cubic on a 100 ms path: the remainder 0.5 at the FM the measured law gives.
    done = _tame(pair.a, "apply", B4, "--tcp-equivalent", "2.5", "--standard-control", "cubic", "--rtt", "0.1")
    assert done.returncode == 0, done.stderr
    expected = round(law_for("cubic").multiplier_for(0.5, 0.1), 3)
    a = cc_map.netns_cookie(pair.a)  # the entries are A's sockets', as its routes are
    assert cc_map.settings(a) == {ipaddress.ip_address(B4): cc_map.CcSetting(expected)}
    assert cc_map.settings() == {}
    assert "congctl tame" in _route(pair.a, B4) and "proto 250" in _route(pair.a, B4)

    # Aggregate form, 8 streams taking n* 2 of a control not measured (theory, FM^-1/2): each at FM (8/2)^2 = 16;
    # IPv6 keyed by its own address.
    done = _tame(pair.a, "apply", B4, "--tcp-equivalent", "2", "--streams", "8", "--standard-control", "bbr", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fractional_multiplier"] == 16.0
    done = _tame(pair.a, "apply", B6, "--tcp-equivalent", "0.25", "--standard-control", "bbr")  # FM 1/0.25^2 = 16
    assert done.returncode == 0, done.stderr
    assert cc_map.settings(a) == {ipaddress.ip_address(B4): cc_map.CcSetting(16.0), ipaddress.ip_address(B6): cc_map.CcSetting(16.0)}
    assert "congctl tame" in _route(pair.a, B6)

    status = json.loads(_tame(pair.a, "status", "--json").stdout)
    assert {d["dest"]: d["fractional_multiplier"] for d in status["destinations"]} == {B4: 16.0, B6: 16.0}

    for dest in (B4, B6):
        done = _tame(pair.a, "clear", dest)
        assert done.returncode == 0, done.stderr
        assert _route(pair.a, dest) == ""
    assert cc_map.all_settings() == {}
    assert "10.77.0.0/24" in _ip("-n", pair.a, "route")  # the link's own route is untouched


@netns
def test_apply_refuses_a_route_it_did_not_add_and_a_local_address(loaded, pair):
    _ip("-n", pair.a, "route", "add", f"{B4}/32", "dev", "tccva")
    done = _tame(pair.a, "apply", B4, "--tcp-equivalent", "1.5")
    assert done.returncode == 2 and "tame did not add" in done.stderr
    assert "congctl" not in _route(pair.a, B4)
    done = _tame(pair.a, "apply", A4, "--tcp-equivalent", "1.5")
    assert done.returncode == 2 and "own address" in done.stderr
    assert cc_map.all_settings() == {}  # no entry left behind by either refusal
    # Unreachable from here: input to change (2), not a failure of the machine.
    done = _tame(pair.a, "apply", "192.0.2.1", "--tcp-equivalent", "1.5")
    assert done.returncode == 2 and "no route to 192.0.2.1" in done.stderr, done.stderr
    # A refusal puts back the entry it found (set by another apply or a running transfer), not deletes it.
    theirs, a = cc_map.CcSetting(7.5), cc_map.netns_cookie(pair.a)
    cc_map.set_fm(ipaddress.ip_address(B4), theirs, a)
    done = _tame(pair.a, "apply", B4, "--tcp-equivalent", "1.5")
    assert done.returncode == 2 and "tame did not add" in done.stderr
    assert cc_map.all_settings() == {(a, ipaddress.ip_address(B4)): theirs}
    cc_map.delete_fm(ipaddress.ip_address(B4), a)
    # clear removes only a route apply made: a blackhole given tame's protocol number is not one.
    _ip("-n", pair.a, "route", "add", "blackhole", "192.0.2.9/32", "proto", cc_routes.ROUTE_PROTO)
    done = _tame(pair.a, "clear", "192.0.2.9")
    assert done.returncode == 0 and "nothing to clear" in done.stdout, (done.stdout, done.stderr)
    assert "blackhole" in _route(pair.a, "192.0.2.9")


@netns
def test_each_network_namespace_has_its_own_entries(loaded, pair):
    # A and B both apply tame to one address on their link (C, on-link for both): one container's transfer or apply
    # never sets, lists or clears another's entry.
    a, b = cc_map.netns_cookie(pair.a), cc_map.netns_cookie(pair.b)
    assert len({a, b, cc_map.netns_cookie()}) == 3
    c = "10.77.0.3"
    assert _tame(pair.a, "apply", c, "--tcp-equivalent", "0.5", "--standard-control", "bbr").returncode == 0  # FM 4
    assert _tame(pair.b, "apply", c, "--tcp-equivalent", "0.25", "--standard-control", "bbr").returncode == 0  # 16
    addr = ipaddress.ip_address(c)
    assert cc_map.all_settings() == {(a, addr): cc_map.CcSetting(4.0), (b, addr): cc_map.CcSetting(16.0)}
    status = json.loads(_tame(pair.a, "status", "--json").stdout)
    assert status["netns_cookie"] == a and status["other_namespaces_entries"] == 1
    assert [(d["dest"], d["fractional_multiplier"]) for d in status["destinations"]] == [(c, 4.0)]
    assert "1 entry of other network namespaces" in _tame(pair.a, "status").stdout

    done = _tame(pair.b, "clear", c)
    assert done.returncode == 0 and "cleared (route, FM entry)" in done.stdout, done.stdout
    assert cc_map.all_settings() == {(a, addr): cc_map.CcSetting(4.0)}  # A's entry and route stay
    assert "congctl tame" in _route(pair.a, c)
    assert _tame(pair.a, "clear", c).returncode == 0
    assert cc_map.all_settings() == {}
    # Each apply let go of its lock and removed its file: cookies are never reused, so files left would pile up.
    assert not [p for p in cc_map.LOCK_DIR.glob("fm-*.lock") if p.name.split("-")[1] in (str(a), str(b))]


@netns
def test_a_full_map_is_named_with_what_to_do(loaded, pair, tmp_path):
    # 4,096 entries of a live namespace (B's) fill the map: none can go, and apply says so and what to do (exit 2),
    # where bpftool's "Argument list too long" came out.
    reg, b = cc.registration(), cc_map.netns_cookie(pair.b)
    value = " ".join(f"{b:02x}" for b in cc_map.CcSetting(2.0).to_value())
    batch = tmp_path / "fill"
    batch.write_text("".join(
        f"map update id {reg.fm_map_id} key hex "
        f"{' '.join(f'{x:02x}' for x in cc_map.map_key(ipaddress.ip_address(f'10.66.{i // 256}.{i % 256}'), b))} "
        f"value hex {value}\n" for i in range(4096)))
    subprocess.run(["bpftool", "batch", "file", str(batch)], check=True, capture_output=True, timeout=60)
    done = _tame(pair.a, "apply", B4, "--tcp-equivalent", "1.5", "--standard-control", "bbr")
    assert done.returncode == 2, done
    assert "map is full (4096 entries, 4096 of them of other network namespaces; 0 entries of namespaces that are " \
        "gone were removed" in done.stderr, done.stderr
    assert "tame cc unload, then tame cc load" in done.stderr and "Traceback" not in done.stderr
    assert "congctl" not in _route(pair.a, B4)
    assert len(cc_map.all_settings()) == 4096


@pytest.fixture
def gone_ns():
    """A namespace of the test's own with a link (10.78.0.1/24, one end of a veth pair inside it) to apply tame on;
    deleted by the test (or after it)."""
    name = f"tcc-{os.getpid()}-d"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "add", "tccd", "type", "veth", "peer", "name", "tccdp")
        _ip("-n", name, "addr", "add", "10.78.0.1/24", "dev", "tccd")
        _ip("-n", name, "link", "set", "tccd", "up")
        _ip("-n", name, "link", "set", "tccdp", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


@netns
def test_a_full_map_loses_the_entries_of_namespaces_that_are_gone_and_keeps_the_live_ones(loaded, pair, gone_ns,
                                                                                            tmp_path):
    # D applies tame, then D is deleted: its entry is dead weight (cookies are never reused). Apply in A finds the
    # map full of D's entries: they and D's lock file (left by a killed apply) go, A's and the root namespace's stay.
    d, a, here = cc_map.netns_cookie(gone_ns), cc_map.netns_cookie(pair.a), cc_map.netns_cookie()
    assert _tame(gone_ns, "apply", "10.78.0.2", "--tcp-equivalent", "0.5", "--standard-control", "bbr").returncode == 0
    assert _tame(pair.a, "apply", B4, "--tcp-equivalent", "0.5", "--standard-control", "bbr").returncode == 0
    root_dest = ipaddress.ip_address("198.51.100.77")
    cc_map.set_fm(root_dest, cc_map.CcSetting(3.0))  # the root namespace's entry: no route, so nothing to clear in it
    left_lock = cc_map.LOCK_DIR / f"fm-{d}-10.78.0.2.lock"
    cc_map.LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    left_lock.touch()
    try:
        _prune_on_a_full_map(pair, gone_ns, tmp_path, d, a, here, root_dest, left_lock)
    finally:
        left_lock.unlink(missing_ok=True)


def _prune_on_a_full_map(pair, gone_ns, tmp_path, d, a, here, root_dest, left_lock):
    _ip("netns", "del", gone_ns)
    assert fill_with_entries_of(d, tmp_path) == 4096 - 3

    done = _tame(pair.a, "apply", B6, "--tcp-equivalent", "0.25", "--standard-control", "bbr", "--json")
    assert done.returncode == 0, done.stderr
    assert (f"removed 4094 entries of network namespaces that are gone (cookie {d}: 10.66.0.0, 10.66.0.1, 10.66.0.2, "
            "10.66.0.3, 10.66.0.4 and 4089 more)") in done.stderr, done.stderr
    assert "and 1 lock file(s) of theirs" in done.stderr
    assert len(json.loads(done.stdout)["pruned"]) == 4094
    assert {"netns_cookie": d, "dest": "10.78.0.2"} in json.loads(done.stdout)["pruned"]
    assert cc_map.all_settings() == {(a, ipaddress.ip_address(B4)): cc_map.CcSetting(4.0),
                                     (a, ipaddress.ip_address(B6)): cc_map.CcSetting(16.0),
                                     (here, root_dest): cc_map.CcSetting(3.0)}
    assert not left_lock.exists()
    status = json.loads(_tame(pair.a, "status", "--json").stdout)
    assert [e["dest"] for e in status["destinations"]] == [B4, B6] and status["other_namespaces_entries"] == 1
    status = json.loads(subprocess.run([sys.executable, "-m", "advisor", "cc", "status", "--json"],
                                       capture_output=True, text=True, timeout=30, check=True).stdout)
    assert status["netns_cookie"] == here and status["other_namespaces_entries"] == 2
    assert [e["dest"] for e in status["destinations"]] == [str(root_dest)]


@netns
def test_a_namespace_held_only_by_a_thread_or_a_socket_is_live_and_one_held_by_nothing_is_gone(gone_ns):
    # ip netns del removes the name only: a thread of this process inside D, or a socket made there, keeps D alive,
    # and its entries must stay. Held by nothing, it is gone.
    d = cc_map.netns_cookie(gone_ns)
    entered, leave, made = threading.Event(), threading.Event(), {}

    def stay_inside():
        fd = os.open(f"/run/netns/{gone_ns}", os.O_RDONLY)
        assert live_netns._libc.setns(fd, live_netns.CLONE_NEWNET) == 0
        os.close(fd)
        made["sock"] = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        entered.set()
        leave.wait(30)

    inside = threading.Thread(target=stay_inside)
    inside.start()
    try:
        assert entered.wait(10)
        _ip("netns", "del", gone_ns)
        assert live_netns.gone({d, 12345})[0] == {12345}  # the thread holds it
    finally:
        leave.set()
        inside.join()
    assert live_netns.socket_cookie(made["sock"]) == d
    assert live_netns.gone({d})[0] == set()  # the socket holds it
    made["sock"].close()
    assert live_netns.gone({d})[0] == {d}


# A process whose first thread has ended (pthread_exit) while another, inside the namespace named by argv[1], lives
# on: /proc/PID/mountinfo is then EINVAL, as a zombie's is.
LEADER_GONE = textwrap.dedent("""
    import ctypes, os, sys, threading, time
    libc = ctypes.CDLL(None)

    def stay_inside():
        fd = os.open(sys.argv[1], os.O_RDONLY)
        assert libc.setns(fd, 0x40000000) == 0  # CLONE_NEWNET
        os.close(fd)
        print("inside", flush=True)
        time.sleep(60)

    threading.Thread(target=stay_inside).start()
    time.sleep(0.5)
    libc.pthread_exit(None)  # called with the GIL released (CDLL): the thread inside goes on
""")


@netns
def test_exiting_processes_hold_no_namespace_and_stop_no_judgement(gone_ns):
    # Any zombie on the host made every judgement fail ("cannot read /proc/PID: Invalid argument": its mountinfo), so a
    # full map was never pruned; a process whose first thread ended must still be read by its living threads.
    d = cc_map.netns_cookie(gone_ns)
    zombie = subprocess.Popen(["true"])
    leader_gone = subprocess.Popen([sys.executable, "-c", LEADER_GONE, f"/run/netns/{gone_ns}"], stdout=subprocess.PIPE,
                                   text=True)
    try:
        assert leader_gone.stdout.readline().strip() == "inside"
        for pid in (zombie.pid, leader_gone.pid):  # both first threads exited, neither reaped
            for _ in range(100):
                if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                    break
                time.sleep(0.05)
            with pytest.raises(OSError) as read:
                Path(f"/proc/{pid}/mountinfo").read_text()
            assert read.value.errno == errno.EINVAL
        _ip("netns", "del", gone_ns)
        assert live_netns.gone({d, 12345})[0] == {12345}  # the living thread holds D
    finally:
        leader_gone.kill()
        leader_gone.wait(10)
        zombie.wait(10)
    assert live_netns.gone({d})[0] == {d}


@netns
def test_apply_copies_the_route_the_kernel_picks_table_next_hops_and_metrics(loaded, pair):
    # 10.88/16: two next hops (weights 2 and 1), a locked MTU and an advmss; 10.89/16: by a policy rule, table 100,
    # MTU 1300. The route apply adds forwards as the one it covers, in the table the kernel looks up.
    _ip("-n", pair.b, "addr", "add", "10.77.0.4/24", "dev", "tccvb")
    _ip("-n", pair.b, "addr", "add", "10.89.0.9/32", "dev", "lo")
    _ip("-n", pair.a, "route", "add", "10.88.0.0/16", "mtu", "lock", "1400", "advmss", "1300",
        "nexthop", "via", B4, "dev", "tccva", "weight", "2", "nexthop", "via", "10.77.0.4", "dev", "tccva")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva", "table", "100", "mtu", "1300")
    _ip("-n", pair.a, "rule", "add", "to", "10.89.0.0/16", "lookup", "100", "pref", "100")
    # 10.87/16: an IPv4 route through an IPv6 router (RFC 5549).
    _ip("-n", pair.a, "route", "add", "10.87.0.0/16", "via", "inet6", "fe80::1", "dev", "tccva")

    for dest in ("10.88.0.9", "10.89.0.9", "10.87.0.9"):
        done = _tame(pair.a, "apply", dest, "--tcp-equivalent", "1.5", "--standard-control", "bbr")
        assert done.returncode == 0, done.stderr
    v6hop, = json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", "10.87.0.9/32"))
    assert v6hop["via"] == {"family": "inet6", "host": "fe80::1"} and v6hop["dev"] == "tccva"
    ecmp, = json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", "10.88.0.9/32"))
    assert ecmp["table"] == "main" and str(ecmp["protocol"]) == cc_routes.ROUTE_PROTO
    assert [(h["gateway"], h["dev"], h["weight"]) for h in ecmp["nexthops"]] == [(B4, "tccva", 2),
                                                                                ("10.77.0.4", "tccva", 1)]
    assert ecmp["metrics"] == [{"mtu": 1400, "advmss": 1300, "congestion": "tame"}]
    assert "mtu lock 1400" in _ip("-n", pair.a, "route", "show", "exact", "10.88.0.9/32")
    policy, = json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", "10.89.0.9/32"))
    assert (policy["table"], policy["gateway"], policy["metrics"]) == ("100", B4, [{"mtu": 1300, "congestion": "tame"}])
    # An unmodified client to the policy-routed address gets tame from the route (the main table is not looked up).
    assert _iperf3(pair, dest="10.89.0.9")["end"]["sender_tcp_congestion"] == "tame"
    # Applied again: the same route (its own copy is what the kernel picks now).
    assert _tame(pair.a, "apply", "10.89.0.9", "--tcp-equivalent", "1.5", "--standard-control", "bbr").returncode == 0
    assert json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", "10.89.0.9/32")) == [policy]

    for dest in ("10.88.0.9", "10.89.0.9", "10.87.0.9"):
        done = _tame(pair.a, "clear", dest)
        assert done.returncode == 0 and "cleared (route, FM entry)" in done.stdout, (done.stdout, done.stderr)
        assert _ip("-n", pair.a, "route", "show", "table", "all", "exact", f"{dest}/32") == ""
    assert "10.88.0.0/16" in _ip("-n", pair.a, "route") and "10.89.0.0/16" in _ip("-n", pair.a, "route", "show",
                                                                                     "table", "100")
    assert cc_map.all_settings() == {}


@netns
def test_apply_routes_the_connections_a_mark_rule_picks_out_and_names_the_rules_it_does_not_follow(loaded, pair):
    # 10.89/16 in main, and in table 100 (MTU 1300) for connections marked 7. Without --mark, apply sets the route
    # unmarked connections take and names the mark rule; with --mark 7, the route marked ones take, in table 100.
    _ip("-n", pair.b, "addr", "add", "10.89.0.9/32", "dev", "lo")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva", "table", "100", "mtu", "1300")
    _ip("-n", pair.a, "rule", "add", "fwmark", "7", "lookup", "100", "pref", "100")
    dest = "10.89.0.9"

    done = _tame(pair.a, "apply", dest, "--tcp-equivalent", "1.5", "--standard-control", "bbr")
    assert done.returncode == 0, done.stderr
    assert "\n  100: from all fwmark 0x7 lookup 100: they take table 100's route (10.89.0.0/16 dev tccva); apply " \
           "again with --mark 0x7" in done.stderr, done.stderr
    routes = json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", f"{dest}/32"))
    assert [(r.get("table", "main"), r["metrics"]) for r in routes] == [("main", [{"congestion": "tame"}])]
    default = subprocess.run(["ip", "netns", "exec", pair.a, "sysctl", "-n", "net.ipv4.tcp_congestion_control"],
                             capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    assert _marked_connection_control(pair, dest, mark=7) == default != "tame"  # table 100's route: not tame yet

    done = _tame(pair.a, "apply", dest, "--tcp-equivalent", "1.5", "--standard-control", "bbr", "--mark", "0x7")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    routes = json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", f"{dest}/32"))
    assert sorted((r.get("table", "main"), str(r["metrics"])) for r in routes) == [
        ("100", str([{"mtu": 1300, "congestion": "tame"}])), ("main", str([{"congestion": "tame"}]))]
    assert _marked_connection_control(pair, dest, mark=7) == "tame"
    assert _marked_connection_control(pair, dest, mark=None) == "tame"

    done = _tame(pair.a, "clear", dest)
    assert done.returncode == 0 and "cleared (2 routes, FM entry)" in done.stdout, (done.stdout, done.stderr)
    assert _ip("-n", pair.a, "route", "show", "table", "all", "exact", f"{dest}/32") == ""
    assert cc_map.all_settings() == {}


@netns
def test_apply_routes_the_connections_of_a_user_a_uid_rule_picks_out(loaded, pair):
    # 10.89/16 in main, and in table 100 for the sockets of users 1000-1999. Without --uid, apply sets the route
    # root's connections take and names the user rule; with --uid, the route user 1500's take, in table 100.
    _ip("-n", pair.b, "addr", "add", "10.89.0.9/32", "dev", "lo")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva", "table", "100")
    _ip("-n", pair.a, "rule", "add", "uidrange", "1000-1999", "lookup", "100", "pref", "100")
    dest = "10.89.0.9"

    done = _tame(pair.a, "apply", dest, "--tcp-equivalent", "1.5", "--standard-control", "bbr")
    assert done.returncode == 0, done.stderr
    assert "\n  100: from all uidrange 1000-1999 lookup 100: they take table 100's route (10.89.0.0/16 dev tccva); " \
           "apply again with --uid 1000" in done.stderr, done.stderr
    assert _marked_connection_control(pair, dest, mark=None) == "tame"
    assert _marked_connection_control(pair, dest, mark=None, uid=1500) != "tame"  # table 100's route: not tame yet

    done = _tame(pair.a, "apply", dest, "--tcp-equivalent", "1.5", "--standard-control", "bbr", "--uid", "1500")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    routes = json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", f"{dest}/32"))
    assert sorted(r.get("table", "main") for r in routes) == ["100", "main"]
    assert _marked_connection_control(pair, dest, mark=None, uid=1500) == "tame"
    assert _marked_connection_control(pair, dest, mark=None, uid=2500) == "tame"  # outside the range: main's
    done = _tame(pair.a, "clear", dest)
    assert done.returncode == 0, done.stderr
    assert _ip("-n", pair.a, "route", "show", "table", "all", "exact", f"{dest}/32") == ""


@netns
def test_apply_routes_tcp_connections_where_a_protocol_rule_sends_them_and_names_no_rule_that_picks_none(loaded,
                                                                                                         pair):
    # 10.89/16 in main, in table 100 (MTU 1300) for TCP, and in table 101 for UDP and for what comes in on tccva: the
    # transfer's connections are TCP made here (looked up from lo), so table 100's route is theirs to get the control.
    _ip("-n", pair.b, "addr", "add", "10.89.0.9/32", "dev", "lo")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva", "table", "100", "mtu", "1300")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva", "table", "101")
    _ip("-n", pair.a, "rule", "add", "iif", "tccva", "lookup", "101", "pref", "98")
    _ip("-n", pair.a, "rule", "add", "ipproto", "udp", "lookup", "101", "pref", "99")
    _ip("-n", pair.a, "rule", "add", "ipproto", "tcp", "lookup", "100", "pref", "100")
    dest = "10.89.0.9"
    assert _marked_connection_control(pair, dest, mark=None) != "tame"

    done = _tame(pair.a, "apply", dest, "--tcp-equivalent", "1.5", "--standard-control", "bbr")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    routes = json.loads(_ip("-n", pair.a, "-j", "-d", "route", "show", "table", "all", "exact", f"{dest}/32"))
    assert [(r["table"], r["metrics"]) for r in routes] == [("100", [{"mtu": 1300, "congestion": "tame"}])]
    assert _marked_connection_control(pair, dest, mark=None) == "tame"
    done = _tame(pair.a, "clear", dest)
    assert done.returncode == 0 and "cleared (route, FM entry)" in done.stdout, (done.stdout, done.stderr)


@netns
def test_apply_names_a_rule_that_sends_connections_elsewhere_with_the_route_that_gives_them_the_control(loaded, pair):
    # Connections to port PORT take table 100's route (dport rule); those with TOS 0x10 would take table 102's, which
    # has none for 10.89/16, so they fall through to main's, the one apply sets: only the port rule is named, with the
    # command that gives its connections the control, and clear removes what that command adds.
    _ip("-n", pair.b, "addr", "add", "10.89.0.9/32", "dev", "lo")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva")
    _ip("-n", pair.a, "route", "add", "10.89.0.0/16", "via", B4, "dev", "tccva", "table", "100", "mtu", "1300")
    _ip("-n", pair.a, "route", "add", "10.90.0.0/16", "via", B4, "dev", "tccva", "table", "102")
    _ip("-n", pair.a, "rule", "add", "dport", str(PORT), "lookup", "100", "pref", "100")
    _ip("-n", pair.a, "rule", "add", "tos", "0x10", "lookup", "102", "pref", "101")
    dest = "10.89.0.9"

    done = _tame(pair.a, "apply", dest, "--tcp-equivalent", "1.5", "--standard-control", "bbr")
    assert done.returncode == 0, done.stderr
    command = (f"ip -4 route replace {dest}/32 table 100 mtu 1300 proto 250 congctl tame via {B4} dev tccva")
    assert (f"\n  100: from all dport {PORT} lookup 100: they take table 100's route (10.89.0.0/16 dev tccva); tame cc "
            f"apply does not route by dport: give them the control with '{command}' (tame cc clear {dest} removes "
            "it)") in done.stderr, done.stderr
    assert "from all tos" not in done.stderr, done.stderr
    assert _marked_connection_control(pair, dest, mark=None) != "tame"  # to PORT: table 100's route
    subprocess.run(["ip", "netns", "exec", pair.a, *command.split()], check=True, timeout=10)
    assert _marked_connection_control(pair, dest, mark=None) == "tame"
    done = _tame(pair.a, "clear", dest)
    assert done.returncode == 0 and "cleared (2 routes, FM entry)" in done.stdout, (done.stdout, done.stderr)
    assert _ip("-n", pair.a, "route", "show", "table", "all", "exact", f"{dest}/32") == ""


@netns
def test_apply_and_clear_refuse_a_vrf_that_is_not_one_here_and_change_nothing(loaded, pair):
    for vrf, says in (("nosuch", "--vrf nosuch: no device of that name in this network namespace"),
                      ("tccva", "--vrf tccva: a veth device, not a VRF")):
        done = _tame(pair.a, "apply", B4, "--tcp-equivalent", "1.5", "--standard-control", "bbr", "--vrf", vrf)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert _route(pair.a, B4) == "" and cc_map.all_settings() == {}
    assert _tame(pair.a, "apply", B4, "--tcp-equivalent", "1.5", "--standard-control", "bbr").returncode == 0
    applied, entries = _route(pair.a, B4), cc_map.all_settings()
    for vrf, says in (("nosuch", "no device of that name"), ("tccva", "a veth device, not a VRF")):
        done = _tame(pair.a, "clear", B4, "--vrf", vrf)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert (_route(pair.a, B4), cc_map.all_settings()) == (applied, entries) != ("", {})
    assert _tame(pair.a, "clear", B4).returncode == 0


def _marked_connection_control(pair: Pair, dest: str, mark: int | None, uid: int | None = None) -> str:
    """The congestion control of a connection from A to ``dest`` sent with firewall ``mark`` by a process of user
    ``uid`` (None: root) (a route's congctl applies to a socket that chose none), accepted by a listener in B."""
    server = subprocess.Popen(["ip", "netns", "exec", pair.b, sys.executable, "-c",
                               "import socket; s = socket.create_server(('0.0.0.0', %d)); s.accept(); s.accept()"
                               % PORT], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if _listening(pair.b):
                break
            time.sleep(0.05)
        client = ("import os, socket, sys; " + ("" if uid is None else f"os.setuid({uid}); ") + "s = socket.socket(); "
                  + ("" if mark is None else f"s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, {mark}); ")
                  + f"s.connect(({dest!r}, {PORT})); "
                  "print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(bytes(1)).decode())")
        done = subprocess.run(["ip", "netns", "exec", pair.a, sys.executable, "-c", client], capture_output=True,
                              text=True, timeout=20, check=True)
        return done.stdout.strip()
    finally:
        server.kill()
        server.wait(timeout=5)


def test_a_route_with_what_apply_cannot_copy_is_refused():
    addr = ipaddress.ip_address("10.88.0.9")
    picked = {"type": "unicast", "dst": "10.88.0.0/16", "gateway": B4, "dev": "tccva", "table": "main", "flags": []}
    assert cc_routes.route_argv(addr, picked, set())[-8:] == ["proto", "250", "congctl", "tame", "via", B4, "dev", "tccva"]
    assert cc_routes.route_argv(addr, {**picked, "flags": ["onlink", "linkdown"]}, set())[-3:] == ["dev", "tccva", "onlink"]
    via6 = {**picked, "gateway": None, "via": {"family": "inet6", "host": "fe80::1"}}
    assert cc_routes.route_argv(addr, via6, set())[-5:] == ["via", "inet6", "fe80::1", "dev", "tccva"]
    # An IPv6 default route learnt from a router advertisement expires; the copy is the address's for as long as
    # apply keeps it.
    v6 = ipaddress.ip_address("fd88::9")
    learnt = {"type": "unicast", "dst": "default", "gateway": "fe80::1", "dev": "tccva", "protocol": "ra",
              "metric": 1024, "expires": 1790, "pref": "medium", "flags": []}
    assert cc_routes.route_argv(v6, learnt, set()) == ["ip", "-6", "route", "replace", "fd88::9/128", "table", "main",
                                                       "pref", "medium", "proto", "250", "congctl", "tame", "via",
                                                       "fe80::1", "dev", "tccva"]
    for odd in ({"encap": {"proto": "mpls"}}, {"metrics": [{"rtt": 20}]}):
        with pytest.raises(CcRouteConflict, match="does not copy"):
            cc_routes.route_argv(addr, {**picked, **odd}, set())


def _iperf3(pair: Pair, *client_args: str, dest: str = B4) -> dict:
    server = subprocess.Popen(["ip", "netns", "exec", pair.b, "iperf3", "-s", "-1", "-p", str(PORT)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ticks = process_start_ticks(server.pid)
    try:
        for _ in range(50):  # until the server listens
            if _listening(pair.b):
                break
            time.sleep(0.05)
        done = subprocess.run(["ip", "netns", "exec", pair.a, "iperf3", "-c", dest, "-p", str(PORT), "-t", "1", "-J",
                               *client_args], capture_output=True, text=True, timeout=20)
        result = json.loads(done.stdout)
        assert "error" not in result, result.get("error")
        return result
    finally:
        stop_process(server.pid, ticks)
        server.wait(timeout=5)


def _listening(ns: str) -> bool:
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnH", f"sport = :{PORT}"], capture_output=True,
                         text=True, timeout=10).stdout
    return bool(out.strip())


@netns
def test_a_real_transfer_runs_under_tame_chosen_per_socket_or_by_the_route(loaded, pair):
    # Chosen per socket, FM 1 (no entry): plain Reno under another name.
    got = _iperf3(pair, "-C", "tame")
    assert got["end"]["sender_tcp_congestion"] == "tame"
    assert got["end"]["sum_sent"]["bytes"] > 0

    # Chosen by the route for an unmodified client; a client naming its own control keeps it, so the
    # fractional form's standard streams can run beside the tame one towards the same address.
    assert _tame(pair.a, "apply", B4, "--tcp-equivalent", "1.5").returncode == 0
    try:
        got = _iperf3(pair)
        assert got["end"]["sender_tcp_congestion"] == "tame"
        assert got["end"]["sum_sent"]["bytes"] > 0
        assert _iperf3(pair, "-C", "cubic")["end"]["sender_tcp_congestion"] == "cubic"
    finally:
        _tame(pair.a, "clear", B4)


LOSSY = testbed.TestbedSpec(rate_bps=100e6, rtt_s=0.020, queue_bytes=250_000, loss_rate=0.005)


def _goodput(tb_path, seconds: int = 10) -> float:
    done = subprocess.run(tb_path.testbed.exec_in(tb_path.testbed.sender_ns, [
        "iperf3", "-c", tb_path.server_addr, "-p", str(tb_path.server_port), "-J", "-C", cc.NAME,
        "-t", str(seconds), "-O", "2"]), capture_output=True, text=True, timeout=seconds + 30)
    result = json.loads(done.stdout)
    assert "error" not in result, result.get("error")
    assert result["end"]["sender_tcp_congestion"] == cc.NAME
    return result["end"]["sum_received"]["bits_per_second"]


@netns
@pytest.mark.parametrize("testbed_path", [LOSSY], indirect=True)
def test_fm_slows_a_stream_where_random_loss_limits_it(loaded, testbed_path):
    # 0.5 % random loss, far below the 100 Mbit/s bottleneck: each stream sees the loss rate alone, the
    # case where AIMD's rate goes as sqrt(additive increase). FM 16 grows 1/16 segment a round trip, so it
    # should move about 1/4 of what FM 1 (no entry: Reno) moves; the bounds leave room for ~25 losses' noise.
    # An entry for the address in another network namespace (this process's) is not the sender's: still Reno.
    reno = _goodput(testbed_path)
    addr = cc.canonical_address(testbed_path.server_addr)
    cc_map.set_fm(addr, cc_map.CcSetting(16.0))
    elsewhere = _goodput(testbed_path)
    cc_map.set_fm(addr, cc_map.CcSetting(16.0), cc_map.netns_cookie(testbed_path.testbed.sender_ns))
    slowed = _goodput(testbed_path)
    assert 0.08 < slowed / reno < 0.55, (reno, slowed)
    assert elsewhere / reno > 0.7, (reno, elsewhere)
