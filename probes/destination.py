"""DEST[:PORT] as users type it: a host name, an IPv4 address or a bracketed IPv6 address."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_IPERF_PORT = 5201

# RFC 1123 labels: letters, digits and inner hyphens, 1-63 characters each, 253 in all.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class Destination:
    """Where an iperf3 server listens. ``host`` is a name or an address without brackets."""

    host: str
    port: int = DEFAULT_IPERF_PORT

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_destination(text: str, default_port: int = DEFAULT_IPERF_PORT) -> Destination:
    """Parse ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; raise ValueError saying what to fix."""
    text = text.strip()
    if not text:
        raise ValueError("destination is empty; give HOST or HOST:PORT, e.g. 192.0.2.7:5201")
    port_text: str | None = None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"destination {text!r}: missing ']' after the IPv6 address")
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"destination {text!r}: expected ':PORT' after ']'")
            port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ValueError(f"destination {text!r}: {host!r} is not an IPv6 address") from exc
    elif text.count(":") > 1:
        raise ValueError(f"destination {text!r}: put an IPv6 address in brackets, e.g. [{text}]:5201")
    else:
        host, sep, port_text_raw = text.partition(":")
        port_text = port_text_raw if sep else None
        _check_host(host, text)
    port = default_port if port_text is None else _parse_port(port_text, text)
    return Destination(host=host, port=port)


def _parse_port(port_text: str, text: str) -> int:
    if not port_text.isdigit():
        raise ValueError(f"destination {text!r}: port {port_text!r} must be a number from 1 to 65535")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"destination {text!r}: port {port} is out of range; use 1 to 65535")
    return port


def _check_host(host: str, text: str) -> None:
    if not host:
        raise ValueError(f"destination {text!r}: the host is missing before ':'")
    try:
        ipaddress.IPv4Address(host)
        return
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        raise ValueError(
            f"destination {text!r}: {host!r} is not a valid host name "
            "(letters, digits, '-' and '.', labels of at most 63 characters)"
        )
    if name.replace(".", "").isdigit():
        raise ValueError(f"destination {text!r}: {host!r} is not a valid IPv4 address")
