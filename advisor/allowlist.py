"""The operator's list of destinations a probe may target, so the service cannot flood third parties."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from advisor.destinations import Destination
from advisor.errors import ConfigError, DestinationNotAllowed, InvalidRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], Sequence[str]]

DEFAULT_ALLOWED = "127.0.0.0/8,::1/128,localhost"


def system_resolver(host: str) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidRequest(f"dest host {host!r} does not resolve: {exc}") from exc
    return sorted({info[4][0] for info in infos})


@dataclass(frozen=True)
class AllowList:
    """CIDR networks and host names (``*.suffix`` matches sub-domains).

    An IP literal must be inside a listed network. A host name is allowed if it is listed
    itself, or if every address it resolves to is inside a listed network (so an unlisted
    name cannot be pointed at a third party's address).
    """

    networks: tuple[Network, ...]
    names: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> "AllowList":
        networks, names = [], []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
                continue
            except ValueError:
                pass
            name = item.lower().rstrip(".")
            bare = name[2:] if name.startswith("*.") else name
            if not bare or any(not label or len(label) > 63 for label in bare.split(".")):
                raise ConfigError(f"TAME_ALLOWED_DESTINATIONS: {item!r} is neither a CIDR network nor a host name")
            names.append(name)
        return cls(tuple(networks), tuple(names))

    def _name_listed(self, host: str) -> bool:
        return any(host == n or (n.startswith("*.") and host.endswith(n[1:])) for n in self.names)

    def _address_listed(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%")[0])
        if getattr(ip, "ipv4_mapped", None):
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in self.networks)

    def check(self, dest: Destination, resolver: Resolver = system_resolver) -> None:
        """Raise DestinationNotAllowed (or InvalidRequest if the name does not resolve)."""
        hint = "ask the operator to add it to TAME_ALLOWED_DESTINATIONS"
        if dest.ip is not None:
            if not self._address_listed(dest.host):
                raise DestinationNotAllowed(f"probes to {dest.host} are not allowed on this service; {hint}")
            return
        if self._name_listed(dest.host):
            return
        addresses = resolver(dest.host)
        if not addresses:
            raise InvalidRequest(f"dest host {dest.host!r} does not resolve to any address")
        outside = [a for a in addresses if not self._address_listed(a)]
        if outside:
            raise DestinationNotAllowed(
                f"probes to {dest.host} are not allowed on this service: it resolves to "
                f"{', '.join(outside)}, outside the allowed networks; {hint}"
            )

    def describe(self) -> Iterable[str]:
        return [str(n) for n in self.networks] + list(self.names)
