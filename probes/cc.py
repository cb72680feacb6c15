"""The tame congestion control (``bpf/tame_cc.bpf.c``): its build and kernel-wide registration, and what its FM map
(:mod:`probes.cc_map`) and its routes (:mod:`probes.cc_routes`) share: its name, destination addresses, root.

These three are the modules that run bpftool and ``ip route`` for it; every call is an argv list with a deadline
(:func:`probes.netns.run`), and failures become :class:`CcError` subclasses.

* Registration is kernel-wide (``bpftool struct_ops register``); its hash map of fractional multipliers
  (:mod:`probes.cc_map`) lives as long as the registration. The map is found by id, not by a pin: the struct_ops map
  ``tame`` and ``tame_fm`` share one BTF object id. Pins under /sys/fs/bpf are invisible inside ``ip netns exec``
  (it remounts /sys), where the test bed's senders run.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from probes.controls import available_controls
from probes.delayline import cache_dir
from probes.errors import CcCommandFailed, CcNotLoaded, CcNotRoot, CcOutdated, CcUnavailable
from probes.netns import TestbedCommandFailed, run

NAME = "tame"
"""The congestion control's name (``iperf3 -C tame``, ``congctl tame``) and its struct_ops map's."""
FM_MAP = "tame_fm"
"""The name of its map of per-destination settings (:mod:`probes.cc_map`)."""
KEY_BYTES, VALUE_BYTES = 24, 8
"""The FM map's key (struct tame_key: the namespace cookie and the address) and value (struct tame_setting) sizes."""

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


def bpftool_json(*args: str) -> object:
    """``bpftool -j ARGS``'s output, parsed; CcCommandFailed when it fails or is not JSON."""
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
    shown = bpftool_json("map", "show") or []
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
    maps = bpftool_json("map", "show") or []
    fm = [m for m in maps if m.get("name") == FM_MAP and m.get("btf_id") == ops.get("btf_id")]
    if len(fm) != 1:
        raise CcCommandFailed(f"{NAME} is registered (struct_ops id {ops['id']}) but its {FM_MAP} map was not found")
    if (fm[0].get("bytes_key"), fm[0].get("bytes_value")) != (KEY_BYTES, VALUE_BYTES):
        raise CcOutdated(
            f"the registered {NAME} (struct_ops id {ops['id']}) is an older build: its {FM_MAP} map has "
            f"{fm[0].get('bytes_key')}-byte keys, this one {KEY_BYTES}; clear its routes (tame cc clear DEST, in each "
            f"namespace), then run 'tame cc unload' and 'tame cc load'")
    return Registration(struct_ops_id=int(ops["id"]), fm_map_id=int(fm[0]["id"]))


def require_registration() -> Registration:
    """The registered tame control; CcNotLoaded when it is not registered."""
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
    return require_registration(), True


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


if __name__ == "__main__":  # `python -m probes.cc`: build for this kernel (the install step) and print the path
    print(object_path())
