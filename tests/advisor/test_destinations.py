import pytest

from advisor.destinations import parse_destination
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
