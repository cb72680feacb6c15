"""Settings read from the environment (advisor/settings.py): the operator's ceiling on every site's budget, the
store's connection pool."""

import pytest

from advisor.commands.runtime import open_store
from advisor.db import DEFAULT_POOL_SIZE
from advisor.errors import ConfigError
from advisor.limits import MAX_SITE_PROBE_SECONDS_PER_HOUR, MAX_SITE_PROBES, MAX_SITE_STREAMS
from advisor.settings import Settings
from advisor.sites import SiteBudget


def test_the_site_ceiling_defaults_to_the_hard_caps_and_is_read_from_the_environment():
    assert Settings.from_env({}).site_ceiling == SiteBudget(MAX_SITE_PROBES, MAX_SITE_STREAMS,
                                                            MAX_SITE_PROBE_SECONDS_PER_HOUR)
    assert Settings.from_env({"TAME_MAX_SITE_PROBES": "4", "TAME_MAX_SITE_STREAMS": "64",
                              "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR": "3600"}).site_ceiling == SiteBudget(4, 64, 3600.0)
    # Each may be set alone; an empty value is unset, as for the other variables.
    assert Settings.from_env({"TAME_MAX_SITE_STREAMS": "10", "TAME_MAX_SITE_PROBES": ""}).site_ceiling == SiteBudget(
        MAX_SITE_PROBES, 10, MAX_SITE_PROBE_SECONDS_PER_HOUR)


@pytest.mark.parametrize("env, says", [
    ({"TAME_MAX_SITE_PROBES": "0"}, "TAME_MAX_SITE_PROBES='0' must be between 1 and 64"),
    ({"TAME_MAX_SITE_PROBES": "65"}, "TAME_MAX_SITE_PROBES='65' must be between 1 and 64"),
    ({"TAME_MAX_SITE_PROBES": "2.5"}, "TAME_MAX_SITE_PROBES='2.5' is not a whole number"),
    ({"TAME_MAX_SITE_STREAMS": "4097"}, "TAME_MAX_SITE_STREAMS='4097' must be between 1 and 4096"),
    ({"TAME_MAX_SITE_STREAMS": "lots"}, "TAME_MAX_SITE_STREAMS='lots' is not a whole number"),
    ({"TAME_MAX_SITE_STREAMS": "-1"}, "TAME_MAX_SITE_STREAMS='-1' must be between"),
    ({"TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR": "230401"}, "must be between 1 and 230400"),
    ({"TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR": "1h"}, "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR='1h' is not a number"),
    ({"TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR": "nan"}, "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR='nan' is not a number"),
    ({"TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR": "inf"}, "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR='inf' is not a number"),
    # Below what one probe of the plan takes, every registration would be refused: start-up is, instead.
    ({"TAME_MAX_SITE_STREAMS": "9"}, "TAME_MAX_SITE_STREAMS='9' is below the probe plan's 10 streams "
                                     "(TAME_PROBE_LEVELS): no site's probe would fit"),
    ({"TAME_MAX_SITE_STREAMS": "9", "TAME_PROBE_LEVELS": "1,20"}, "below the probe plan's 20 streams"),
    ({"TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR": "100"}, "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR='100' is below one "
                                                      "probe plan's longest time"),
])
def test_a_bad_site_ceiling_is_refused_naming_the_variable(env, says):
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(env)
    assert says in str(refused.value)


def test_a_ceiling_is_taken_down_to_what_one_probe_of_the_plan_takes():
    # Levels 1 and 10 need 10 streams; a plan of 1 and 4 needs 4.
    assert Settings.from_env({"TAME_MAX_SITE_STREAMS": "10"}).site_ceiling.max_streams == 10
    assert Settings.from_env({"TAME_MAX_SITE_STREAMS": "4", "TAME_PROBE_LEVELS": "1,4"}).site_ceiling.max_streams == 4
    # The default plan's longest time (probes.plan.ProbePlan.worst_case_s): each probe of 30 s may be re-run at 60 s,
    # each run 5 s of warm-up and 20 s of slack, so 55 + 85 = 140 s; each probe twice (one idle retry); three probes
    # (levels 1 and 10, and model auto's adaptive one); plus 20 s for the idle RTT: 20 + 3 * 2 * 140 = 860 s.
    # Model lu adds no adaptive probe: 20 + 2 * 2 * 140 = 580 s.
    seconds = "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR"
    assert Settings.from_env({seconds: "860"}).site_ceiling.probe_seconds_per_hour == 860.0
    with pytest.raises(ConfigError, match="longest time, 860 s .*give at least 860"):
        Settings.from_env({seconds: "859.5"})
    assert Settings.from_env({seconds: "580", "TAME_MODEL": "lu"}).site_ceiling.probe_seconds_per_hour == 580.0


