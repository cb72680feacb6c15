import json
import os
import subprocess
import sys

import pytest

from advisor.commands.agent import _enqueue_due, read_destinations
from advisor.cli import UsageError
from advisor.errors import ConfigError
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store


def test_settings_are_validated_naming_the_variable():
    settings = Settings.from_env({"TAME_TOKEN": "t", "TAME_ALLOWED_DESTINATIONS": "10.0.0.0/8, dtn.example.org",
                                  "TAME_PROBE_LEVELS": "10,1", "XDG_DATA_HOME": "/var/lib/x"})
    assert settings.token == "t" and settings.default_levels == (1, 10)
    assert settings.database_url == "sqlite:////var/lib/x/tame/tame.sqlite3"
    for env, name in (({"TAME_TTL_S": "soon"}, "TAME_TTL_S"), ({"TAME_DATABASE_URL": "mysql://x"}, "TAME_DATABASE_URL"),
                      ({"TAME_PROBE_LEVELS": "4"}, "TAME_PROBE_LEVELS"), ({"TAME_MODEL": "x"}, "TAME_MODEL"),
                      ({"TAME_ALLOWED_DESTINATIONS": "bad..name"}, "TAME_ALLOWED_DESTINATIONS")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env(env)


def test_agent_queues_missing_destinations_once(tmp_path):
    dest_file = tmp_path / "dests.txt"
    dest_file.write_text("# paths\n127.0.0.1\n127.0.0.2:5202  # second\n\n192.0.2.1\n")
    assert read_destinations(dest_file) == ["127.0.0.1:5201", "127.0.0.2:5202", "192.0.2.1:5201"]
    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3")
    service = AdviceService(store, Settings())
    _enqueue_due(service, read_destinations(dest_file))
    _enqueue_due(service, read_destinations(dest_file))
    # 192.0.2.1 is outside the default (loopback) allow-list: refused, not queued.
    assert store.job_counts() == {"queued": 2}
    store.close()
    (tmp_path / "bad.txt").write_text("ok.example\nnot a host\n")
    with pytest.raises(UsageError, match="bad.txt:2"):
        read_destinations(tmp_path / "bad.txt")


def test_tame_paths_lists_the_store(tmp_path):
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/s.sqlite3"}
    # Reading commands do not make a store where there is none (a mistyped path gave an empty store and "no
    # destinations yet"): they say so, exit 2, nothing made.
    for argv in (["paths"], ["curve", "127.0.0.1"]):
        missing = subprocess.run([sys.executable, "-m", "advisor", *argv],
                                 env={**env, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/typo/s.sqlite3"},
                                 capture_output=True, text=True, timeout=60)
        assert missing.returncode == 2 and f"no store at {tmp_path}/typo/s.sqlite3" in missing.stderr, missing
        assert "TAME_DATABASE_URL" in missing.stderr and "Traceback" not in missing.stderr
        assert list(tmp_path.iterdir()) == []
    Store.open(env["TAME_DATABASE_URL"]).close()  # as tame serve makes it
    empty = subprocess.run([sys.executable, "-m", "advisor", "paths"], env=env, capture_output=True, text=True, timeout=60)
    assert empty.returncode == 0 and "no destinations yet" in empty.stdout
    result = subprocess.run([sys.executable, "-m", "advisor", "paths", "--json"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert json.loads(result.stdout) == {"paths": []}
    bad = subprocess.run([sys.executable, "-m", "advisor", "paths"], env={**env, "TAME_TTL_S": "x"},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "TAME_TTL_S" in bad.stderr


def _seeded_store(tmp_path):
    """A real SQLite store holding one probe run of 127.0.0.1:5201 (1 stream 42 Mbit/s, 10 streams 88 Mbit/s)."""
    from advisor.destinations import parse_destination
    from probes.result import ProbeResult

    url = f"sqlite:///{tmp_path}/s.sqlite3"
    store = Store.open(url)
    results = [ProbeResult(dest="127.0.0.1:5201", streams=n, duration_s=10, omit_s=2, throughput_bps=bps,
                           sender_bps=bps) for n, bps in ((1, 42e6), (10, 88e6))]
    AdviceService(store, Settings(database_url=url)).ingest_run(parse_destination("127.0.0.1"), 0.04, results,
                                                                 started_at=0.0, source="probe")
    store.close()
    return {**os.environ, "TAME_DATABASE_URL": url}


def test_tame_curve_of_a_known_destination_matches_the_offline_fit(tmp_path):
    env = _seeded_store(tmp_path)
    known = subprocess.run([sys.executable, "-m", "advisor", "curve", "127.0.0.1", "--json"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert known.returncode == 0, known.stderr
    offline = subprocess.run([sys.executable, "-m", "advisor", "curve", "--probe", "1:42e6", "--probe", "10:88e6",
                              "--json"], capture_output=True, text=True, timeout=60)
    stored, fitted = json.loads(known.stdout), json.loads(offline.stdout)
    assert stored["dest"] == "127.0.0.1:5201" and stored["model"] == fitted["model"]
    # Same probes, same model: the stored curve is the offline one. Without loss evidence 'auto' is fair share:
    # 1/BW = a + b/n through (1, 42) and (10, 88) Mbit/s gives C = 100.19 Mbit/s, M = 1.3856, so
    # BW(2) = C 2 / (2 + M) = 59.19 Mbit/s.
    for mine, theirs in zip(stored["curve"], fitted["curve"]):
        assert mine["streams"] == theirs["streams"]
        assert abs(mine["throughput_bps"] - theirs["throughput_bps"]) <= 1e-6 * theirs["throughput_bps"]
    assert abs(stored["curve"][1]["throughput_bps"] - 59.19e6) < 0.01e6


def test_tame_curve_unknown_destination_and_bad_combinations(tmp_path):
    env = _seeded_store(tmp_path)
    for args, fragment in ((["127.0.0.9"], "request a probe"), (["127.0.0.1", "--probe", "1:1e6"], "not both"),
                           ([], "give DEST")):
        done = subprocess.run([sys.executable, "-m", "advisor", "curve", *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and fragment in done.stderr, done.stderr


def test_tame_curve_plot_writes_a_png(tmp_path):
    env = _seeded_store(tmp_path)
    out = tmp_path / "curve.png"
    done = subprocess.run([sys.executable, "-m", "advisor", "curve", "127.0.0.1", "--plot", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


@pytest.mark.parametrize("entries, named, words", [
    ("10.0.0.0/33", "10.0.0.0/33", "not a CIDR network"),
    ("10.0.0.1/8", "10.0.0.1/8", "host bits set"),
    ("http://x", "http://x", "looks like a URL"),
    ("10.0.0.0/8,*", "'*'", "every address"),
    ("*.", "'*.'", "neither a CIDR network nor a host name"),
    ("x\n.lab.test", "x\\n.lab.test", "not a valid host name"),
    ("dtn1.example.org:5201", "dtn1.example.org:5201", "without a port"),
    ("0x7f.1", "0x7f.1", "read it as 127.0.0.1"),
])
def test_a_bad_allow_list_entry_stops_start_up_naming_it(entries, named, words):
    with pytest.raises(ConfigError, match="TAME_ALLOWED_DESTINATIONS") as raised:
        Settings.from_env({"TAME_ALLOWED_DESTINATIONS": entries})
    assert named in str(raised.value) and words in str(raised.value)


def test_good_allow_list_entries_are_kept_canonical():
    allowed = Settings.from_env({"TAME_ALLOWED_DESTINATIONS": "10.0.0.0/8, ::1, DTN1.Example.org., *.Lab.Test"}).allowed
    assert allowed.describe() == ["10.0.0.0/8", "::1/128", "dtn1.example.org", "*.lab.test"]


@pytest.mark.iperf
def test_local_agent_says_when_a_probe_fails(tmp_path):
    # A local `tame agent --once` whose probe failed once printed nothing and exited 0: the error was only in the
    # store's probe_jobs row. It says so now, as a pushing agent does.
    from tests.conftest import _free_port

    port = _free_port()  # nothing listens there
    dest_file = tmp_path / "dests.txt"
    dest_file.write_text(f"127.0.0.1:{port}\n")
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/s.sqlite3"}
    done = subprocess.run([sys.executable, "-m", "advisor", "agent", "--dest-file", str(dest_file), "--once"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr
    assert f"tame agent: 127.0.0.1:{port}: probe failed" in done.stderr and "nothing listening" in done.stderr, \
        done.stderr


def test_tame_paths_tells_links_and_controls_apart(tmp_path):
    # One row per (link, control): without the source and the control the table once printed two rows alike for a
    # destination probed under two controls, or from two sites.
    from advisor.destinations import parse_destination
    from probes.result import ProbeResult

    url = f"sqlite:///{tmp_path}/s.sqlite3"
    store = Store.open(url)
    service = AdviceService(store, Settings(database_url=url))
    results = [ProbeResult(dest="127.0.0.1:5201", streams=n, duration_s=10, omit_s=2, throughput_bps=bps,
                           sender_bps=bps) for n, bps in ((1, 42e6), (10, 88e6))]
    for control, src in (("cubic", "dtn1"), ("reno", "dtn1"), ("cubic", "dtn2")):
        service.ingest_run(parse_destination("127.0.0.1"), 0.04, results, started_at=0.0, source="probe",
                           congestion_control=control, src=src)
    store.close()
    done = subprocess.run([sys.executable, "-m", "advisor", "paths"], env={**os.environ, "TAME_DATABASE_URL": url},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split()[:3] == ["source", "destination", "control"]
    assert sorted(tuple(row.split()[:3]) for row in rows) == [
        ("dtn1", "127.0.0.1:5201", "cubic"), ("dtn1", "127.0.0.1:5201", "reno"), ("dtn2", "127.0.0.1:5201", "cubic")]
