"""The operator's list of destinations a probe may target, so the service cannot flood third parties."""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from advisor.destinations import Destination
from advisor.errors import ConfigError, DestinationNotAllowed, InvalidRequest, LookupsBusy, LookupTimedOut
from probes import destination as probe_destination

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], Sequence[str]]

DEFAULT_ALLOWED = "127.0.0.0/8,::1/128,localhost"


# How long one name may take to resolve once its lookup has started, seconds, and how many lookups run at once: a
# name under a zone whose servers answer slowly (or never) would otherwise hold a request's thread for as long as the
# C library retries, and enough such requests every thread of the server. A lookup waits for a slot at most as long
# again. A lookup past its time goes on in a daemon thread of its own, holding its slot until it ends, and is not
# waited for (nor at exit).
RESOLVE_TIMEOUT_S = 5.0
LOOKUP_SLOTS = 8
_lookup_slots = threading.BoundedSemaphore(LOOKUP_SLOTS)


# Whose check refuses, in its messages: the service's own, or a tame agent's on the agent's host (its own
# TAME_ALLOWED_DESTINATIONS and its own lookups, whatever the service allows).
SERVICE = "this service"
AGENT = "this agent"


def system_resolver(host: str, looker: str = SERVICE) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA), within RESOLVE_TIMEOUT_S of its lookup's start
    (LookupTimedOut otherwise; LookupsBusy when the lookup could not start within as long, the message naming the
    process whose lookups were busy as ``looker``; InvalidRequest for a name that does not resolve)."""
    not_looked_up = f"dest host {host!r} was not looked up"
    retry = "try again later, or give its address"
    if not _lookup_slots.acquire(timeout=RESOLVE_TIMEOUT_S):
        raise LookupsBusy(f"{not_looked_up}: {looker}'s {LOOKUP_SLOTS} name lookups were all busy for "
                          f"{RESOLVE_TIMEOUT_S:g} s: {retry}", retry_after_s=RESOLVE_TIMEOUT_S)
    # From here: a name that waited for its slot has its whole time to resolve, so "did not resolve within" is true
    # (and the name remembered as slow, advisor.slownames, is one that was slow).
    deadline = time.monotonic() + RESOLVE_TIMEOUT_S
    answer: dict[str, object] = {}
    ended = threading.Event()

    def lookup() -> None:
        try:
            answer["infos"] = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError) as exc:
            answer["error"] = exc
        finally:
            _lookup_slots.release()
            ended.set()

    try:
        threading.Thread(target=lookup, name="tame-resolve", daemon=True).start()
    except RuntimeError:  # "can't start new thread": the process is at its thread limit
        _lookup_slots.release()
        raise LookupsBusy(f"{not_looked_up}: {looker} could not start a lookup (it runs as many threads as it "
                          f"may): {retry}", retry_after_s=RESOLVE_TIMEOUT_S) from None
    if not ended.wait(max(0.0, deadline - time.monotonic())):
        raise LookupTimedOut(f"dest host {host!r} did not resolve within {RESOLVE_TIMEOUT_S:g} s: {retry}",
                             retry_after_s=RESOLVE_TIMEOUT_S)
    if "error" in answer:
        raise InvalidRequest(f"dest host {host!r} does not resolve: {answer['error']}") from answer["error"]
    return sorted({info[4][0] for info in answer["infos"]})


def agent_resolver(host: str) -> list[str]:
    """:func:`system_resolver` in a tame agent, whose lookups are its own: its refusals say so (its messages are
    logged on the agent's host, and a site's agent sends them to the service with the job it hands back)."""
    return system_resolver(host, looker=AGENT)


_EXAMPLES = "give CIDR networks and host names, e.g. 10.0.0.0/8,dtn1.example.org,*.example.org"


def _parse_entry(item: str) -> Network | str:
    """One allow-list entry: a CIDR network (a bare address is its /32 or /128), or a host name, ``*.``
    before a name allowing its sub-domains. ConfigError names the entry and says what is wrong."""
    where = f"TAME_ALLOWED_DESTINATIONS: {item!r}"
    if item in ("*", "*.*"):
        raise ConfigError(f"{where} would allow probes to every address; {_EXAMPLES} "
                          "(0.0.0.0/0 and ::/0 if every address is really meant)")
    try:
        return ipaddress.ip_network(item, strict=True)
    except ValueError as exc:
        if "/" in item and "://" not in item:
            raise ConfigError(f"{where} is not a CIDR network ({exc}); {_EXAMPLES}") from None
    name = item[2:] if item.startswith("*.") else item
    if ":" in name and "://" not in name:
        raise ConfigError(f"{where}: list hosts without a port; {_EXAMPLES}")
    try:
        probe_destination.parse_destination(name)
    except ValueError as exc:
        raise ConfigError(f"{where} is neither a CIDR network nor a host name ({exc}); {_EXAMPLES}") from None
    return item.lower().rstrip(".")


ALL_PORTS = ((1, 65535),)
_PORT_RANGE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")


def parse_ports(text: str) -> tuple[tuple[int, int], ...]:
    """TAME_ALLOWED_PORTS: ports and ranges, comma-separated (e.g. ``5201-5210,5300``); ConfigError names a bad one."""
    ranges = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        match = _PORT_RANGE.fullmatch(item)
        first = int(match.group(1)) if match else 0
        last = int(match.group(2) or first) if match else 0
        if not 1 <= first <= last <= 65535:
            raise ConfigError(f"TAME_ALLOWED_PORTS: {item!r} is not a port or a range of ports in 1-65535 (low-high); "
                              "give e.g. 5201-5210,5300")
        ranges.append((first, last))
    if not ranges:
        raise ConfigError("TAME_ALLOWED_PORTS is set but lists no port; give e.g. 5201-5210, or unset it for any port")
    return tuple(ranges)


@dataclass(frozen=True)
class AllowList:
    """CIDR networks and host names (``*.suffix`` matches sub-domains), and the ports probes may go to.

    An IP literal must be inside a listed network. A host name is allowed if it is listed
    itself, or if every address it resolves to is inside a listed network (so an unlisted
    name cannot be pointed at a third party's address). The port must be in one of ``ports`` (ranges, inclusive).
    """

    networks: tuple[Network, ...]
    names: tuple[str, ...]
    ports: tuple[tuple[int, int], ...] = ALL_PORTS

    @classmethod
    def parse(cls, text: str, ports: str | None = None) -> "AllowList":
        """The list as TAME_ALLOWED_DESTINATIONS gives it, comma-separated, and TAME_ALLOWED_PORTS (None: any port);
        ConfigError names a bad entry."""
        networks, names = [], []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            entry = _parse_entry(item)
            (networks if isinstance(entry, (ipaddress.IPv4Network, ipaddress.IPv6Network)) else names).append(entry)
        if not networks and not names:
            # An empty list would refuse every probe, silently: the operator meant something else.
            raise ConfigError("TAME_ALLOWED_DESTINATIONS is set but lists no destination; " + _EXAMPLES
                              + ", or unset it for loopback only")
        return cls(tuple(networks), tuple(names), ALL_PORTS if ports is None else parse_ports(ports))

    def _check_port(self, dest: Destination, who: str) -> None:
        if not any(low <= dest.port <= high for low, high in self.ports):
            raise DestinationNotAllowed(f"probes to port {dest.port} are not allowed on {who} (ports "
                                        f"{self._ports_text()}); ask the operator to add it to TAME_ALLOWED_PORTS")

    def _ports_text(self) -> str:
        return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in self.ports)

    def _name_listed(self, host: str) -> bool:
        return any(host == n or (n.startswith("*.") and host.endswith(n[1:])) for n in self.names)

    def _address_listed(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%")[0])
        if getattr(ip, "ipv4_mapped", None):
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in self.networks)

    def needs_lookup(self, dest: Destination) -> bool:
        """Whether :meth:`check` resolves ``dest``'s name (not an address, not a listed name)."""
        return dest.ip is None and not self._name_listed(dest.host)

    def check(self, dest: Destination, resolver: Resolver = system_resolver, who: str = SERVICE) -> None:
        """Raise DestinationNotAllowed, saying ``who`` refuses (or InvalidRequest if the name does not resolve)."""
        self._check_port(dest, who)
        if dest.ip is not None:
            self._check_addresses(dest, [dest.host], who)
            return
        if self._name_listed(dest.host):
            return
        self._check_addresses(dest, self._resolve(dest, resolver), who)

    def checked_address(self, dest: Destination, resolver: Resolver = system_resolver, who: str = SERVICE) -> str:
        """The one IP address to probe ``dest`` at: the name resolved once, checked like :meth:`check`.

        A probe must go to exactly this address (an IP literal), never to the name again: a name
        resolved a second time may answer elsewhere (DNS re-pointed between check and use). A
        listed name is allowed whatever it resolves to; otherwise every address it resolves to
        must be inside a listed network. The first address the resolver gives is chosen. A refusal says ``who``
        refuses (AGENT in a tame agent, whose list is its own).
        """
        self._check_port(dest, who)
        if dest.ip is not None:
            self._check_addresses(dest, [dest.host], who)
            return dest.ip.compressed
        addresses = self._resolve(dest, resolver)
        if not self._name_listed(dest.host):
            self._check_addresses(dest, addresses, who)
        return ipaddress.ip_address(addresses[0]).compressed

    @staticmethod
    def _resolve(dest: Destination, resolver: Resolver) -> list[str]:
        addresses = list(resolver(dest.host))
        if not addresses:
            raise InvalidRequest(f"dest host {dest.host!r} does not resolve to any address")
        return addresses

    def _check_addresses(self, dest: Destination, addresses: Sequence[str], who: str) -> None:
        hint = "ask the operator to add it to TAME_ALLOWED_DESTINATIONS"
        outside = [a for a in addresses if not self._address_listed(a)]
        if not outside:
            return
        if dest.ip is not None:
            raise DestinationNotAllowed(f"probes to {dest.host} are not allowed on {who}; {hint}")
        raise DestinationNotAllowed(
            f"probes to {dest.host} are not allowed on {who}: it resolves to "
            f"{', '.join(outside)}, outside the allowed networks; {hint}"
        )

    def describe(self) -> Iterable[str]:
        ports = [] if self.ports == ALL_PORTS else [f"ports {self._ports_text()}"]
        return [str(n) for n in self.networks] + list(self.names) + ports
