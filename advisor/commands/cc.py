"""`tame cc load|unload|status|apply|clear`: the tame congestion control and its per-destination settings (root)."""

from __future__ import annotations

import argparse
import json
import math
import pwd
import re
import sys
from dataclasses import dataclass

from advisor.cli import UsageError
from advisor.errors import InvalidRequest
from advisor.limits import MAX_STREAMS, check_congestion_control, check_rtt_s, parse_number
from advisor.tame import MIN_FRACTION, calibration_warnings, fractional_multiplier_for
from models.tame_share import LAWS, aggregate_law_for
from probes import cc, cc_map, cc_routes
from probes.controls import available_controls, host_default_control
from probes.errors import CcBusy, CcError, CcMapFull, CcNotAVrf, CcNotLoaded, CcNotRoot, CcOutdated, CcRouteConflict


@dataclass(frozen=True)
class Setting:
    """What `apply` writes for one destination: its FM (None when no stream runs tame) and the streams the
    transfer should open."""

    fractional_multiplier: float | None
    standard_streams: int
    tame_streams: int
    form: str  # "fractional", "aggregate", or "standard" (N streams of the standard control, no tame)


def setting_for(tcp_equivalent: float, streams: int | None = None, rtt_s: float | None = None,
                standard_control: str | None = None, n_star_named: str = "--tcp-equivalent") -> Setting:
    """The FM that makes the transfer take ``tcp_equivalent`` (n*) standard streams' share.

    One tame stream at FM takes share(FM) = s1(RTT) x FM^-k of a ``standard_control`` stream, the law
    measured on this kernel for each form (models.tame_share; FM^-1/2 theory for a control not measured).

    Without ``streams`` (the fractional form, as the advice opens it): floor(n*) standard streams plus
    one tame stream carrying the remainder r at the FM whose share is r (advisor.tame.fractional_multiplier_for).
    ``n_star_named`` is what the user knows n* as, for the errors (the option, or "the advice's n*").

    With ``streams`` = N (the aggregate form, for tools that open N streams of one control): each of the N
    streams runs tame at the FM whose share is n*/N (the aggregate form's law), so that together they take n*
    streams' share. Tame at FM 1 is Reno, which beside cubic takes less than a standard stream (the aggregate
    law's s1 < 1, falling with the RTT): at N = n* (within rounding), the setting is N standard streams (``form``
    "standard", no FM). Only there: N > n* standard streams would take more than n*'s share, the budget, so above
    it the tame streams stay, at FM 1 when even that falls short.
    """
    n_star = float(tcp_equivalent)
    if not math.isfinite(n_star) or not 0 < n_star <= MAX_STREAMS:
        raise UsageError(f"--tcp-equivalent {tcp_equivalent!r:.40}: give n*, a number of streams above 0, at most "
                         f"{MAX_STREAMS}")
    if streams is None:
        fm = fractional_multiplier_for(n_star, rtt_s, standard_control)
        if fm is None:
            raise UsageError(
                f"--tcp-equivalent {n_star:g} has no fractional remainder of at least {MIN_FRACTION:g}: open "
                f"{max(1, round(n_star))} standard stream(s), no tame stream is needed "
                "(or give --streams N to scale N streams)")
        return Setting(fm, standard_streams=math.floor(n_star), tame_streams=1, form="fractional")
    if streams < 1:
        raise UsageError(f"--streams {streams}: give the number of streams the transfer opens, at least 1")
    if streams < n_star - 1e-9:  # n* within rounding of a whole number is that number
        raise UsageError(
            f"--streams {streams} is fewer than {n_star_named} {n_star:g}: tame only slows streams down "
            f"(FM >= 1), so {streams} stream(s) cannot take what {n_star:g} standard streams would; "
            f"open at least {math.ceil(n_star - 1e-9)}")
    if streams <= n_star + 1e-9:
        return Setting(None, standard_streams=streams, tame_streams=0, form="standard")
    fm = round(aggregate_law_for(standard_control).multiplier_for(n_star / streams, rtt_s), 3)
    if fm > cc_map.MAX_FM:
        raise UsageError(f"--streams {streams} for --tcp-equivalent {n_star:g} needs FM {fm:g}, "
                         f"above the largest the control holds ({cc_map.MAX_FM:g})")
    return Setting(fm, standard_streams=0, tame_streams=streams, form="aggregate")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cc",
        help="load the tame congestion control and set it per destination (root)",
        description="The tame congestion control: Reno whose additive increase is 1/FM segments a round trip, "
        "FM set per destination address. Registration is kernel-wide; routes are per network namespace.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("load", help="build (first time) and register the control")
    actions.add_parser("unload", help="unregister the control; its settings go with it")
    status = actions.add_parser("status", help="whether it is registered, and every destination's FM in this network "
                                                  "namespace")
    status.add_argument("--json", action="store_true", help="print JSON")
    apply = actions.add_parser(
        "apply", help="set a destination's FM and route it through the control",
        description="Writes DEST's FM and replaces DEST/32 (/128)'s route with the same next hop plus "
        "'congctl tame', so every new connection to DEST from this namespace uses the control, "
        "whatever tool opens it.")
    apply.add_argument("dest", metavar="DEST", help="destination IPv4 or IPv6 address")
    apply.add_argument("--tcp-equivalent", required=True, metavar="NSTAR",
                       help="n*: how many standard TCP streams' share the transfer may take")
    apply.add_argument("--streams", metavar="N",
                       help="the transfer opens N streams: scale each so together they take n*'s share")
    apply.add_argument("--rtt", metavar="SECONDS",
                       help="the path's round-trip time as the advice carries it (default: the middle RTT the "
                       "control's share law was measured at); the share a tame stream takes falls with the RTT beside cubic")
    apply.add_argument("--standard-control", metavar="NAME",
                       help="the congestion control of the standard streams n* counts, the one the advice was "
                       "probed with (default: this host's, net.ipv4.tcp_congestion_control)")
    apply.add_argument("--mark", metavar="MARK",
                       help="route the connections sent with this firewall mark (e.g. 0x10), when policy rules "
                       "(ip rule) choose their route by it; the FM is one per destination, whatever the route")
    apply.add_argument("--from", dest="source", metavar="ADDRESS",
                       help="route the connections from this local address, when policy rules choose their route "
                       "by source")
    apply.add_argument("--uid", metavar="USER",
                       help="route the connections of this user (a name or a user id), when policy rules choose "
                       "their route by user (ip rule uidrange)")
    apply.add_argument("--vrf", metavar="NAME",
                       help="route the connections of sockets bound to this VRF (ip vrf exec NAME, SO_BINDTODEVICE), "
                       "in the VRF's table")
    apply.add_argument("--json", action="store_true", help="print JSON")
    clear = actions.add_parser("clear", help="remove a destination's FM and the routes apply added")
    clear.add_argument("dest", metavar="DEST", help="destination IPv4 or IPv6 address")
    clear.add_argument("--vrf", metavar="NAME",
                       help="remove only the route apply --vrf NAME added, in the VRF's table; the FM entry stays")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "load":
            return _load()
        if args.action == "unload":
            print(f"{cc.NAME} unregistered" if cc.unload() else f"{cc.NAME} was not registered")
            return 0
        if args.action == "status":
            return _status(args)
        if args.action == "apply":
            return _apply(args)
        return _clear(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    except (CcBusy, CcMapFull, CcNotAVrf, CcNotRoot, CcNotLoaded, CcOutdated, CcRouteConflict) as exc:  # exit 2
        raise UsageError(str(exc)) from exc
    except CcError as exc:
        print(f"tame cc {args.action}: {exc}", file=sys.stderr)
        return 1


def _load() -> int:
    reg, new = cc.load()
    state = "registered" if new else "already registered"
    print(f"{cc.NAME} {state} (struct_ops map id {reg.struct_ops_id}, FM map id {reg.fm_map_id})")
    return 0


def _status(args) -> int:
    cc.require_root()
    try:
        reg = cc.registration()
    except CcOutdated:
        # Its map cannot be read, but the routes to clear before unloading it can be listed.
        routes = cc_routes.our_routes()
        print("routes tame cc apply added in this network namespace:" + "".join(f"\n  {r}" for r in routes)
              if routes else "no route tame cc apply added in this network namespace")
        raise
    entries = []
    elsewhere = 0  # entries of other network namespaces (theirs to list, from there)
    here = cc_map.netns_cookie()
    if reg is not None:
        every = cc_map.all_settings()
        elsewhere = sum(1 for netns, _ in every if netns != here)
        mine = sorted(((addr, entry) for (netns, addr), entry in every.items() if netns == here),
                      key=lambda item: (item[0].version, item[0]))
        for addr, entry in mine:
            entries.append({"dest": str(addr), "fractional_multiplier": entry.fractional_multiplier,
                            "scale_slow_start": entry.scale_slow_start, "route": cc_routes.describe_route(addr)})
    if args.json:
        json.dump({"name": cc.NAME, "registered": reg is not None,
                   "struct_ops_id": reg.struct_ops_id if reg else None,
                   "fm_map_id": reg.fm_map_id if reg else None, "netns_cookie": here,
                   "destinations": entries, "other_namespaces_entries": elsewhere}, sys.stdout)
        print()
        return 0
    if reg is None:
        print(f"{cc.NAME}: not registered")
        return 0
    print(f"{cc.NAME}: registered (struct_ops map id {reg.struct_ops_id}, FM map id {reg.fm_map_id}); "
          f"destinations without an entry get FM 1 (Reno); entries of this network namespace (cookie {here}):")
    for e in entries:
        route = e["route"] or "no route here (this namespace): only sockets choosing -C tame get it"
        slow_start = ", slow start scaled" if e["scale_slow_start"] else ""
        print(f"  {e['dest']}: FM {e['fractional_multiplier']:g}{slow_start}; route: {route}")
    if not entries:
        print("  none")
    if elsewhere:
        print(f"  and {elsewhere} entr{'y' if elsewhere == 1 else 'ies'} of other network namespaces (run tame cc "
              "status there to see them)")
    return 0


def _apply(args) -> int:
    addr = cc.canonical_address(args.dest)
    try:
        n_star = parse_number(args.tcp_equivalent)
    except ValueError:
        raise UsageError(f"--tcp-equivalent {args.tcp_equivalent!r} is not a number: give n*, the standard streams' "
                         "share the transfer may take, in ASCII digits (e.g. 2.5)") from None
    streams = None
    if args.streams is not None:
        try:
            streams = parse_number(args.streams, int)
        except ValueError:
            raise UsageError(f"--streams {args.streams!r} is not a whole number: give the number of streams the "
                             "transfer opens, in ASCII digits (e.g. 8)") from None
    rtt_s = None
    if args.rtt is not None:
        try:
            rtt_s = check_rtt_s(parse_number(args.rtt))
        except ValueError:
            raise UsageError(f"--rtt {args.rtt!r} is not a number of seconds") from None
        except InvalidRequest as exc:
            raise UsageError(f"--rtt: {exc}") from None
    try:
        control = check_congestion_control(args.standard_control, "--standard-control") \
            if args.standard_control is not None else host_default_control()
    except InvalidRequest as exc:
        raise UsageError(str(exc)) from None
    if control not in available_controls() and control not in LAWS:
        raise UsageError(f"--standard-control {control!r} is neither available here (net.ipv4.tcp_available_congestion_"
                         f"control: {' '.join(available_controls())}) nor one the share law was measured beside "
                         f"({', '.join(sorted(LAWS))}): name the control the standard streams run")
    selector = _route_selector(args, addr)
    setting = setting_for(n_star, streams, rtt_s, control)
    if setting.fractional_multiplier is None:
        raise UsageError(
            f"--streams {setting.standard_streams} for --tcp-equivalent {n_star:g}: {setting.standard_streams} "
            f"standard ({control}) streams take n*'s share, no tame stream is needed: open them with {control} "
            f"(tame cc clear {addr} removes what an earlier apply set)")
    for beyond in calibration_warnings(setting.fractional_multiplier, control, rtt_s,
                                       aggregate=setting.form == "aggregate"):
        print(f"tame cc apply: warning: {beyond}", file=sys.stderr)
    cc.require_root()
    # A name that is no VRF here changes nothing; the table read is the one the route is checked against.
    table = cc_routes.vrf_table(selector.vrf) if selector.vrf is not None else None
    rules = cc_routes.policy_rules(addr)  # read before anything is changed
    with cc_map.exclusive_setting(addr):  # not under a running tame transfer, which would put its entry back after
        previous = cc_map.settings().get(addr)
        applied = False
        try:
            pruned = cc_map.set_fm(addr, cc_map.CcSetting(setting.fractional_multiplier,
                                                          scale_slow_start=cc_map.SCALE_SLOW_START_BY_DEFAULT))
            route = cc_routes.apply_route(addr, selector, table)
            applied = True
        finally:
            if not applied:  # no half-applied state, and nothing of another's undone: the entry goes back as it was
                cc_map.restore_fm(addr, previous)
    if pruned is not None:
        report_pruned(pruned, "tame cc apply")
    others = cc_routes.rules_routing_elsewhere(addr, rules, selector)
    if others:
        print(f"tame cc apply: warning: policy rules here send some connections to {addr} by another route than the "
              "one set here, without the control:" + "".join(f"\n  {_rule_advice(addr, found)}" for found in others[:5])
              + (f"\n  and {len(others) - 5} more (ip rule show)" if len(others) > 5 else ""), file=sys.stderr)
    if args.json:
        json.dump({"dest": str(addr), "fractional_multiplier": setting.fractional_multiplier, "form": setting.form,
                   "standard_streams": setting.standard_streams, "tame_streams": setting.tame_streams,
                   "congestion_control": cc.NAME, "route": route,
                   "pruned": [{"netns_cookie": netns, "dest": str(gone)} for netns, gone in sorted(
                       pruned.entries, key=lambda k: (k[0], k[1].version, k[1]))] if pruned else []}, sys.stdout)
        print()
        return 0
    if setting.form == "aggregate":
        what = (f"each of {setting.tame_streams} streams at FM {setting.fractional_multiplier:g} "
                f"(together n* {n_star:g})")
    else:
        what = (f"{setting.standard_streams} standard stream(s) plus one at FM {setting.fractional_multiplier:g}; "
                "the route gives tame to every new connection to it that does not choose "
                "its own control, so open the standard ones with one (e.g. iperf3 -C cubic)")
    print(f"{addr}: {what}\n  route: {route}")
    return 0


def report_pruned(pruned: cc_map.Pruned, command: str) -> None:
    """What a full map made ``command`` (apply, transfer) remove (cc_map.prune_gone), on stderr."""
    by_netns: dict[int, list[str]] = {}
    for netns, gone in sorted(pruned.entries, key=lambda k: (k[0], k[1].version, k[1])):
        by_netns.setdefault(netns, []).append(str(gone))
    listed = "; ".join(f"cookie {netns}: {', '.join(addrs[:5])}" + (f" and {len(addrs) - 5} more" if len(addrs) > 5
                                                                     else "") for netns, addrs in by_netns.items())
    print(f"{command}: the {cc.FM_MAP} map was full: removed {len(pruned.entries)} entr"
          f"{'y' if len(pruned.entries) == 1 else 'ies'} of network namespaces that are gone ({listed})"
          + (f" and {len(pruned.lock_files)} lock file(s) of theirs" if pruned.lock_files else ""), file=sys.stderr)
    if pruned.unread_pids:
        print(f"{command}: warning: the open files of process(es) {', '.join(map(str, pruned.unread_pids[:5]))} "
              "could not be read; a socket of theirs could have kept one of those namespaces alive", file=sys.stderr)


# A firewall mark as ip rule and iptables write it, in hex (0x10); else a decimal one (advisor.limits.parse_number).
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")


def _route_selector(args, addr) -> cc_routes.RouteSelector:
    """The --mark, --from, --uid and --vrf of ``apply``, checked (the VRF's name only: cc_routes.vrf_table finds it)."""
    mark = None
    if args.mark is not None:
        text = args.mark.strip()
        try:
            mark = int(text, 16) if _HEX.fullmatch(text) else parse_number(text, int)
        except ValueError:
            raise UsageError(f"--mark {args.mark!r}: give a firewall mark, a number such as 16 or 0x10") from None
    source = cc.canonical_address(args.source) if args.source is not None else None
    try:
        selector = cc_routes.RouteSelector(mark, source, None if args.uid is None else _user_id(args.uid), args.vrf)
        selector.route_get(addr)
    except ValueError as exc:
        raise UsageError(f"--mark/--from/--uid/--vrf: {exc}") from None
    return selector


def _user_id(text: str) -> int:
    """--uid: a user id in ASCII digits, or a user's name as the password database knows it."""
    try:
        return parse_number(text, int)
    except ValueError:
        pass
    try:
        return pwd.getpwnam(text.strip()).pw_uid
    except (KeyError, ValueError):  # ValueError: a name with a NUL in it
        raise UsageError(f"--uid {text!r:.80}: no such user here; give a user name or a user id such as 1000") \
            from None


def _rule_text(rule: dict) -> str:
    """A policy rule (``ip -j rule`` form) as ``ip rule`` prints it, near enough to find it there."""
    words = [f"{rule.get('priority')}:"] + (["not"] if "not" in rule else [])
    for key, value in rule.items():
        if key not in ("priority", "not", "srclen", "dstlen", "fwmask", "uid_end", "sport_end", "dport_end",
                       "iif_detached", "oif_detached"):
            shown = {"src": "from", "dst": "to", "table": "lookup", "uid_start": "uidrange", "sport_start": "sport",
                     "dport_start": "dport"}.get(key, key)
            if key in ("src", "dst") and f"{key}len" in rule:
                value = f"{value}/{rule[key + 'len']}"
            elif key in ("uid_start", "sport_start", "dport_start"):
                value = f"{value}-{rule.get(key.replace('start', 'end'))}"
            elif key == "fwmark" and "fwmask" in rule:
                value = f"{value}/{rule['fwmask']}"
            words += [shown] + ([] if value is None else [str(value)])
    return " ".join(words)


# What apply routes by, for the connections a policy rule picks out: the rule's keys (ip -j rule form) and the option.
_APPLY_OPTIONS = {"fwmark": "--mark", "uid_start": "--uid", "src": "--from", "l3mdev": "--vrf"}


def _rule_advice(addr, found: cc_routes.RuleRoute) -> str:
    """A policy rule that sends connections to ``addr`` elsewhere (cc_routes.rules_routing_elsewhere): where, and what
    to do for them."""
    rule, route = found.rule, found.route
    table = route.get("table", "main") if route else rule.get("table", "?")
    where = (f"they take table {table}'s route ({route.get('dst')} dev {route.get('dev', '?')})" if route
             else "they can take another table's route")
    chosen_by = cc_routes.rule_selectors(rule) - {"fwmask", "uid_end", "srclen"}
    if "not" not in rule and chosen_by <= set(_APPLY_OPTIONS):
        values = {"fwmark": rule.get("fwmark"), "uid_start": rule.get("uid_start"),
                  "src": f"ADDRESS (one of this host's in {rule.get('src')}/{rule.get('srclen')})",
                  "l3mdev": "NAME (the VRF their sockets are bound to)"}
        todo = "apply again with " + " ".join(f"{_APPLY_OPTIONS[key]} {values[key]}" for key in sorted(chosen_by))
    else:
        by = ", ".join(sorted(chosen_by - set(_APPLY_OPTIONS)) or ["a negated rule"])
        todo = f"tame cc apply does not route by {by}: " + (
            f"give them the control with '{' '.join(found.argv)}' (tame cc clear {addr} removes it)" if found.argv
            else f"add 'congctl {cc.NAME}' to a route for {addr} in table {table} yourself")
    return f"{_rule_text(rule)}: {where}; {todo}"


def _clear(args) -> int:
    addr = cc.canonical_address(args.dest)
    cc.require_root()
    if args.vrf is not None:
        try:
            cc_routes.RouteSelector(vrf=args.vrf)
        except ValueError as exc:
            raise UsageError(f"--vrf: {exc}") from None
        table = cc_routes.vrf_table(args.vrf)
        removed = cc_routes.clear_route(addr, table)
        print(f"{addr}: {'route removed' if removed else 'no route to remove'} in VRF {args.vrf}'s table {table}; the "
              f"FM entry stays for the other routes (tame cc clear {addr} removes them all and it)")
        return 0
    removed_route = cc_routes.clear_route(addr)
    try:
        removed_entry = cc.registration() is not None and cc_map.delete_fm(addr)
    except CcOutdated:  # an older build's map cannot be read: its entries go with it at tame cc unload
        print(f"{addr}: {'route removed' if removed_route else 'no route to remove'}; the registered {cc.NAME} is an "
              "older build, whose FM entries go when it is unloaded: once its routes are cleared, run tame cc "
              "unload, then tame cc load")
        return 0
    if not (removed_route or removed_entry):
        print(f"{addr}: nothing to clear")
    else:
        routes = f"{removed_route} routes" if removed_route > 1 else "route" if removed_route else "no route"
        parts = (routes, "FM entry" if removed_entry else "no FM entry")
        print(f"{addr}: cleared ({', '.join(parts)})")
    return 0
