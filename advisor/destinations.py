"""Destinations as the service keys them: ``host:port`` with the host lower-cased (IPv6 in brackets).

The syntax is checked by the probe layer's DEST[:PORT] parser; the key format here must stay
as it is because the store uses it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from advisor.errors import InvalidRequest
from advisor.limits import MAX_DEST_LENGTH
from probes import destination as probe_destination

DEFAULT_PORT = probe_destination.DEFAULT_IPERF_PORT


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


def parse_destination(text: str) -> Destination:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 literal; InvalidRequest says what is wrong.

    Syntax is the probe layer's (:func:`probes.destination.parse_destination`); this adds the
    canonical form the store keys on: lower-case names without a trailing dot, compressed addresses.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("dest is empty; give HOST or HOST:PORT, e.g. dtn1.example.org:5201")
    raw = text.strip()
    if len(raw) > MAX_DEST_LENGTH:
        raise InvalidRequest("dest is too long; give HOST or HOST:PORT")
    if raw.count(":") > 1 and not raw.startswith("[") and "/" not in raw:
        raw = f"[{raw}]"  # a bare IPv6 literal
    try:
        parsed = probe_destination.parse_destination(raw, default_port=DEFAULT_PORT)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return Destination(canonical_host(parsed.host), parsed.port)


def canonical_host(host: str) -> str:
    """One spelling per host: lower-case names without the trailing dot, IP addresses as canonical_address spells
    them."""
    address = canonical_address(host)
    return host.lower().rstrip(".") if address is None else address


def canonical_address(host: str) -> str | None:
    """An IP address in its one spelling: compressed, an IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4
    address it is, an IPv6 zone keeping its interface name's case; None when ``host`` is not an IP address."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            return f"{ipaddress.IPv6Address(host.partition('%')[0]).compressed}%{address.scope_id}"
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped.compressed
    return address.compressed


def client_key(host: str) -> str:
    """Who a remote address is, for the per-client limits (connections held, probes queued): the address in its one
    spelling (canonical_address), an IPv6 address but ::1 as its /64 (a host is given a whole /64 and may use any
    address in it); a host that is not an address (a proxy's header may say anything) as written."""
    canonical = canonical_address(host)
    if canonical is None:
        return host
    address = ipaddress.ip_address(canonical.partition("%")[0])
    if address.version == 6 and not address.is_loopback:
        return ipaddress.ip_network(f"{address}/64", strict=False).compressed
    return canonical
