"""The tame congestion control (``bpf/tame_cc.bpf.c``): build, register, per-destination settings, routes.

This is the one module that runs bpftool and ``ip route`` for it; every call is an argv list with
a deadline (:func:`probes.netns.run`), and failures become :class:`CcError` subclasses.

* Registration is kernel-wide (``bpftool struct_ops register``); its hash map of fractional
  multipliers (FM x 1000 per destination, key the network namespace's cookie and the 16-byte IPv6 or
  IPv4-mapped address) lives as long as the registration. Entries are per namespace, as routes are:
  every function here reads and writes those of the namespace it runs in unless given another's cookie
  (:func:`netns_cookie`), so a transfer or ``apply`` in one container never sets another's streams. The map is found by id, not by a pin: the struct_ops map ``tame`` and
  ``tame_fm`` share one BTF object id. Pins under /sys/fs/bpf are invisible inside
  ``ip netns exec`` (it remounts /sys), where the test bed's senders run.
* Routes are per network namespace: ``apply`` adds ``DEST/32`` (``/128``) with ``congctl tame``
  and protocol :data:`ROUTE_PROTO` in the namespace it runs in, and ``clear`` removes only a route
  carrying that protocol. Nothing here sets ``net.ipv4.tcp_congestion_control``: a BPF control as a
  namespace's default leaks its map when the namespace goes.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from probes.controls import available_controls
from probes.delayline import cache_dir
from probes import live_netns
from probes.errors import (CcBusy, CcCommandFailed, CcLivenessUnknown, CcMapFull, CcNotAVrf, CcNotLoaded, CcNotRoot,
                           CcOutdated, CcRouteConflict, CcUnavailable)
from probes.netns import TestbedCommandFailed, run

NAME = "tame"
"""The congestion control's name (``iperf3 -C tame``, ``congctl tame``) and its struct_ops map's."""
FM_MAP = "tame_fm"
FM_UNIT = 1000
"""The map holds round(FM x FM_UNIT) as a u32."""
MAX_FM = 1_000_000.0
"""Largest FM the map can hold with headroom in the kernel's u64 threshold (cwnd x FM x 1000)."""
SCALE_SLOW_START = 1
"""Flag bit: slow start grows acked/FM per ack (TAME_SCALE_SLOW_START in the BPF source)."""
SCALE_SLOW_START_BY_DEFAULT = False
"""Whether `tame cc apply` scales slow start (docs/tame-cc.md: what the calibration measured)."""
ROUTE_PROTO = "250"
"""Routing protocol number marking the routes ``apply`` adds, so ``clear`` never removes anyone else's."""

SOURCE = Path(__file__).with_name("bpf") / "tame_cc.bpf.c"
BUILD_SCRIPT = SOURCE.with_name("build.sh")
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")
BUILD_TIMEOUT_S = 120.0
BPFTOOL_TIMEOUT_S = 20.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def canonical_address(dest: str) -> Address:
    """The destination as an address object; raises ValueError for anything but a plain IPv4/IPv6 literal."""
    text = dest.strip()
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(
            f"destination {dest!r} is not an IPv4 or IPv6 address (the setting is kept per address: "
            "resolve a name first and give the address it should apply to)"
        ) from None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            raise ValueError(f"destination {dest!r}: scoped (link-local %zone) addresses are not supported")
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
    if addr.is_unspecified or addr.is_multicast:
        raise ValueError(f"destination {dest!r} is not a unicast address")
    return addr


SO_NETNS_COOKIE = live_netns.SO_NETNS_COOKIE


def netns_cookie(namespace: str | None = None) -> int:
    """The cookie of this process's network namespace, or of the named one (``ip netns``): what the map's entries
    are keyed by, as the kernel gives the program each socket's."""
    if namespace is not None:
        try:
            done = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c",
                                   "from probes.cc import netns_cookie; print(netns_cookie())"],
                                  capture_output=True, text=True, timeout=30, check=True,
                                  cwd=Path(__file__).resolve().parent.parent)
        except subprocess.CalledProcessError as exc:
            raise CcCommandFailed(f"cannot read network namespace {namespace!r}'s cookie: {exc.stderr.strip()}") \
                from None
        return int(done.stdout)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return live_netns.socket_cookie(sock)


KEY_BYTES, VALUE_BYTES = 24, 8
"""The FM map's key (struct tame_key: the namespace cookie and the address) and value (struct tame_setting) sizes."""


