import pytest

from probes.destination import DEFAULT_IPERF_PORT, Destination, parse_destination


@pytest.mark.parametrize(
    "text, host, port",
    [
        ("127.0.0.1", "127.0.0.1", DEFAULT_IPERF_PORT),
        ("127.0.0.1:5202", "127.0.0.1", 5202),
        ("iperf.example.net:1", "iperf.example.net", 1),
        ("host-1.example.net.", "host-1.example.net.", DEFAULT_IPERF_PORT),
        ("localhost:65535", "localhost", 65535),
        ("[::1]", "::1", DEFAULT_IPERF_PORT),
        ("[2001:db8::7]:5300", "2001:db8::7", 5300),
        ("  10.0.0.2:80 ", "10.0.0.2", 80),
    ],
)
def test_valid_destinations_parse(text, host, port):
    assert parse_destination(text) == Destination(host, port)


@pytest.mark.parametrize(
    "text, hint",
    [
        ("", "empty"),
        ("127.0.0.1:0", "1 to 65535"),
        ("127.0.0.1:65536", "1 to 65535"),
        ("127.0.0.1:http", "must be a number"),
        ("127.0.0.1:", "must be a number"),
        (":5201", "host is missing"),
        ("bad_host", "not a valid host name"),
        ("-lead.example", "not a valid host name"),
        ("a" * 64 + ".example", "not a valid host name"),
        ("300.1.1.1", "not a valid IPv4"),
        ("::1", "brackets"),
        ("[::1", "missing ']'"),
        ("[::1]5201", "':PORT'"),
        ("[not-v6]:5201", "not an IPv6"),
        # A URL is not a destination: say so, not "put an IPv6 address in brackets".
        ("http://127.0.0.1:5201/", "looks like a URL"),
        ("127.0.0.1/32", "looks like a URL or a path"),
        # Numeric forms the C library reads as 127.0.0.1 would be a second key for one host.
        ("0x7f000001", "read it as 127.0.0.1"),
        ("0x7f.1", "read it as 127.0.0.1"),
        ("127.1", "read it as 127.0.0.1"),
        ("0177.0.0.1:5201", "read it as 127.0.0.1"),
        ("x.0x1", "not a valid IPv4"),
        # A line break is not the end of a label; ports are ASCII digits only.
        ("x\n.lab.test", "not a valid host name"),
        ("127.0.0.1:\uff15\uff12\uff10\uff11", "must be a number"),
        ("127.0.0.1:\u00b2", "must be a number"),
        # A zone belongs on a link-local address and names an interface of this host.
        ("[::ffff:7f00:1%anything]", "only on a link-local"),
        ("[fe80::1%no such]", "not a network interface"),
        ("[fe80::1%a\nb]", "not a network interface"),
    ],
)
def test_invalid_destinations_say_what_to_fix(text, hint):
    with pytest.raises(ValueError, match=hint.replace("[", r"\[").replace("]", r"\]")):
        parse_destination(text)


def test_a_zone_naming_an_interface_is_kept():
    assert parse_destination("[fe80::1%lo]:5201") == Destination("fe80::1%lo", 5201)


def test_str_round_trips_and_brackets_ipv6():
    assert str(Destination("2001:db8::7", 5300)) == "[2001:db8::7]:5300"
    for text in ("127.0.0.1:5202", "[::1]:5201", "iperf.example.net:9"):
        assert str(parse_destination(text)) == text
