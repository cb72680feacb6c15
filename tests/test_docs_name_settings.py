"""The docs name settings that exist: every TAME_ variable README.md and docs/ name is one Settings.from_env
(advisor/settings.py) reads, or, for the few that are not the service's settings, one the file named for it reads;
the sentences on a claim's lease name exactly the settings the lease is worked out from, with its default; and the
retention settings' table gives the defaults and ranges Settings.from_env has."""

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.errors import ConfigError
from advisor.plan_runner import LEASE_SETTINGS, plan_for
from advisor.settings import Settings
from advisor.sites import LEASE_SLACK_S

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VARIABLE = re.compile(r"\bTAME_[A-Z0-9_]*[A-Z0-9]\b")
# Variables the docs name that are not settings of the service, and a file that reads each.
NOT_SETTINGS = {
    "TAME_URL": "advisor/commands/paths.py",  # the CLI's: which service to ask
    "TAME_PG_PASSWORD": "docker-compose.yml",  # PostgreSQL's password, in the compose files
    "TAME_SITE_A_TOKEN": "docker-compose.multisite.yml",
    "TAME_SITE_B_TOKEN": "docker-compose.multisite.yml",
}


class ReadVariables(Mapping):
    """An empty environment that notes every variable asked of it."""

    def __init__(self):
        self.read = set()

    def __getitem__(self, name):
        self.read.add(name)
        raise KeyError(name)

    def __contains__(self, name):
        self.read.add(name)
        return False

    def get(self, name, default=None):
        self.read.add(name)
        return default

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0


def documented_variables() -> dict[str, list[str]]:
    """Each TAME_ variable the docs name -> the files naming it."""
    named: dict[str, list[str]] = {}
    for path in DOCS:
        for name in sorted(set(VARIABLE.findall(path.read_text()))):
            named.setdefault(name, []).append(path.name)
    return named


def test_every_variable_the_docs_name_is_one_the_code_reads():
    # docs/advice-service.md said a job fails after TAME_MAX_PROBE_ATTEMPTS attempts: nothing reads that variable
    # (the number is Settings.max_probe_attempts, 3, which no variable sets).
    env = ReadVariables()
    Settings.from_env(env)
    named = documented_variables()
    assert "TAME_PROBE_OMIT_S" in named and "TAME_PROBE_OMIT_S" in env.read
    unread = {name: files for name, files in named.items() if not read(name, env.read)}
    assert not unread, f"named in the docs, read by no code: {unread}"


def read(name: str, settings_read: set[str]) -> bool:
    """Whether ``name`` is read: by Settings.from_env (``settings_read``), or for one of NOT_SETTINGS by its file."""
    if name not in NOT_SETTINGS:
        return name in settings_read
    text = (ROOT / NOT_SETTINGS[name]).read_text()
    return f'"{name}"' in text or "${" + name in text


def lease_sentences() -> str:
    """docs/advice-service.md from "A claim is a lease" to where it says what happens when an agent dies."""
    text = (ROOT / "docs" / "advice-service.md").read_text()
    start = text.index("A claim is a lease")
    return text[start:re.compile(r"an\s+agent\s+that\s+dies", re.IGNORECASE).search(text, start).start()]


def lease_s(settings: Settings) -> float:
    """The lease of a claim of a job queued with ``settings``' default plan, as advisor.sites.claim_job gives it."""
    return plan_for(settings, settings.default_levels, settings.default_duration_s).worst_case_s + LEASE_SLACK_S


def test_the_lease_sentences_name_exactly_the_settings_the_lease_depends_on_and_its_default():
    # They named TAME_MODEL, TAME_PROBE_DURATION_S and TAME_PROBE_MAX_DURATION_S as what an agent's plan must match,
    # not TAME_PROBE_OMIT_S, which the lease counts once a run.
    text = lease_sentences()
    named = set(VARIABLE.findall(text))
    assert named == {"TAME_PROBE_LEVELS", "TAME_PROBE_DURATION_S", *LEASE_SETTINGS.values()}, named
    # Each changes the lease (the job's levels and duration_s come from the first two when a request gives none).
    default = Settings()
    assert lease_s(default) == 875.0 and "875 s" in text
    for changed in (dict(default_levels=(1, 10, 20)), dict(default_duration_s=20.0), dict(model="lu"),
                    dict(max_probe_duration_s=120.0), dict(omit_s=10.0)):
        assert lease_s(replace(default, **changed)) != lease_s(default), changed


RETENTION_TABLE = re.compile(r"^\| `(TAME_[A-Z0-9_]+)` \| ([^|]+) \| ([^|]+) \|", re.MULTILINE)


def test_the_retention_settings_table_gives_each_one_s_default_and_range_as_the_code_has_them():
    # TAME_PRUNE_BATCH was read by Settings.from_env and named once in docs/security.md, with neither its default nor
    # what it may be. Each retention setting is now a row of the table there: default, then range LOW-HIGH.
    text = (ROOT / "docs" / "security.md").read_text()
    rows = {name: (default.strip(), allowed.strip()) for name, default, allowed in RETENTION_TABLE.findall(
        text[text.index("## The store stays bounded"):])}
    fields = {"TAME_KEEP_FITS": "keep_fits", "TAME_KEEP_RUNS": "keep_runs", "TAME_RUN_MAX_AGE_S": "run_max_age_s",
              "TAME_KEEP_OBSERVATIONS": "keep_observations", "TAME_PRUNE_INTERVAL_S": "interval_s",
              "TAME_PRUNE_BATCH": "batch"}
    assert set(fields) <= set(rows), rows
    defaults = Settings.from_env({}).retention
    for name, field in fields.items():
        default, allowed = rows[name]
        assert float(default.split()[0]) == getattr(defaults, field), (name, default)
        bounds = re.fullmatch(r"([0-9]+)–([0-9]+)", allowed)
        if bounds is None:  # TAME_RUN_MAX_AGE_S: its range follows TAME_TTL_S (tests/advisor/test_settings.py)
            continue
        low, high = (int(b) for b in bounds.groups())
        for value in (low, high):
            assert getattr(Settings.from_env({name: str(value)}).retention, field) == value, name
        for value in (low - 1, high + 1):
            with pytest.raises(ConfigError, match=name):
                Settings.from_env({name: str(value)})


def test_the_docs_lookup_retry_figures_are_the_code_s():
    # "not claimed again for 5 s, twice as long each time more (at most an hour) ... the 12th time, about 2.4 hours".
    from advisor.allowlist import RESOLVE_TIMEOUT_S
    from advisor.jobs import LOOKUP_RETRY_MAX_S, MAX_LOOKUP_WAITS

    waits_s = [min(RESOLVE_TIMEOUT_S * 2.0 ** i, LOOKUP_RETRY_MAX_S) for i in range(MAX_LOOKUP_WAITS - 1)]
    hours = f"about {sum(waits_s) / 3600:.1f} hours"
    for doc in ("advice-service.md", "security.md"):
        text = " ".join((ROOT / "docs" / doc).read_text().split())
        assert f"not claimed again for {RESOLVE_TIMEOUT_S:g} s, twice as long each time more" in text, doc
        assert f"the {MAX_LOOKUP_WAITS}th time" in text and hours in text, doc
        assert LOOKUP_RETRY_MAX_S == 3600 and "at most an hour" in text, doc
