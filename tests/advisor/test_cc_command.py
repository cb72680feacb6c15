"""`tame cc`: the FM it sets for each form, and bad input refused with exit status 2 before anything is touched."""

from __future__ import annotations

import pytest
from numpy.testing import assert_allclose

from advisor.cli import UsageError, main
from advisor.commands.cc import setting_for
from models.tame_share import aggregate_law_for, law_for
from probes import cc, cc_map, cc_routes


def test_fractional_form_carries_the_remainder_at_fm_one_over_r_squared_for_an_unmeasured_control():
    # n* 2.5 beside a control without a measured law: two standard streams and one carrying r = 0.5 at
    # 1/sqrt(FM) of a stream (shared-loss theory), FM = 1/0.5^2 = 4.
    s = setting_for(2.5, standard_control="bbr")
    assert (s.form, s.standard_streams, s.tame_streams) == ("fractional", 2, 1)
    assert_allclose(s.fractional_multiplier, 4.0)
    # n* 0.25 < 1: no standard stream, one tame stream at 1/0.25^2 = 16.
    s = setting_for(0.25)
    assert (s.standard_streams, s.tame_streams) == (0, 1)
    assert_allclose(s.fractional_multiplier, 16.0)


def test_aggregate_form_scales_each_of_n_streams_to_fm_n_over_nstar_squared_for_an_unmeasured_control():
    # 8 streams at 1/sqrt(FM) each take 8/sqrt(FM) = n* = 2 standard streams' share: FM = (8/2)^2 = 16.
    s = setting_for(2.0, streams=8)
    assert (s.form, s.standard_streams, s.tame_streams) == ("aggregate", 0, 8)
    assert_allclose(s.fractional_multiplier, 16.0)
    assert_allclose(setting_for(1.5, streams=3).fractional_multiplier, 4.0)


@pytest.mark.parametrize("control", [None, "cubic", "reno"])
def test_aggregate_form_at_n_equal_to_n_star_opens_standard_streams_not_tame(control):
    # N = n*: each stream is to take a whole standard stream's share; tame at FM 1 is Reno, which beside
    # cubic or reno takes s1 < 1 of one, so N standard streams are the exact answer.
    s = setting_for(3.0, streams=3, rtt_s=0.066, standard_control=control)
    assert (s.form, s.fractional_multiplier, s.standard_streams, s.tame_streams) == ("standard", None, 3, 0)


@pytest.mark.parametrize("n_star, streams, rtt_s", [(1.9, 2, 0.066), (1.99, 2, 0.066), (10.0, 13, 0.18),
                                                     (2.6, 3, 0.18), (1.7, 2, 0.18)])
def test_aggregate_form_above_n_star_stays_tame_so_it_never_opens_more_than_n_star_standard_streams(
        n_star, streams, rtt_s):
    # N > n* standard streams would take N/n* of the budget's share (13 cubic streams for n* 10: 30 % over);
    # tame streams at FM 1 or more take less than a standard stream each, so the budget holds.
    s = setting_for(n_star, streams=streams, rtt_s=rtt_s, standard_control="cubic")
    assert (s.form, s.tame_streams, s.standard_streams) == ("aggregate", streams, 0)
    assert s.fractional_multiplier >= 1.0
    assert streams * aggregate_law_for("cubic").share(s.fractional_multiplier, rtt_s) <= n_star * (1 + 1e-3)


@pytest.mark.parametrize("rtt_s", [0.01, 0.04])
def test_beside_cubic_the_fm_is_the_measured_laws_for_the_share_each_form_needs(rtt_s):
    s = setting_for(2.4, rtt_s=rtt_s, standard_control="cubic")
    assert_allclose(law_for("cubic").share(s.fractional_multiplier, rtt_s), 0.4, rtol=1e-3)
    s = setting_for(2.0, streams=8, rtt_s=rtt_s, standard_control="cubic")  # the aggregate form's own law
    assert_allclose(8 * aggregate_law_for("cubic").share(s.fractional_multiplier, rtt_s), 2.0, rtol=1e-3)
    assert aggregate_law_for("cubic") is not law_for("cubic")
    # Steeper than FM^-1/2: a smaller FM gives the same share.
    assert s.fractional_multiplier < setting_for(2.0, streams=8).fractional_multiplier


@pytest.mark.parametrize("n_star, streams", [
    (float("nan"), None), (float("inf"), 4), (0.0, None), (-1.0, 2),
    (3.0, None),          # whole n*: no fractional stream to set
    (2.0, 1),             # 1 stream for n* 2 would need FM 1/4 < 1
    (2.0, 0),
])
def test_setting_for_refuses_input_that_needs_fm_below_one_or_is_not_a_number(n_star, streams):
    with pytest.raises(UsageError):
        setting_for(n_star, streams)


