"""The routes that give connections the tame congestion control, and the policy rules that decide which route a
connection takes.

Routes are per network namespace: ``apply`` adds ``DEST/32`` (``/128``) with ``congctl tame`` and protocol
:data:`ROUTE_PROTO` in the namespace it runs in, and ``clear`` removes only a route carrying that protocol. Nothing
here sets ``net.ipv4.tcp_congestion_control``: a BPF control as a namespace's default leaks its map when the
namespace goes.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass

from probes.cc import NAME, Address, require_root
from probes.errors import CcCommandFailed, CcNotAVrf, CcRouteConflict
from probes.netns import TestbedCommandFailed, run

ROUTE_PROTO = "250"
"""Routing protocol number marking the routes ``apply`` adds, so ``clear`` never removes anyone else's."""


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


# What the kernel answers `ip route get` when the connections it asks about reach no route: an unreachable rule or
# route ("Network is unreachable", "No route to host"), a prohibit one ("Permission denied"), a blackhole one ("Invalid
# argument"). Any other failure (iproute2 refusing a selector it does not know, a kernel's extended error) says nothing
# of where the connections go.
_NO_ROUTE_ANSWERS = tuple(f"RTNETLINK answers: {text}" for text in
                          ("Network is unreachable", "No route to host", "Permission denied", "Invalid argument"))


def reaches_no_route(exc: CcRouteConflict) -> bool:
    """Whether :func:`picked_route`'s ``exc`` says the connections reach no route (rather than the lookup failing)."""
    cause = exc.__cause__
    return not isinstance(cause, TestbedCommandFailed) or any(text in str(cause) for text in _NO_ROUTE_ANSWERS)


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


def apply_route(addr: Address, selector: RouteSelector = RouteSelector(), table: str | None = None) -> str:
    """Route ``addr`` as the kernel routes it now for a TCP connection carrying ``selector`` (policy rules, a VRF's
    table, next hops, MTU and other metrics), plus ``congctl tame``, in this namespace; returns the routes for exactly
    ``addr`` as ``ip`` prints them. ``table``: the VRF's table as the caller read it (:func:`vrf_table`), so that
    one command checks and acts on one reading; read here when not given."""
    require_root()
    if selector.vrf is not None and table is None:
        table = vrf_table(selector.vrf)
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
        except CcRouteConflict as exc:
            if reaches_no_route(exc):
                continue  # a blackhole, unreachable or prohibit rule or route: no route to give the control
            found.append(RuleRoute(rule))  # `ip route get` could not tell (an iproute2 without the selector): unknown
            continue
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