def test_the_large_body_turns_are_validated_settings():
    assert (Settings.from_env({}).max_large_bodies, Settings.from_env({}).large_body_wait_s) == (4, 5.0)
    got = Settings.from_env({"TAME_MAX_LARGE_BODIES": "2", "TAME_LARGE_BODY_WAIT_S": "0"})
    assert (got.max_large_bodies, got.large_body_wait_s) == (2, 0.0)
    for name, bad in (("TAME_MAX_LARGE_BODIES", "0"), ("TAME_MAX_LARGE_BODIES", "x"), ("TAME_LARGE_BODY_WAIT_S", "-1")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: bad})


def test_the_store_holds_at_most_tame_db_pool_size_connections(tmp_path):
    assert Settings.from_env({}).db_pool_size == DEFAULT_POOL_SIZE == 10
    store = open_store(Settings.from_env({"TAME_DB_POOL_SIZE": "3",
                                          "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/s.sqlite3"}))
    try:
        assert store.db.pool_size == 3
    finally:
        store.close()
    for text, says in [("0", "must be between 1 and 1000"), ("1001", "must be between 1 and 1000"),
                       ("2.5", "is not a whole number")]:
        with pytest.raises(ConfigError, match=f"TAME_DB_POOL_SIZE='{text}' {says}"):
            Settings.from_env({"TAME_DB_POOL_SIZE": text})


def test_tame_probe_omit_s_sets_the_probes_warm_up_within_0_to_60_s():
    assert Settings.from_env({}).omit_s == 5.0
    assert Settings.from_env({"TAME_PROBE_OMIT_S": "0"}).omit_s == 0.0
    assert Settings.from_env({"TAME_PROBE_OMIT_S": "2.5"}).omit_s == 2.5
    for text in ("-1", "61", "1e9"):
        with pytest.raises(ConfigError, match=f"TAME_PROBE_OMIT_S='{text}' must be between 0 and 60"):
            Settings.from_env({"TAME_PROBE_OMIT_S": text})


def test_tame_probe_reuse_max_age_s_is_two_ttls_unless_set_and_0_never_re_uses():
    assert Settings.from_env({}).reuse_adaptive_within_s == 7200.0
    assert Settings.from_env({"TAME_TTL_S": "600"}).reuse_adaptive_within_s == 1200.0
    assert Settings.from_env({"TAME_PROBE_REUSE_MAX_AGE_S": "0"}).reuse_adaptive_within_s == 0.0
    assert Settings.from_env({"TAME_PROBE_REUSE_MAX_AGE_S": "90"}).reuse_adaptive_within_s == 90.0
    assert Settings().reuse_adaptive_within_s == 7200.0
    for text in ("-1", "1e12"):
        with pytest.raises(ConfigError, match=f"^TAME_PROBE_REUSE_MAX_AGE_S='{text}' must be between 0 and"):
            Settings.from_env({"TAME_PROBE_REUSE_MAX_AGE_S": text})


@pytest.mark.parametrize("name", ["TAME_TTL_S", "TAME_MAX_BATCH", "TAME_DB_POOL_SIZE", "TAME_PROBE_OMIT_S",
                                  "TAME_MAX_SITES", "TAME_PROBE_REUSE_MAX_AGE_S"])
@pytest.mark.parametrize("text", ["\uff15", "1_000", "\u0663", "inf", "nan"])
def test_a_number_setting_takes_ascii_digits_only(name, text):
    # Were read as numbers by int() and float(): '５' as 5, '1_000' as 1000, Arabic-Indic '٣' as 3.
    with pytest.raises(ConfigError, match=f"^{name}=.* is not a (whole )?number"):
        Settings.from_env({name: text})


@pytest.mark.parametrize("text", ["1,\uff11\uff10", "1,1_0"])
def test_probe_levels_take_ascii_digits_only(text):
    with pytest.raises(ConfigError, match="^TAME_PROBE_LEVELS="):
        Settings.from_env({"TAME_PROBE_LEVELS": text})


def test_parse_number_is_the_one_rule_for_typed_numbers():
    from advisor.limits import parse_number

    assert parse_number(" 10 ", int) == 10 and parse_number("-2", int) == -2
    assert parse_number("1.5e3") == 1500.0 and parse_number(".5") == 0.5 and parse_number("5.") == 5.0
    for text, kind in [("\uff15", int), ("1_000", int), ("1.0", int), ("\uff15", float), ("1_0.5", float),
                       ("inf", float), ("nan", float), ("", float), ("1e", float), ("9" * 5000, int)]:
        with pytest.raises(ValueError):
            parse_number(text, kind)


def test_tame_max_sites_is_a_whole_number_from_1_to_a_million():
    assert Settings.from_env({}).max_sites == 1000
    assert Settings.from_env({"TAME_MAX_SITES": "5"}).max_sites == 5
    for text in ("0", "-1", "1000001"):
        with pytest.raises(ConfigError, match=f"TAME_MAX_SITES='{text}' must be between 1 and 1e\\+06"):
            Settings.from_env({"TAME_MAX_SITES": text})
    with pytest.raises(ConfigError, match="TAME_MAX_SITES='2.5' is not a whole number"):
        Settings.from_env({"TAME_MAX_SITES": "2.5"})