@pytest.mark.parametrize("argv, says", [
    (["apply", "10.0.0.2", "--tcp-equivalent", "nan"], "--tcp-equivalent 'nan' is not a number"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "abc"], "not a number"),
    # Was 'open 1000000000000000010979063629440455417404923096773118463368106829031575854049114915371633289784946888990
    # ...' (309 digits) standard streams.
    (["apply", "10.0.0.2", "--tcp-equivalent", "1e308"], "give n*, a number of streams above 0, at most 1024"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1024.5", "--streams", "2000"], "at most 1024"),
    # Were read by float(), int() and int(x, 0) as 2.5, 10, 0.04 and 16 (advisor.limits.parse_number is the one rule).
    (["apply", "10.0.0.2", "--tcp-equivalent", "\uff12.5"], "--tcp-equivalent '\uff12.5' is not a number"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1_5"], "--tcp-equivalent '1_5' is not a number"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "2.5", "--streams", "\uff11\uff10"],
     "--streams '\uff11\uff10' is not a whole number"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "2.5", "--streams", "1_0"], "--streams '1_0' is not a whole number"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--rtt", "\u0660.04"], "not a number of seconds"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--mark", "\uff11\uff16"], "give a firewall mark"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--mark", "1_6"], "give a firewall mark"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "2", "--streams", "1"], "FM >= 1"),
    (["apply", "host.example", "--tcp-equivalent", "1.5"], "not an IPv4 or IPv6 address"),
    (["apply", "10.0.0.0/24", "--tcp-equivalent", "1.5"], "not an IPv4 or IPv6 address"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--rtt", "nan"], "--rtt 'nan' is not a number of seconds"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--rtt", "0"], "RTT must be"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--rtt", "40ms"], "not a number of seconds"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--rtt", "1e9"], "RTT must be"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--standard-control", "tame"], "fractional stream's control"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--standard-control", "Cubic;rm"], "as the kernel does"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--standard-control", "c" * 5000], "as the kernel does"),
    (["clear", "not-an-address"], "not an IPv4 or IPv6 address"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--mark", "seven"], "give a firewall mark"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--mark", "-1"], "0 to 0xffffffff"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--mark", "0x100000000"], "0 to 0xffffffff"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--uid", "-1"], "a user id is 0 to 4294967294"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--uid", "4294967295"], "a user id is 0 to 4294967294"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--uid", "\uff11\uff10"], "no such user here"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--uid", "no-such-user-here"], "no such user here"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--uid", "a\x00b"], "no such user here"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--uid", "9" * 5000], "give a user name or a user id"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--from", "fd00::1"], "not of one IP version"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--vrf", "a/b"], "--vrf: vrf 'a/b': a device name is 1 to 15"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--vrf", "v" * 16], "a device name is 1 to 15 characters"),
    (["clear", "10.0.0.2", "--vrf", "a b"], "--vrf: vrf 'a b': a device name is 1 to 15 characters"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--from", "host.example"], "not an IPv4 or IPv6 address"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "1.5", "--standard-control", "bogus"],
     "--standard-control 'bogus' is neither available here"),
    (["apply", "10.0.0.2", "--tcp-equivalent", "2", "--streams", "2", "--standard-control", "cubic"],
     "no tame stream is needed: open them with cubic"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, says, capsys, monkeypatch):
    for module in (cc, cc_map, cc_routes):
        monkeypatch.setattr(module, "run", _no_system_calls)
    assert main(["cc", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tame cc: ") and says in err


@pytest.mark.parametrize("argv", [["load"], ["unload"], ["status"], ["apply", "10.0.0.2", "--tcp-equivalent", "1.5"],
                                  ["clear", "10.0.0.2"]])
def test_not_root_exits_2_saying_so(argv, capsys, monkeypatch):
    monkeypatch.setattr(cc.os, "geteuid", lambda: 1000)
    for module in (cc, cc_map, cc_routes):
        monkeypatch.setattr(module, "run", _no_system_calls)
    assert main(["cc", *argv]) == 2
    assert "needs root" in capsys.readouterr().err


def _no_system_calls(*args, **kwargs):
    raise AssertionError(f"bad input must be refused before any system command runs: {args}")


# An `ip -j rule` listing: the defaults, a user range, a rule for another destination, a mark and a source.
RULES = [{"priority": 0, "src": "all", "table": "local"},
         {"priority": 98, "not": None, "src": "all", "uid_start": 0, "uid_end": 10, "table": "103"},
         {"priority": 99, "src": "all", "dst": "10.2.0.0", "dstlen": 16, "fwmark": "0x9", "table": "102"},
         {"priority": 100, "src": "all", "fwmark": "0x7", "fwmask": "0xff", "table": "100"},
         {"priority": 101, "src": "10.1.0.0", "srclen": 16, "table": "101"},
         {"priority": 102, "src": "all", "iif": "lo", "table": "104"},  # this host's own connections: seen
         {"priority": 103, "src": "all", "uid_start": 1000, "uid_end": 1999, "table": "105"},
         {"priority": 32766, "src": "all", "table": "main"}, {"priority": 32767, "src": "all", "table": "default"}]


@pytest.mark.parametrize("mark, source, uid, named", [
    (None, None, None, [98, 100, 101, 103]),  # the kernel's defaults choose by nothing but the destination: never named
    (0x107, None, None, [98, 101, 103]),  # 0x107 & 0xff is the rule's 0x7
    (0x8, None, None, [98, 100, 101, 103]),
    (0x7, "10.1.2.3", None, [98, 103]),  # a negated rule is named whatever it matches
    (0x7, "10.3.0.1", None, [98, 101, 103]),
    (None, None, 1500, [98, 100, 101]),  # inside uidrange 1000-1999
    (None, None, 2000, [98, 100, 101, 103]),
])
def test_rules_that_choose_by_what_the_routed_connections_do_not_carry_are_named(mark, source, uid, named):
    import ipaddress

    selector = cc_routes.RouteSelector(mark, None if source is None else ipaddress.ip_address(source), uid)
    got = cc_routes.rules_choosing_otherwise(ipaddress.ip_address("10.9.0.1"), RULES, selector)
    assert [r["priority"] for r in got] == named
    # The rule for 10.2/16 by mark 0x9 applies to a destination inside it, not to 10.9.0.1.
    assert 99 in [r["priority"] for r in cc_routes.rules_choosing_otherwise(ipaddress.ip_address("10.2.0.1"), RULES,
                                                                            selector)]


@pytest.mark.parametrize("rule, named", [
    ({"priority": 10, "src": "all", "ipproto": "tcp", "table": "100"}, False),  # route get looks up as TCP: followed
    ({"priority": 10, "src": "all", "ipproto": "udp", "table": "100"}, False),  # picks no TCP connection
    ({"priority": 10, "src": "all", "iif": "eth9", "iif_detached": None, "table": "100"}, False),  # forwarded only
    ({"priority": 10, "not": None, "src": "all", "iif": "eth9", "table": "100"}, True),  # all but forwarded: ours too
    ({"priority": 10, "src": "all", "ipproto": "tcp", "dport": 5201, "table": "100"}, True),
    ({"priority": 10, "src": "all", "tos": "0x10", "table": "100"}, True),
    ({"priority": 10, "src": "all", "oif": "eth1", "table": "100"}, True),  # sockets bound to eth1
    ({"priority": 1000, "src": "all", "l3mdev": None}, True),  # sockets bound to a VRF, without --vrf
])
def test_rules_that_pick_none_of_this_hosts_tcp_connections_are_not_named(rule, named):
    import ipaddress

    got = cc_routes.rules_choosing_otherwise(ipaddress.ip_address("10.9.0.1"), [rule], cc_routes.RouteSelector())
    assert bool(got) == named
    if "l3mdev" in rule:
        assert cc_routes.rules_choosing_otherwise(ipaddress.ip_address("10.9.0.1"), [rule],
                                                  cc_routes.RouteSelector(vrf="blue")) == []


@pytest.mark.parametrize("answer, named", [
    ('Error: argument "tcp" is wrong: invalid ipproto', True),  # an iproute2 that does not know the selector
    ("Error: Unknown attribute", True),
    ("RTNETLINK answers: Network is unreachable", False),  # the kernel: an unreachable rule or route
    ("RTNETLINK answers: Permission denied", False),  # a prohibit one
    ("RTNETLINK answers: Invalid argument", False),  # a blackhole one
])
def test_a_rule_whose_route_lookup_fails_is_named_unless_the_kernel_says_it_reaches_no_route(monkeypatch, answer,
                                                                                           named):
    # The kernel's answers above were read from `ip route get 10.9.0.7 ipproto tcp fibmatch` beside each kind of rule
    # and route, in a namespace of this machine. A lookup that fails otherwise leaves where the rule's connections go
    # unknown, and apply must not say they get the control.
    import ipaddress

    from probes.netns import TestbedCommandFailed

    def ip(argv, *args, **kwargs):
        assert "route" in argv and "get" in argv, argv  # no other command may run here
        raise TestbedCommandFailed(f"{' '.join(argv)}: exit 2: {answer}")

    monkeypatch.setattr(cc_routes, "run", ip)
    rule = {"priority": 10, "src": "all", "ipproto": "tcp", "dport": 5201, "table": "100"}
    got = cc_routes.rules_routing_elsewhere(ipaddress.ip_address("10.9.0.1"), [rule], cc_routes.RouteSelector())
    assert [(r.rule["priority"], r.route) for r in got] == ([(10, None)] if named else [])
