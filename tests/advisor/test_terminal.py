"""What a `tame` command prints, text from a store or a server among it, reaches the terminal with every character a
terminal acts on (ESC, CR, C1 controls, bidi overrides and isolates) as a visible escape: a store written by an older
version, or a hostile server, cannot clear the screen, rewrite a line or reorder one. Real `tame` processes, a real
SQLite file, a real server."""

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import replace

import pytest

from advisor.allowlist import AllowList
from advisor.destinations import parse_destination
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from advisor.terminal import visible, visible_lines
from api.app import create_app
from probes.result import ProbeResult
from tests.api.conftest import Clock, json_server, live_server, rate

DEST = parse_destination("127.0.0.1:5201")
# Clears the screen, reverses what follows (Trojan Source), rewrites the line, a C1 CSI, an isolate, a tag character.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\u202eevil\u202c\rover\x9b31m\u2067x\u2069\U000e0041"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\u202eevil\\u202c\\rover\\x9b31m\\u2067x\\u2069\\U000e0041"


def test_visible_writes_each_character_a_terminal_acts_on_as_its_escape_and_keeps_the_rest():
    assert visible(HOSTILE) == SHOWN
    assert visible("a\nb\tc") == "a\\nb\\tc" and visible_lines("a\nb\tc\n") == "a\nb\\tc\n"
    text = "iperf3 — 试试 C:\\x1b ünïcode"  # printable: a backslash, and non-ASCII letters, stay as they are
    assert visible(text) is text
    assert all(visible(chr(code)) == repr(chr(code))[1:-1] for code in range(0x110000)
               if chr(code) not in "'\"\\")


def tame(*args, env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TAME_TOKEN", "TAME_READ_TOKEN", "TAME_URL")}
    return subprocess.run([sys.executable, "-m", "advisor", *args], env={**env, **env_extra}, capture_output=True,
                          timeout=180)


@pytest.fixture
def hostile_store(tmp_path):
    """A SQLite store holding one link whose destination was stored as HOSTILE (by an older version, say)."""
    url = f"sqlite:///{tmp_path}/tame.sqlite3"
    settings = replace(Settings(database_url=url), allowed=AllowList.parse("127.0.0.0/8"), model="lu")
    store = Store.open(url, clock=Clock())
    service = AdviceService(store, settings, clock=store.clock)
    results = [ProbeResult(dest=DEST.key, streams=n, duration_s=1.0, omit_s=0.0, throughput_bps=rate(n),
                           sender_bps=None) for n in (1, 10)]
    service.ingest_run(DEST, 0.01, results, started_at=store.clock(), source="probe", congestion_control="cubic")
    with sqlite3.connect(f"{tmp_path}/tame.sqlite3") as db:
        assert db.execute("UPDATE destinations SET dest = ?", (f"{DEST.key}{HOSTILE}",)).rowcount == 1
    yield settings, store
    store.close()


def _shows_escaped(output: bytes):
    text = output.decode()
    assert f"{DEST.key}{SHOWN}" in text, text
    assert all(c.isprintable() for c in text.replace("\n", "")), text


def test_tame_paths_prints_a_stored_destination_with_its_control_characters_escaped(hostile_store):
    settings, store = hostile_store
    done = tame("paths", env_extra={"TAME_DATABASE_URL": settings.database_url})
    assert done.returncode == 0, done.stderr
    _shows_escaped(done.stdout)
    # Its JSON holds the text as stored, written in JSON's escapes (json.dump: ASCII).
    listed = tame("paths", "--json", env_extra={"TAME_DATABASE_URL": settings.database_url})
    assert listed.stdout.isascii() and json.loads(listed.stdout)["paths"][0]["dest"] == f"{DEST.key}{HOSTILE}"


def test_tame_paths_prints_a_servers_destination_with_its_control_characters_escaped(hostile_store, tmp_path):
    settings, store = hostile_store
    with live_server(create_app(settings, store, None, clock=store.clock, start_worker=False)) as base:
        done = tame("paths", env_extra={"TAME_URL": base,
                                        "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/elsewhere.sqlite3"})
    assert done.returncode == 0, done.stderr
    _shows_escaped(done.stdout)


def refusing_server(detail: str):
    """An HTTP server answering every request 503 {"detail": detail}: a hostile service, or one in its way."""
    return json_server(lambda path: (503, {"detail": detail}))


def test_a_servers_refusal_is_printed_with_its_control_characters_escaped(tmp_path):
    with refusing_server(f"down\n{HOSTILE}") as base:
        done = tame("paths", env_extra={"TAME_URL": base})
    assert done.returncode == 2, done.stderr
    err = done.stderr.decode()
    assert f"HTTP 503: down\n{SHOWN}" in err, err
    assert all(c.isprintable() for c in err.replace("\n", "")), err