def map_key(addr: Address, netns: int) -> bytes:
    """The 24-byte map key (struct tame_key): the namespace cookie as a little-endian u64, then the IPv6 address or
    an IPv4 address in its IPv4-mapped form (::ffff:a.b.c.d)."""
    packed = bytes(10) + b"\xff\xff" + addr.packed if isinstance(addr, ipaddress.IPv4Address) else addr.packed
    return struct.pack("<Q", netns) + packed


def key_parts(key: bytes) -> tuple[int, Address]:
    """Inverse of :func:`map_key`: (namespace cookie, address)."""
    (netns,) = struct.unpack("<Q", key[:8])
    addr = ipaddress.IPv6Address(key[8:])
    return netns, addr.ipv4_mapped or addr


@dataclass(frozen=True)
class CcSetting:
    """One destination's entry in the FM map: the fractional multiplier (1 <= FM <= MAX_FM, finite) and
    whether slow start is scaled by 1/FM too (bit TAME_SCALE_SLOW_START of the BPF program's flags)."""

    fractional_multiplier: float
    scale_slow_start: bool = False

    def __post_init__(self) -> None:
        fm = float(self.fractional_multiplier)
        if not math.isfinite(fm):
            raise ValueError(f"fractional_multiplier must be finite, got {self.fractional_multiplier!r}")
        if not 1.0 <= fm <= MAX_FM:
            raise ValueError(f"fractional_multiplier must be between 1 and {MAX_FM:g}, got {fm:g}")
        object.__setattr__(self, "fractional_multiplier", round(fm * FM_UNIT) / FM_UNIT)

    def to_value(self) -> bytes:
        """The map value (struct tame_setting): FM x 1000 and the flags, two little-endian u32s."""
        flags = SCALE_SLOW_START if self.scale_slow_start else 0
        return struct.pack("<II", round(self.fractional_multiplier * FM_UNIT), flags)

    @classmethod
    def from_value(cls, value: bytes) -> "CcSetting":
        """Inverse of :meth:`to_value`."""
        fm_milli, flags = struct.unpack("<II", value)
        return cls(fm_milli / FM_UNIT, scale_slow_start=bool(flags & SCALE_SLOW_START))


def require_root() -> None:
    """Raise CcNotRoot unless running as root (registration, maps and routes all need it)."""
    if os.geteuid() != 0:
        raise CcNotRoot("the tame congestion control needs root (BPF struct_ops and routes); run as root")


def object_path() -> Path:
    """The compiled BPF object for this kernel, building it first (probes/bpf/build.sh) if missing or stale."""
    try:
        btf = KERNEL_BTF.read_bytes()
    except OSError as exc:
        raise CcUnavailable(
            f"{KERNEL_BTF}: {exc.strerror}; this kernel has no BTF, so no BPF congestion control") from exc
    digest = hashlib.sha256(SOURCE.read_bytes() + BUILD_SCRIPT.read_bytes() + btf).hexdigest()[:16]
    target = cache_dir() / f"tame_cc-{digest}.bpf.o"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tame_cc-", suffix=".o", dir=target.parent)
    os.close(fd)
    try:
        try:
            run(["bash", str(BUILD_SCRIPT), tmp], timeout_s=BUILD_TIMEOUT_S)
        except TestbedCommandFailed as exc:
            raise CcUnavailable(
                f"cannot build the tame congestion control (needs clang, llvm, libbpf-dev and bpftool; "
                f"run 'make deps'): {exc}"
            ) from exc
        os.replace(tmp, target)  # atomic: a concurrent first use never loads a half-written object
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _bpftool_json(*args: str) -> object:
    try:
        out = run(["bpftool", "-j", *args], timeout_s=BPFTOOL_TIMEOUT_S)
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(str(exc)) from exc
    try:
        return json.loads(out or "null")
    except json.JSONDecodeError as exc:
        raise CcCommandFailed(f"bpftool {' '.join(args)}: output is not JSON") from exc


def _struct_ops_map() -> dict | None:
    """bpftool's record of the registered struct_ops map named tame, or None."""
    shown = _bpftool_json("map", "show") or []
    found = [m for m in shown if m.get("type") == "struct_ops" and m.get("name") == NAME]
    if len(found) > 1:
        raise CcCommandFailed(f"{len(found)} struct_ops maps named {NAME!r} are registered; unload them by id")
    return found[0] if found else None


@dataclass(frozen=True)
class Registration:
    """The registered control: its struct_ops map id and the id of its FM map."""

    struct_ops_id: int
    fm_map_id: int


