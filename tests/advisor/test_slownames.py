"""advisor.slownames.SlowNames: slow names kept per site, bounded in names and so in sites."""

import pytest

from advisor.slownames import SlowNames


def test_a_site_s_names_are_ranked_oldest_timeout_first_and_a_timeout_again_makes_a_name_the_newest():
    slow = SlowNames(10)
    for host in ("a", "b", "c"):
        slow.timed_out("s1", host)
    slow.timed_out("s1", "a")
    assert slow.ages("s1") == {"b": 0, "c": 1, "a": 2}
    assert slow.ages("s2") == {}


def test_when_full_the_site_holding_the_most_forgets_its_oldest():
    slow = SlowNames(4)
    slow.timed_out("quiet", "q1")
    for i in range(10):
        slow.timed_out("noisy", f"n{i}")
    # 4 in all: the noisy site was the fullest each time, so it lost its oldest; the quiet one kept its name.
    assert len(slow) == 4
    assert slow.ages("quiet") == {"q1": 0}
    assert list(slow.ages("noisy")) == ["n7", "n8", "n9"]


def test_on_a_tie_a_site_other_than_the_registering_one_forgets_so_a_new_timeout_is_kept():
    slow = SlowNames(4)
    for site in ("s1", "s2"):
        slow.timed_out(site, "x")
        slow.timed_out(site, "y")
    slow.timed_out("s3", "z")  # 2, 2 and 1: s1, held longest of the two fullest, forgets its oldest
    assert slow.ages("s1") == {"y": 0} and list(slow.ages("s2")) == ["x", "y"] and slow.ages("s3") == {"z": 0}
    slow.timed_out("s1", "z")  # 2, 2 and 1 again, s1 registering: s2 forgets
    assert list(slow.ages("s1")) == ["y", "z"] and slow.ages("s2") == {"y": 0} and slow.ages("s3") == {"z": 0}


def test_a_site_with_no_slow_name_left_is_not_held():
    slow = SlowNames(4)
    for i in range(100):
        slow.timed_out(f"site{i}", "slow.example")
    # Each site had one name: the sites held longest were dropped as the memory filled, so no more sites than names.
    assert len(slow) == 4 and slow.sites() == 4
    assert all(slow.ages(f"site{i}") == {"slow.example": 0} for i in range(96, 100))
    for i in range(96, 100):
        slow.looked_up(f"site{i}", "slow.example")
    assert len(slow) == 0 and slow.sites() == 0
    slow.looked_up("never-seen", "slow.example")  # nothing to forget
    assert slow.sites() == 0


def test_kept_must_be_positive():
    with pytest.raises(ValueError, match="kept must be at least 1"):
        SlowNames(0)
