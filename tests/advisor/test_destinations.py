import pytest

from advisor.destinations import canonical_address, parse_destination
from advisor.errors import InvalidRequest


@pytest.mark.parametrize("text", ["127.0.0.1", "127.0.0.1:5201", "[::ffff:7f00:1]", "::ffff:127.0.0.1",
                                  "[::FFFF:127.0.0.1]:5201", " 127.0.0.1 "])
def test_every_spelling_of_one_address_is_one_key(text):
    assert parse_destination(text).key == "127.0.0.1:5201"


@pytest.mark.parametrize("text, key", [
    ("2001:DB8:0::7", "[2001:db8::7]:5201"),
    ("[FE80::1%lo]:5202", "[fe80::1%lo]:5202"),
    ("DTN1.Example.ORG.", "dtn1.example.org:5201"),
])
def test_keys_are_canonical(text, key):
    assert parse_destination(text).key == key


@pytest.mark.parametrize("text, hint", [
    ("http://127.0.0.1:5201/", "looks like a URL"),
    ("0x7f000001", "read it as 127.0.0.1"),
    ("[::ffff:7f00:1%anything]", "link-local"),
    ("x" * 301, "too long"),
])
def test_aliases_and_urls_are_refused_with_what_to_give(text, hint):
    with pytest.raises(InvalidRequest, match=hint):
        parse_destination(text)


@pytest.mark.parametrize("host, address", [
    ("10.0.0.5", "10.0.0.5"),
    ("::ffff:10.0.0.5", "10.0.0.5"),
    ("::FFFF:a00:5", "10.0.0.5"),
    ("0:0::1", "::1"),
    ("0000:0000:0000:0000:0000:0000:0000:0001", "::1"),
    ("2001:DB8:0:0::7", "2001:db8::7"),
    ("fe80::0:1%Eth0", "fe80::1%Eth0"),
])
def test_canonical_address_spells_each_address_one_way(host, address):
    assert canonical_address(host) == address


@pytest.mark.parametrize("host", ["gateway", "", "10.0.0.5:80", "[::1]", "010.0.0.5", "0x0a000005", "10.5", " 10.0.0.5"])
def test_canonical_address_is_none_for_what_is_not_an_address(host):
    assert canonical_address(host) is None