def registration() -> Registration | None:
    """The registered tame control, or None when it is not registered."""
    ops = _struct_ops_map()
    if ops is None:
        return None
    maps = _bpftool_json("map", "show") or []
    fm = [m for m in maps if m.get("name") == FM_MAP and m.get("btf_id") == ops.get("btf_id")]
    if len(fm) != 1:
        raise CcCommandFailed(f"{NAME} is registered (struct_ops id {ops['id']}) but its {FM_MAP} map was not found")
    if (fm[0].get("bytes_key"), fm[0].get("bytes_value")) != (KEY_BYTES, VALUE_BYTES):
        raise CcOutdated(
            f"the registered {NAME} (struct_ops id {ops['id']}) is an older build: its {FM_MAP} map has "
            f"{fm[0].get('bytes_key')}-byte keys, this one {KEY_BYTES}; clear its routes (tame cc clear DEST, in each "
            f"namespace), then run 'tame cc unload' and 'tame cc load'")
    return Registration(struct_ops_id=int(ops["id"]), fm_map_id=int(fm[0]["id"]))


def _require_registration() -> Registration:
    reg = registration()
    if reg is None:
        raise CcNotLoaded(f"the {NAME} congestion control is not registered; run 'tame cc load' first")
    return reg


def load() -> tuple[Registration, bool]:
    """Register the control (building it if needed); returns it and whether this call registered it."""
    require_root()
    reg = registration()
    if reg is not None:
        return reg, False
    if NAME in available_controls():
        raise CcCommandFailed(f"a congestion control named {NAME!r} that is not this BPF program is registered")
    obj = object_path()
    try:
        run(["bpftool", "struct_ops", "register", str(obj)], timeout_s=BPFTOOL_TIMEOUT_S)
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(f"cannot register {NAME}: {exc}") from exc
    return _require_registration(), True


def unload() -> bool:
    """Unregister the control (its maps go with it); returns False when it was not registered."""
    require_root()
    ops = _struct_ops_map()
    if ops is None:
        return False
    try:
        run(["bpftool", "struct_ops", "unregister", "id", str(ops["id"])], timeout_s=BPFTOOL_TIMEOUT_S)
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(f"cannot unregister {NAME}: {exc}") from exc
    return True


def all_settings() -> dict[tuple[int, Address], CcSetting]:
    """Every entry in the registered control's map, of every network namespace: {(cookie, address): setting}."""
    reg = _require_registration()
    dumped = _bpftool_json("map", "dump", "id", str(reg.fm_map_id)) or []
    return {key_parts(bytes(int(b, 16) for b in entry["key"])):
            CcSetting.from_value(bytes(int(b, 16) for b in entry["value"])) for entry in dumped}


