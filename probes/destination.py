"""DEST[:PORT] as users type it: a host name, an IPv4 address or a bracketed IPv6 address."""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

DEFAULT_IPERF_PORT = 5201

# RFC 1123 labels: letters, digits and inner hyphens, 1-63 characters each, 253 in all (ASCII only:
# fullmatch, so a trailing line break is not taken for the end of the label).
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
# A last label of digits or 0x-hex makes the C library read the name as an IPv4 address (inet_aton:
# 0x7f000001, 0x7f.1, 127.1 and 0177.0.0.1 are all 127.0.0.1); only dotted decimal is taken as one.
_NUMERIC_LABEL = re.compile(r"(?:0[xX][0-9A-Fa-f]*|[0-9]+)")
_PORT = re.compile(r"[0-9]{1,5}")
# An IPv6 zone (the part after %) names a network interface.
_ZONE = re.compile(r"[A-Za-z0-9_.-]{1,15}")


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
    if "://" in text or "/" in text:
        raise ValueError(f"destination {text!r} looks like a URL or a path; give the iperf3 server as HOST or "
                         "HOST:PORT, e.g. 192.0.2.7:5201 (no scheme, no '/')")
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
            address = ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ValueError(f"destination {text!r}: {host!r} is not an IPv6 address") from exc
        _check_zone(address, text)
    elif text.count(":") > 1:
        raise ValueError(f"destination {text!r}: put an IPv6 address in brackets, e.g. [{text}]:5201")
    else:
        host, sep, port_text_raw = text.partition(":")
        port_text = port_text_raw if sep else None
        _check_host(host, text)
    port = default_port if port_text is None else _parse_port(port_text, text)
    return Destination(host=host, port=port)


def _parse_port(port_text: str, text: str) -> int:
    if not _PORT.fullmatch(port_text):
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
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError(
            f"destination {text!r}: {host!r} is not a valid host name "
            "(letters, digits, '-' and '.', labels of at most 63 characters)"
        )
    if _NUMERIC_LABEL.fullmatch(name.rsplit(".", 1)[-1]):
        try:
            read_as = f" (the system would read it as {socket.inet_ntoa(socket.inet_aton(name))})"
        except OSError:
            read_as = ""
        raise ValueError(f"destination {text!r}: {host!r} is not a valid IPv4 address{read_as}; "
                         "write an IPv4 address as four decimal numbers, e.g. 127.0.0.1")


def _check_zone(address: ipaddress.IPv6Address, text: str) -> None:
    """An IPv6 zone (``%eth0``) only on a link-local address, naming an interface this host has."""
    zone = address.scope_id
    if zone is None:
        return
    if not address.is_link_local:
        raise ValueError(f"destination {text!r}: a zone (%{zone}) belongs only on a link-local address "
                         "(fe80::/10); leave it out")
    try:
        known = _ZONE.fullmatch(zone) is not None and socket.if_nametoindex(zone) > 0
    except OSError:
        known = False
    if not known:
        raise ValueError(f"destination {text!r}: %{zone!r} is not a network interface of this host; "
                         "give the interface name, e.g. [fe80::1%eth0]")
