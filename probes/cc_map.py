"""The tame congestion control's map of per-destination settings (``tame_fm``): its keys and values, setting,
removing and holding entries, and pruning those of network namespaces that are gone.

The map holds the fractional multiplier (FM x 1000) and flags per destination, keyed by the network namespace's cookie
and the 16-byte IPv6 or IPv4-mapped address, and lives as long as the registration (:mod:`probes.cc`). Entries are per
namespace, as routes are: every function here reads and writes those of the namespace it runs in unless given
another's cookie (:func:`netns_cookie`), so a transfer or ``apply`` in one container never sets another's streams.
"""

from __future__ import annotations

import fcntl
import ipaddress
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

from probes import live_netns
from probes.cc import (BPFTOOL_TIMEOUT_S, FM_MAP, Address, bpftool_json, require_registration,
                       require_root)
from probes.errors import CcBusy, CcCommandFailed, CcLivenessUnknown, CcMapFull, CcNotLoaded
from probes.netns import TestbedCommandFailed, run

FM_UNIT = 1000
"""The map holds round(FM x FM_UNIT) as a u32."""
MAX_FM = 1_000_000.0
"""Largest FM the map can hold with headroom in the kernel's u64 threshold (cwnd x FM x 1000)."""
SCALE_SLOW_START = 1
"""Flag bit: slow start grows acked/FM per ack (TAME_SCALE_SLOW_START in the BPF source)."""
SCALE_SLOW_START_BY_DEFAULT = False
"""Whether `tame cc apply` scales slow start (docs/tame-cc.md: what the calibration measured)."""


SO_NETNS_COOKIE = live_netns.SO_NETNS_COOKIE


def netns_cookie(namespace: str | None = None) -> int:
    """The cookie of this process's network namespace, or of the named one (``ip netns``): what the map's entries
    are keyed by, as the kernel gives the program each socket's."""
    if namespace is not None:
        try:
            done = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c",
                                   "from probes.cc_map import netns_cookie; print(netns_cookie())"],
                                  capture_output=True, text=True, timeout=30, check=True,
                                  cwd=Path(__file__).resolve().parent.parent)
        except subprocess.CalledProcessError as exc:
            raise CcCommandFailed(f"cannot read network namespace {namespace!r}'s cookie: {exc.stderr.strip()}") \
                from None
        return int(done.stdout)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return live_netns.socket_cookie(sock)


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


def all_settings() -> dict[tuple[int, Address], CcSetting]:
    """Every entry in the registered control's map, of every network namespace: {(cookie, address): setting}."""
    reg = require_registration()
    dumped = bpftool_json("map", "dump", "id", str(reg.fm_map_id)) or []
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
    reg = require_registration()
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
    reg = require_registration()
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
    reg = require_registration()
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
