"""Destinations as the service keys them: ``host:port`` with the host lower-cased (IPv6 in brackets).

This is the advisor's own validation of user input. When ``probes.destination`` (the probe
layer's DEST[:PORT] parser) is merged, ``parse_destination`` can delegate to it; the canonical
key format here must stay the same because the store uses it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from advisor.errors import InvalidRequest

DEFAULT_PORT = 5201  # iperf3's default
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class Destination:
    """A validated probe target: host name or IP literal, and TCP port."""

    host: str
    port: int

    @property
    def key(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def _valid_hostname(host: str) -> bool:
    if len(host) > 253:
        return False
    labels = host.rstrip(".").split(".")
    # An all-numeric last label would be a malformed IPv4 address, not a name.
    return all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def parse_destination(text: str) -> Destination:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 literal; InvalidRequest says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("dest is empty; give HOST or HOST:PORT, e.g. dtn1.example.org:5201")
    raw = text.strip()
    if len(raw) > 300:
        raise InvalidRequest("dest is too long; give HOST or HOST:PORT")
    host, port_text = raw, None
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise InvalidRequest(f"dest {raw!r}: missing ']' after the IPv6 address; write [ADDRESS]:PORT")
        host, rest = raw[1:end], raw[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise InvalidRequest(f"dest {raw!r}: write [ADDRESS]:PORT")
            port_text = rest[1:]
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    port = DEFAULT_PORT
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise InvalidRequest(f"dest {raw!r}: port {port_text!r} must be a number between 1 and 65535")
        port = int(port_text)
    host = host.lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not _valid_hostname(host):
            raise InvalidRequest(
                f"dest {raw!r}: {host!r} is not a valid host name or IP address "
                "(letters, digits and '-' in dot-separated labels)"
            ) from None
        return Destination(host.rstrip("."), port)
    return Destination(address.compressed, port)
