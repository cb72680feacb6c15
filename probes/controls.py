"""TCP congestion controls by name: the name's form, and which controls this kernel offers.

A control's name is what the kernel registers it under (TCP_CA_NAME_MAX is 16 bytes with its NUL):
a lowercase letter, then up to 14 lowercase letters, digits or underscores ("cubic", "bbr", "reno",
"tame"). This module is the one reader of the kernel's control settings.
"""

from __future__ import annotations

import re
from pathlib import Path

CONTROL_NAME = re.compile(r"[a-z][a-z0-9_]{0,14}")
"""The form of a congestion control's name (the kernel's TCP_CA_NAME_MAX, 15 characters)."""
MAX_CONTROL_NAME = 15
AVAILABLE_PATH = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
DEFAULT_PATH = Path("/proc/sys/net/ipv4/tcp_congestion_control")

__all__ = ["CONTROL_NAME", "MAX_CONTROL_NAME", "available_controls", "host_default_control", "is_control_name"]


def is_control_name(name: object) -> bool:
    """Whether ``name`` has the form of a kernel congestion control's name."""
    return isinstance(name, str) and CONTROL_NAME.fullmatch(name) is not None


def host_default_control() -> str:
    """The congestion control sockets get here when they do not choose one (net.ipv4.tcp_congestion_control)."""
    return DEFAULT_PATH.read_text(encoding="ascii").strip()


def available_controls(path: Path = AVAILABLE_PATH) -> tuple[str, ...]:
    """The controls this kernel can give a socket now (net.ipv4.tcp_available_congestion_control)."""
    return tuple(path.read_text(encoding="ascii").split())
