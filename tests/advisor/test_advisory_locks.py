"""The PostgreSQL advisory lock keys: each use has its own, and every key is named in advisor/locks.py."""

import re
from pathlib import Path

import advisor
from advisor import locks


def test_every_advisory_lock_key_is_its_own():
    keys = {name: value for name, value in vars(locks).items() if name.endswith("_LOCK")}
    assert len(keys) >= 5
    assert len(set(keys.values())) == len(keys), f"two uses share a key: {keys}"


def test_no_module_takes_an_advisory_lock_by_a_literal_key():
    # A literal key beside the named ones could meet one of them by chance; names in advisor/locks.py cannot.
    literal = re.compile(r"pg_(try_)?advisory_(xact_)?lock(_shared)?\(\s*\d")
    found = [f"{path.name}: {line.strip()}" for path in Path(advisor.__file__).parent.rglob("*.py")
             for line in path.read_text().splitlines() if literal.search(line)]
    assert found == []