def settings(netns: int | None = None) -> dict[Address, CcSetting]:
    """Every destination's setting for the sockets of one network namespace (None: this process's)."""
    cookie = netns_cookie() if netns is None else netns
    return {addr: setting for (owner, addr), setting in all_settings().items() if owner == cookie}


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune_gone` removed: the FM entries and lock files of network namespaces that are gone, and the
    processes whose open files could not be read (a socket there could hold a namespace taken for gone)."""

    entries: dict[tuple[int, Address], CcSetting]
    lock_files: tuple[str, ...] = ()
    unread_pids: tuple[int, ...] = ()


def set_fm(addr: Address, setting: CcSetting, netns: int | None = None) -> Pruned | None:
    """Write ``addr``'s setting into the map for one network namespace's sockets (None: this process's). A full map
    is first rid of the entries of namespaces that are gone (:func:`prune_gone`), returned; None when it was not
    full."""
    value = setting.to_value()
    require_root()
    reg = _require_registration()
    key = map_key(addr, netns_cookie() if netns is None else netns)
    argv = ["bpftool", "map", "update", "id", str(reg.fm_map_id), "key", "hex", *(f"{b:02x}" for b in key),
            "value", "hex", *(f"{b:02x}" for b in value)]
    try:
        run(argv, timeout_s=BPFTOOL_TIMEOUT_S)
        return None
    except TestbedCommandFailed as exc:
        if "Argument list too long" not in str(exc):  # E2BIG: a hash map at max_entries refuses a new key
            raise CcCommandFailed(f"cannot set FM for {addr}: {exc}") from exc
    # Pruned only here, where the dead weight costs something: scanning every process is too slow for every set.
    try:
        pruned = prune_gone()
    except CcLivenessUnknown as exc:
        raise _map_full(addr, key, f"entries of namespaces that are gone cannot be told apart ({exc})") from None
    if pruned.entries:
        try:
            run(argv, timeout_s=BPFTOOL_TIMEOUT_S)
            return pruned
        except TestbedCommandFailed as exc:
            if "Argument list too long" not in str(exc):
                raise CcCommandFailed(f"cannot set FM for {addr}: {exc}") from exc
    raise _map_full(addr, key, f"{len(pruned.entries)} entries of namespaces that are gone were removed, and every "
                    "other entry is of a live one")


def _map_full(addr: Address, key: bytes, pruning: str) -> CcMapFull:
    held = all_settings()
    elsewhere = sum(1 for cookie, _ in held if cookie != key_parts(key)[0])
    return CcMapFull(
        f"cannot set FM for {addr}: the {FM_MAP} map is full ({len(held)} entries, {elsewhere} of them of other "
        f"network namespaces; {pruning}): clear the destinations no longer in use (tame cc clear DEST, in their "
        "namespace), or tame cc unload, then tame cc load, which empties it")


def prune_gone() -> Pruned:
    """Remove the FM entries and the lock files (:data:`LOCK_DIR`) of network namespaces that no longer exist
    (:func:`probes.live_netns.gone`; cookies are never reused, so nothing can use them again). CcLivenessUnknown,
    removing nothing, when not every live namespace can be seen."""
    require_root()
    reg = _require_registration()
    every = all_settings()
    locks = {path: int(m.group(1)) for path in (LOCK_DIR.glob("fm-*.lock") if LOCK_DIR.is_dir() else [])
             if (m := re.fullmatch(r"fm-(\d+)-.+\.lock", path.name))}
    here = netns_cookie()
    candidates = {cookie for cookie, _ in every} | set(locks.values())
    dead, unread = live_netns.gone(candidates - {here})
    doomed = {k: v for k, v in every.items() if k[0] in dead}
    if doomed:
        with tempfile.NamedTemporaryFile("w", prefix="tame-prune-", suffix=".batch") as batch:
            batch.write("".join(f"map delete id {reg.fm_map_id} key hex "
                                f"{' '.join(f'{b:02x}' for b in map_key(addr, cookie))}\n" for cookie, addr in doomed))
            batch.flush()
            try:
                run(["bpftool", "batch", "file", batch.name], timeout_s=BPFTOOL_TIMEOUT_S)
            except TestbedCommandFailed as exc:
                raise CcCommandFailed(f"cannot remove the entries of network namespaces that are gone: {exc}") \
                    from exc
    removed_locks = tuple(str(path) for path, cookie in sorted(locks.items()) if cookie in dead and _unlink_free(path))
    return Pruned(doomed, removed_locks, tuple(unread))


def _unlink_free(path: Path) -> bool:
    """Remove the lock file ``path`` unless a process holds it; whether it was removed."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                return False
        except FileNotFoundError:
            return False
        path.unlink()  # while held, as exclusive_setting's holder does: one waiting locks a new file
        return True
    finally:
        os.close(fd)


def delete_fm(addr: Address, netns: int | None = None) -> bool:
    """Remove ``addr``'s entry for one network namespace (None: this process's); returns False when it had none."""
    require_root()
    cookie = netns_cookie() if netns is None else netns
    if addr not in settings(cookie):
        return False
    reg = _require_registration()
    try:
        run(["bpftool", "map", "delete", "id", str(reg.fm_map_id),
             "key", "hex", *(f"{b:02x}" for b in map_key(addr, cookie))], timeout_s=BPFTOOL_TIMEOUT_S)
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(f"cannot delete the entry for {addr}: {exc}") from exc
    return True


# Lock files, one per (network namespace, destination address), that a process setting its FM holds (flock:
# released when the process ends, killed too). Root's: only root sets the map. The holder removes its file as it lets
# go (namespace cookies are never reused, so files left behind would pile up); a process killed meanwhile leaves one,
# which prune_gone removes once its namespace is gone.
LOCK_DIR = Path("/run/tame")


@contextmanager
def exclusive_setting(addr: Address) -> Iterator[None]:
    """Hold ``addr``'s FM entry for this process for the block: CcBusy when another process holds it (two transfers
    to one address would share its entry, and the one that ends first would put it back under the other)."""
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = LOCK_DIR / f"fm-{netns_cookie()}-{addr}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CcBusy(f"another process (a tame transfer or apply) is setting the FM for {addr}: run one at a "
                         "time per address") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # its holder removed the file as it let go: lock the one there now
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # while still held: a process waiting on this file locks a new one
        os.close(fd)


# Signals that end a process by unwinding it (the commands turn them into KeyboardInterrupt): held back while an
# entry is put back, so that a second Ctrl-C, or a hang-up during the first one's clean-up, cannot leave it set.
_UNWINDING_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def restore_fm(addr: Address, previous: CcSetting | None) -> None:
    """Put ``addr``'s entry back to ``previous`` (None: remove it), with the unwinding signals held back until it is
    done (they are delivered after). Nothing to do when the control was unregistered meanwhile: the map, and the
    entry with it, went with the registration (the transfer's sockets kept the control until they closed)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _UNWINDING_SIGNALS)
    try:
        if previous is not None:
            set_fm(addr, previous)
        else:
            delete_fm(addr)
    except CcNotLoaded:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextmanager
def temporary_setting(addr: Address, setting: CcSetting) -> Iterator[Pruned | None]:
    """``addr``'s entry set to ``setting`` for the block, then put back as it was (removed if it had none), also
    when a signal comes while it is being set or put back; yields what setting it removed from a full map
    (:func:`set_fm`; None when the map was not full). Another process changing the same entry meanwhile is not
    detected."""
    previous = settings().get(addr)
    try:
        yield set_fm(addr, setting)
    finally:
        restore_fm(addr, previous)


def _ip(addr: Address) -> list[str]:
    return ["ip", "-6" if addr.version == 6 else "-4"]


def _prefix(addr: Address) -> str:
    return f"{addr}/{addr.max_prefixlen}"


# What apply_route copies from the route the kernel picks for a destination. A route with anything else (an encap,
# a metric this does not know) is refused: a copy without it would forward differently.
_ROUTE_KEYS = {"type", "dst", "gateway", "via", "dev", "table", "protocol", "scope", "flags", "metrics", "nexthops",
               "prefsrc", "metric", "pref", "nhid",
               "expires", "nh_info"}  # the last two not copied: an RA route's lifetime, what nhid already names
_COPIED_METRICS = {"mtu", "advmss", "window", "initcwnd", "initrwnd", "hoplimit", "reordering", "quickack",
                   "fastopen_no_cookie", "ssthresh", "cwnd"}
_HOP_FLAGS = {"onlink"}  # kept; the others (linkdown, dead, pervasive, offload...) are the kernel's state


def _routes(addr: Address, *args: str) -> list[dict]:
    try:
        return json.loads(run([*_ip(addr), "-j", "-d", "route", *args]) or "[]")
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(str(exc)) from exc


def route_is_ours(route: dict | None) -> bool:
    """Whether ``route`` was added by :func:`apply_route`: its protocol is ROUTE_PROTO and it is a unicast route
    through a device or next hops, as apply_route makes them (a blackhole or unreachable route given that protocol
    is not)."""
    return (route is not None and str(route.get("protocol")) == ROUTE_PROTO
            and route.get("type", "unicast") == "unicast"
            and bool(route.get("dev") or route.get("nexthops") or route.get("nhid")))


# The highest user id (uid_t's -1 is "no user").
MAX_UID = 0xFFFFFFFE


@dataclass(frozen=True)
class RouteSelector:
    """What a TCP connection carries besides its destination that policy rules (``ip rule``) may choose its route by:
    the firewall mark it is sent with, its source address, the user id of the process that made its socket, the VRF
    its socket is bound to, and, for telling where a rule sends connections, its TOS, ports and the device its socket
    is bound to (None: no mark; the source the kernel picks; the user ``ip route get`` runs as, root; no VRF...)."""

    mark: int | None = None
    source: Address | None = None
    uid: int | None = None
    vrf: str | None = None
    tos: int | None = None
    sport: int | None = None
    dport: int | None = None
    oif: str | None = None

    def __post_init__(self) -> None:
        if self.mark is not None and not 0 <= self.mark <= 0xFFFFFFFF:
            raise ValueError(f"mark {self.mark}: a firewall mark is 0 to 0xffffffff")
        if self.uid is not None and not 0 <= self.uid <= MAX_UID:
            raise ValueError(f"uid {self.uid}: a user id is 0 to {MAX_UID}")
        if self.vrf is not None and (not _IFNAME.fullmatch(self.vrf) or self.vrf in (".", "..")):
            raise ValueError(f"vrf {self.vrf!r:.40}: a device name is 1 to 15 characters, without '/', ':' or spaces")

    def route_get(self, addr: Address) -> list[str]:
        """``ip route get`` arguments for a TCP connection to ``addr`` carrying this."""
        if self.source is not None and self.source.version != addr.version:
            raise ValueError(f"source {self.source} and destination {addr} are not of one IP version")
        args = {"from": self.source, "mark": None if self.mark is None else hex(self.mark), "uid": self.uid,
                "vrf": self.vrf, "tos": None if self.tos is None else hex(self.tos), "sport": self.sport,
                "dport": self.dport, "oif": self.oif}
        return ["route", "get", str(addr), "ipproto", "tcp",
                *(word for key, value in args.items() if value is not None for word in (key, str(value))), "fibmatch"]

    def picks(self, rule: dict) -> bool:
        """Whether a connection carrying this matches every selector of ``rule`` (``ip -j rule`` form) but its
        destination."""
        if rule.get("fwmark") is not None:
            mask = int(rule.get("fwmask", "0xffffffff"), 16)
            if self.mark is None or self.mark & mask != int(rule["fwmark"], 16) & mask:
                return False
        if rule.get("src", "all") != "all":
            prefix = ipaddress.ip_network(f"{rule['src']}/{rule.get('srclen', 128 if ':' in rule['src'] else 32)}")
            if self.source is None or self.source not in prefix:
                return False
        if rule.get("uid_start") is not None:
            if self.uid is None or not rule["uid_start"] <= self.uid <= rule.get("uid_end", rule["uid_start"]):
                return False
        if "l3mdev" in rule and self.vrf is None:
            return False
        return not (rule_selectors(rule) - {"fwmark", "fwmask", "src", "srclen", "uid_start", "uid_end", "l3mdev"})

    @classmethod
    def of_rule(cls, rule: dict) -> "RouteSelector | None":
        """What a connection that ``rule`` (``ip -j rule`` form) picks out carries, as far as ``ip route get`` can
        carry it (None: the rule chooses by something it cannot, a source prefix, a VRF or a negation)."""
        if "not" in rule or rule_selectors(rule) - {"fwmark", "fwmask", "uid_start", "uid_end", "tos", "sport",
                                                 "sport_start", "sport_end", "dport", "dport_start", "dport_end",
                                                 "oif", "ipproto"}:
            return None
        return cls(mark=int(rule["fwmark"], 16) if "fwmark" in rule else None, uid=rule.get("uid_start"),
                   tos=int(rule["tos"], 16) if "tos" in rule else None,
                   sport=rule.get("sport", rule.get("sport_start")), dport=rule.get("dport", rule.get("dport_start")),
                   oif=rule.get("oif"))


# A network device's name as the kernel takes it (dev_valid_name): below IFNAMSIZ, no '/', ':' or white space.
_IFNAME = re.compile(r"[^/:\s]{1,15}")

# How ``ip -j rule`` names TCP in an ``ipproto`` rule (a number where it knows no name).
_TCP = ("tcp", "6")

# Keys of ``ip -j rule`` that are not a selector route get cannot see (the destination, ``dst``, it sees).
_RULE_NOT_SELECTORS = {"priority", "table", "action", "dst", "dstlen", "protocol", "goto", "suppress_prefixlen",
                       "suppress_ifgroup", "realms", "flags", "not", "iif_detached", "oif_detached"}


def rule_selectors(rule: dict) -> set[str]:
    """The keys of a policy rule (``ip -j rule`` form) that choose by something ``route get DEST`` does not see:
    not ``from all``, not ``iif lo`` (a connection of this host's own is looked up from lo, as route get's is) and not
    ``ipproto tcp`` (route get's lookup is a TCP connection's, as the control's connections are)."""
    return (set(rule) - _RULE_NOT_SELECTORS - ({"src"} if rule.get("src", "all") == "all" else set())
            - ({"iif"} if rule.get("iif") == "lo" else set())
            - ({"ipproto"} if rule.get("ipproto") in _TCP else set()))


def _never_picks_own_tcp(rule: dict) -> bool:
    """Whether ``rule`` can pick out none of this host's own TCP connections: one by another protocol, or by an
    incoming interface other than lo (the kernel looks a locally made connection up from lo)."""
    return "not" not in rule and (rule.get("iif", "lo") != "lo" or rule.get("ipproto", "tcp") not in _TCP)


def rules_choosing_otherwise(addr: Address, rules: list[dict], selector: RouteSelector) -> list[dict]:
    """The policy rules (``ip -j rule`` form) for ``addr`` that choose by something a connection carrying
    ``selector`` does not match (another mark, source, user, VRF, a TOS, a port...) and can pick out this host's own
    TCP connections: those they pick out can take another table's route than the one :func:`apply_route` set."""
    chosen = []
    for rule in rules:
        negated = "not" in rule  # of all its selectors together: kept whenever it has any
        if rule.get("dst") is not None and not negated:
            prefix = ipaddress.ip_network(f"{rule['dst']}/{rule.get('dstlen', addr.max_prefixlen)}", strict=False)
            if addr not in prefix:
                continue  # not a rule for this destination
        if rule_selectors(rule) and not _never_picks_own_tcp(rule) and (negated or not selector.picks(rule)):
            chosen.append(rule)
    return chosen


def policy_rules(addr: Address) -> list[dict]:
    """This namespace's policy rules of ``addr``'s family, as ``ip -j rule`` gives them."""
    try:
        return json.loads(run([*_ip(addr), "-j", "rule", "show"]) or "[]")
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(str(exc)) from exc


def _locked_metrics(addr: Address, selector: RouteSelector) -> set[str]:
    """The metrics the route the kernel picks for ``addr`` locks (``mtu lock 1400``): ``ip -j`` does not say."""
    try:
        text = run([*_ip(addr), *selector.route_get(addr)])
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(str(exc)) from exc
    return set(re.findall(r"\b([a-z_]+) lock\b", text))


def _hop_args(hop: dict) -> list[str]:
    via = hop.get("via")  # a next hop of the other family (an IPv4 route via an IPv6 router, RFC 5549)
    argv = ["via", hop["gateway"]] if hop.get("gateway") else ["via", via["family"], via["host"]] if via else []
    argv += ["dev", hop["dev"]] if hop.get("dev") else []
    return argv + [flag for flag in hop.get("flags", []) if flag in _HOP_FLAGS]


def route_argv(addr: Address, picked: dict, locked: set[str]) -> list[str]:
    """``ip route replace`` for exactly ``addr`` as the route the kernel picks for it (``picked``, ``ip -j -d route
    get ADDR fibmatch``: its table, next hops or nexthop object, source, scope, preference and metrics, with the
    ``locked`` ones locked), plus ``congctl tame`` and protocol ROUTE_PROTO. CcRouteConflict for a route it cannot
    copy."""
    odd = sorted(set(picked) - _ROUTE_KEYS)
    metrics = {k: v for m in picked.get("metrics", []) for k, v in m.items() if k != "congestion"}
    odd += sorted(set(metrics) - _COPIED_METRICS)
    if odd:
        raise CcRouteConflict(
            f"the route to {addr} ({picked.get('dst')}, table {picked.get('table', 'main')}) has {', '.join(odd)}, "
            f"which tame cc apply does not copy: add 'congctl {NAME}' to a route for {_prefix(addr)} yourself")
    argv = [*_ip(addr), "route", "replace", _prefix(addr), "table", str(picked.get("table", "main"))]
    if picked.get("prefsrc"):
        argv += ["src", picked["prefsrc"]]
    if picked.get("scope") in ("link", "host"):
        argv += ["scope", picked["scope"]]
    if picked.get("pref"):
        argv += ["pref", picked["pref"]]
    for name, value in metrics.items():
        argv += [name, *(["lock"] if name in locked else []), str(value)]
    argv += ["proto", ROUTE_PROTO, "congctl", NAME]
    if picked.get("nhid"):
        return argv + ["nhid", str(picked["nhid"])]
    if picked.get("nexthops"):
        for hop in picked["nexthops"]:
            argv += ["nexthop", *_hop_args(hop), "weight", str(hop.get("weight", 1))]
        return argv
    return argv + _hop_args(picked)


def picked_route(addr: Address, selector: RouteSelector = RouteSelector()) -> dict:
    """The route the kernel picks for a TCP connection to ``addr`` carrying ``selector`` (``ip -j -d route get ...
    fibmatch``: after policy rules); CcRouteConflict when there is none."""
    try:
        got = json.loads(run([*_ip(addr), "-j", "-d", *selector.route_get(addr)]) or "[]")
    except TestbedCommandFailed as exc:  # unreachable from here: the destination to change, not the machine
        raise CcRouteConflict(f"no route to {addr} here: {exc}") from exc
    if not got or got[0].get("type", "unicast") != "unicast" or got[0].get("dev") == "lo":
        raise CcRouteConflict(f"{addr} is not reached through a unicast route here (it may be this host's own address)")
    return got[0]


def vrf_table(name: str) -> str:
    """The routing table of VRF device ``name`` in this namespace; CcNotAVrf when there is no such device or it is
    not a VRF."""
    lookup = "ip -br link show type vrf lists this namespace's VRFs"
    try:
        links = json.loads(run(["ip", "-j", "-d", "link", "show", "dev", name]) or "[]")
    except TestbedCommandFailed as exc:
        if "does not exist" in str(exc):
            raise CcNotAVrf(f"--vrf {name}: no device of that name in this network namespace ({lookup})") from None
        raise CcCommandFailed(str(exc)) from exc
    info = (links[0].get("linkinfo") or {}) if links else {}
    if info.get("info_kind") != "vrf" or "table" not in info.get("info_data", {}):
        kind = f"a {info['info_kind']} device" if info.get("info_kind") else "a device"
        raise CcNotAVrf(f"--vrf {name}: {kind}, not a VRF ({lookup})")
    return str(info["info_data"]["table"])


def apply_route(addr: Address, selector: RouteSelector = RouteSelector()) -> str:
    """Route ``addr`` as the kernel routes it now for a TCP connection carrying ``selector`` (policy rules, a VRF's
    table, next hops, MTU and other metrics), plus ``congctl tame``, in this namespace; returns the routes for exactly
    ``addr`` as ``ip`` prints them."""
    require_root()
    table = vrf_table(selector.vrf) if selector.vrf is not None else None
    picked = picked_route(addr, selector)
    if table is not None and str(picked.get("table")) != table:
        raise CcRouteConflict(f"a connection in VRF {selector.vrf} to {addr} takes a route of table "
                              f"{picked.get('table', 'main')}, not of the VRF's table {table}: check its l3mdev rule "
                              "(ip rule show)")
    # A route for exactly the address is the one picked: ours from an earlier apply (copied again as it is), or
    # someone else's, not ours to replace.
    if picked.get("dst") in (str(addr), _prefix(addr)) and not route_is_ours(picked):
        raise CcRouteConflict(
            f"a route for {_prefix(addr)} that tame did not add exists ({picked.get('dev', '?')}, table "
            f"{picked.get('table', 'main')}); remove it or add 'congctl {NAME}' to it yourself")
    try:
        run(route_argv(addr, picked, _locked_metrics(addr, selector)))
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(f"cannot add the route for {addr}: {exc}") from exc
    return describe_route(addr) or ""


@dataclass(frozen=True)
class RuleRoute:
    """A policy rule whose connections to an address do not take the route :func:`apply_route` set: the rule
    (``ip -j rule`` form), the route the kernel picks for them and the ``ip route replace`` that would give them the
    control (None, None: where they go cannot be told with ``ip route get``; argv None: that route cannot be
    copied)."""

    rule: dict
    route: dict | None = None
    argv: tuple[str, ...] | None = None


def rules_routing_elsewhere(addr: Address, rules: list[dict], selector: RouteSelector) -> list[RuleRoute]:
    """Of :func:`rules_choosing_otherwise`, those whose TCP connections to ``addr`` do not take a route of ours (run
    after :func:`apply_route`: a rule whose table has no route for ``addr`` falls through to it)."""
    found = []
    for rule in rules_choosing_otherwise(addr, rules, selector):
        probe = RouteSelector.of_rule(rule)
        if probe is None:
            found.append(RuleRoute(rule))
            continue
        try:
            route = picked_route(addr, probe)
        except CcRouteConflict:
            continue  # they reach no route to addr (a blackhole or unreachable rule): no route to give the control
        if route_is_ours(route):
            continue
        try:
            argv = tuple(route_argv(addr, route, _locked_metrics(addr, probe)))
        except CcRouteConflict:
            argv = None
        found.append(RuleRoute(rule, route, argv))
    return found


def clear_route(addr: Address, table: str | None = None) -> int:
    """Remove the routes for exactly ``addr`` that :func:`apply_route` added, from every table (or only ``table``);
    returns how many."""
    require_root()
    removed = 0
    for route in _routes(addr, "show", "table", table or "all", "exact", _prefix(addr)):
        if not route_is_ours(route):
            continue
        try:
            run([*_ip(addr), "route", "del", _prefix(addr), "table", str(route.get("table", table or "main")),
                 "proto", ROUTE_PROTO])
        except TestbedCommandFailed as exc:
            raise CcCommandFailed(f"cannot remove the route for {addr}: {exc}") from exc
        removed += 1
    return removed


def our_routes() -> list[str]:
    """This namespace's routes that :func:`apply_route` added (protocol ROUTE_PROTO), both families and every table,
    as ``ip -o`` prints them."""
    out = []
    for family in ("-4", "-6"):
        try:
            text = run(["ip", family, "-o", "route", "show", "table", "all", "proto", ROUTE_PROTO])
        except TestbedCommandFailed as exc:
            raise CcCommandFailed(str(exc)) from exc
        out += [_one_line(line) for line in text.splitlines() if line.strip()]
    return out


def _one_line(text: str) -> str:
    """``ip -o`` output on one line: its ``\\`` line breaks and runs of white space as single spaces."""
    return " ".join(text.replace("\\", " ").split())


def describe_route(addr: Address) -> str | None:
    """This namespace's routes for exactly ``addr``, every table, in plain text on one line (None: none)."""
    try:
        out = run([*_ip(addr), "-o", "route", "show", "table", "all", "exact", _prefix(addr)]).strip()
    except TestbedCommandFailed as exc:
        raise CcCommandFailed(str(exc)) from exc
    return _one_line(out) or None


if __name__ == "__main__":  # `python -m probes.cc`: build for this kernel (the install step) and print the path
    print(object_path())
