"""`tame schedule` refuses bad and hostile input before anything runs: a clear one-line error, exit 2, no
transfer started, nothing stored. Against a live server (the fake path of tests/api/conftest.py)."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from advisor.db import redact_url
from tests.advisor.test_db import UNREACHABLE
from tests.api.conftest import free_port, probe_and_wait, wait_for
from tests.api.procs import start_iperf3, stop
from tests.sites import SITE

KNOWN = "127.0.0.1:5201"


@pytest.fixture
def served(service_factory, tmp_path):
    """(base URL, SQLite URL, run) with advice for KNOWN only; run(queue, *args) -> CompletedProcess."""
    base, client, app = service_factory(token="w")
    probe_and_wait(client, dest=KNOWN, headers={"Authorization": "Bearer w"})
    db_url = app.state.service.store.db.url
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAME_")}
    # The scheduler speaks for the service's own site (TAME_SITE), the source of links that name none.
    env.update(TAME_TOKEN="w", TAME_DATABASE_URL=f"sqlite:///{tmp_path}/other.sqlite3", TAME_SITE=SITE)

    def run(queue, *args, raw=False, extra_env=None, started=False):
        """The finished `tame schedule`, or with ``started`` the running one (stdout and stderr piped)."""
        path = tmp_path / "queue"
        if raw:
            path.write_bytes(queue)
        else:
            path.write_text(queue if isinstance(queue, str) else json.dumps(queue))
        argv, run_env = [sys.executable, "-m", "advisor", "schedule", str(path), *args], {**env, **(extra_env or {})}
        if started:
            return subprocess.Popen(argv, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=120)

    yield base, db_url, run


def _observations(db_url):
    with sqlite3.connect(db_url[len("sqlite:///"):]) as conn:
        return conn.execute("SELECT count(*) FROM observations").fetchone()[0]


def _refused(done, *says):
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.startswith("tame schedule: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    for text in says:
        assert text in done.stderr, done.stderr


def _transfer(**fields):
    return {"dest": KNOWN, "max_impact": 0.2, "duration_s": 1, **fields}


@pytest.mark.parametrize("queue, says", [
    ("{not json", "not valid JSON"),
    ({"transfers": [_transfer(max_impact=0)]}, "max_impact must be a fraction above 0"),
    ({"transfers": [_transfer(max_impact=1.01)]}, "max_impact must be a fraction above 0"),
    ({"transfers": [_transfer(max_impact=-1)]}, "max_impact must be a fraction above 0"),
    ("dest=127.0.0.1:5201 max_impact=NaN duration_s=1", "line 1: max_impact: 'NaN' is not a number"),
    ("dest=127.0.0.1:5201 max_impact=inf duration_s=1", "line 1: max_impact: 'inf' is not a number"),
    ({"transfers": [_transfer(src="siteA")]}, "no way to run a command on source 'sitea'"),
    ({"transfers": [_transfer(dest="127.0.0.1:5201; reboot")]}, "transfer 1: dest"),
    ({"sources": {"a": "ip netns exec x"}, "transfers": [_transfer(src="a")]}, "command prefix must be a list"),
    ({"transfers": [_transfer(), _transfer(duration_s=None)]}, "transfer 2: give exactly one of duration_s"),
    # Were read as 1 s and 0.2 (float() reads other scripts' digits and underscores) and run.
    ("dest=127.0.0.1:5201 max_impact=0.2 duration_s=\uff11", "line 1: duration_s: '\uff11' is not a number"),
    ("dest=127.0.0.1:5201 max_impact=0.2_0 duration_s=1", "line 1: max_impact: '0.2_0' is not a number"),
    # Was run with the last of the two budgets.
    ('{"transfers": [{"dest": "127.0.0.1:5201", "max_impact": 0.2, "duration_s": 1, "max_impact": 1}]}',
     "the queue file gives 'max_impact' twice in one object; give each key once"),
    # An explicit id: pytest puts the test's id in the environment (PYTEST_CURRENT_TEST) the CLI inherits.
    pytest.param("x" * (2 << 20), "larger than", id="2MiB"),
])
def test_a_bad_queue_file_is_refused_and_nothing_is_stored(served, queue, says):
    base, db_url, run = served
    _refused(run(queue, "--server", base), says)
    assert _observations(db_url) == 0


def test_a_source_named_twice_is_refused(served):
    """Were taken, one of the two prefixes chosen silently: "siteA" and "sitea" in the file are one site, and so are
    two --netns for it."""
    base, db_url, run = served
    queue = {"sources": {"siteA": [], "sitea": ["ip", "netns", "exec", "nowhere"]},
             "transfers": [_transfer(src="sitea")]}
    _refused(run(queue, "--server", base), "name site 'sitea' twice ('siteA' and 'sitea')")
    _refused(run({"transfers": [_transfer(src="a")]}, "--server", base, "--netns", "a=x", "--netns", "a=y"),
             "--netns names site 'a' twice")
    assert _observations(db_url) == 0


def test_an_unreadable_queue_file_is_refused(served, tmp_path):
    base, db_url, run = served
    _refused(run(b"\xff\xfe\x00garbage", "--server", base, raw=True), "cannot read the queue file")
    done = subprocess.run([sys.executable, "-m", "advisor", "schedule", str(tmp_path / "missing"), "--server", base],
                          capture_output=True, text=True, timeout=60)
    _refused(done, "cannot read the queue file", "No such file")


def test_an_unknown_link_anywhere_in_the_queue_runs_nothing(served):
    base, db_url, run = served
    # The first transfer's link is known (and has no iperf3 server: had it run, it would fail, exit 1).
    queue = {"transfers": [_transfer(), _transfer(dest="127.0.0.9:5201")]}
    _refused(run(queue, "--server", base), "transfer 2 (127.0.0.9:5201)", "HTTP 404")
    _refused(run(queue, "--database-url", db_url), "transfer 2 (127.0.0.9:5201)",
             f"no advice for {SITE} -> 127.0.0.9:5201")
    assert _observations(db_url) == 0


def test_a_link_from_a_source_without_advice_runs_nothing(served):
    base, db_url, run = served
    # KNOWN has advice from the service's own site only; from siteA it is another link, with none.
    queue = {"sources": {"siteA": []}, "transfers": [_transfer(), _transfer(src="siteA")]}
    _refused(run(queue, "--server", base), "transfer 2 (sitea -> 127.0.0.1:5201)", "HTTP 404")
    _refused(run(queue, "--database-url", db_url), "transfer 2 (sitea -> 127.0.0.1:5201)",
             "no advice for sitea -> 127.0.0.1:5201")
    assert _observations(db_url) == 0


@pytest.mark.parametrize("args, says", [
    (("--netns", "siteA"), "--netns 'siteA': give SITE=NAMESPACE"),
    (("--netns", "siteA=../../etc"), "--netns"),
    (("--concurrency", "0"), "--concurrency"),
    (("--congestion-control", "Cubic!"), "--congestion-control"),
    (("--database-url", "sqlite:////nonexistent/tame.sqlite3"), "no SQLite advice store at /nonexistent"),
    (("--concurrency", "100000"), "--concurrency"),
])
def test_bad_options_are_refused(served, args, says):
    base, db_url, run = served
    _refused(run({"transfers": [_transfer()]}, "--server", base, *args), says)
    assert _observations(db_url) == 0


@pytest.mark.parametrize("url, secrets, says", [*UNREACHABLE, ("mysql://tame:s3cretPW@db/tame", ["s3cretPW"],
                                                                 "--database-url: the database URL ")])
def test_a_database_url_that_cannot_be_read_is_refused_without_its_password(tmp_path, url, secrets, says):
    path = tmp_path / "queue"
    path.write_text(json.dumps({"transfers": [_transfer()]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAME_")}
    done = subprocess.run([sys.executable, "-m", "advisor", "schedule", str(path), "--plan", "--database-url", url],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("tame schedule: ") and redact_url(url) in done.stderr and says in done.stderr
    assert "Traceback" not in done.stderr
    for secret in secrets:
        assert secret not in done.stderr, (secret, done.stderr)


@pytest.mark.parametrize("name, value", [("TAME_CONGESTION_CONTROL", "Cubic!"), ("TAME_CONGESTION_CONTROL", "x" * 5000),
                                         ("TAME_SITE", "site a"), ("TAME_SITE", "../etc")])
def test_a_bad_environment_for_the_sql_reader_is_refused_naming_the_variable(served, tmp_path, name, value):
    base, db_url, run = served
    path = tmp_path / "queue"
    path.write_text(json.dumps({"transfers": [_transfer()]}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TAME_")}, name: value}
    done = subprocess.run([sys.executable, "-m", "advisor", "schedule", str(path), "--plan", "--database-url", db_url],
                          env=env, capture_output=True, text=True, timeout=120)
    _refused(done, f"tame schedule: {name}")
    assert _observations(db_url) == 0


def test_the_plan_names_each_transfers_advice_and_runs_nothing(served):
    base, db_url, run = served
    queue = {"transfers": [_transfer(), _transfer(max_impact=0.05)]}
    by_http, by_sql = (run(queue, "--plan", "--json", *read) for read in (("--server", base), ("--database-url", db_url)))
    assert by_http.returncode == by_sql.returncode == 0, (by_http.stderr, by_sql.stderr)
    http, sql = (json.loads(done.stdout)["transfers"] for done in (by_http, by_sql))
    assert [t["advised_streams"] for t in http] == [t["advised_streams"] for t in sql]
    assert [t["advice_read"] for t in http + sql] == ["http", "http", "sql", "sql"]
    assert _observations(db_url) == 0


def test_rows_stored_before_controls_were_recorded_answer_the_default_control_only_over_sql_as_over_http(served):
    base, db_url, run = served
    # A store from before controls were recorded: the link's fits carry no control. The service answers its
    # default control (this host's, as the scheduler's: neither sets TAME_CONGESTION_CONTROL) from them, and
    # no other control.
    with sqlite3.connect(db_url[len("sqlite:///"):]) as conn:
        conn.execute("UPDATE fits SET congestion_control = NULL")
    default = httpx.get(f"{base}/v1/advice", params={"dest": KNOWN, "max_impact": 0.2}).json()["congestion_control"]
    other = next(c for c in ("reno", "cubic") if c != default)
    queue = {"transfers": [_transfer()]}
    by_http, by_sql = (run(queue, "--plan", "--json", *read) for read in (("--server", base), ("--database-url", db_url)))
    assert by_http.returncode == by_sql.returncode == 0, (by_http.stderr, by_sql.stderr)
    assert [t["advised_streams"] for t in json.loads(by_http.stdout)["transfers"]] == \
        [t["advised_streams"] for t in json.loads(by_sql.stdout)["transfers"]]
    assert httpx.get(f"{base}/v1/advice", params={"dest": KNOWN, "max_impact": 0.2, "cc": other}).status_code == 404
    _refused(run(queue, "--plan", "--database-url", db_url, "--congestion-control", other),
             f"no advice for {SITE} -> {KNOWN} under {other}")
    # --congestion-control holds over HTTP too (it was read for SQL only, and HTTP answered the default's advice).
    _refused(run(queue, "--plan", "--server", base, "--congestion-control", other), f"under {other}")
    # With TAME_CONGESTION_CONTROL the service's default is that control, and a transfer naming none is asked
    # for under it over SQL too (not under the host's), so the unrecorded rows answer it.
    by_sql = run(queue, "--plan", "--json", "--database-url", db_url, extra_env={"TAME_CONGESTION_CONTROL": other})
    assert by_sql.returncode == 0, by_sql.stderr
    (planned,) = json.loads(by_sql.stdout)["transfers"]
    assert planned["congestion_control"] == other
    assert planned["advised_streams"] == json.loads(by_http.stdout)["transfers"][0]["advised_streams"]


def test_a_transfer_that_fails_is_reported_and_the_others_still_run_and_are_stored(served, tmp_path):
    base, db_url, run = served
    client = httpx.Client(base_url=base, headers={"Authorization": "Bearer w"}, timeout=30)
    listening, silent = free_port(), free_port()
    for port in (listening, silent):
        probe_and_wait(client, dest=f"127.0.0.1:{port}", headers={"Authorization": "Bearer w"})
    server = start_iperf3(tmp_path, listening)
    try:
        done = run(f"dest=127.0.0.1:{listening} max_impact=0.2 duration_s=1\n"
                   f"dest=127.0.0.1:{silent} max_impact=0.2 duration_s=1\n", "--server", base, "--json")
    finally:
        stop(server)
        client.close()
    assert done.returncode == 1, done.stderr
    ran, failed = json.loads(done.stdout)["transfers"]
    assert ran["error"] is None and ran["opened_streams"] == ran["advised_streams"] and ran["observation_id"]
    assert failed["observation_id"] is None and failed["throughput_bps"] is None
    assert failed["error"].startswith("the transfer failed") and "transfer 2" in done.stderr
    assert _observations(db_url) == 1


@pytest.mark.iperf
def test_a_schedule_stopped_by_sigterm_says_what_finished_before_it_exits(served, tmp_path):
    """SIGTERM (systemctl stop, a batch system's kill) while the second of two transfers runs: the first, finished
    and stored, is printed with its observation, the second is cut short (its error says so), nothing else runs,
    and the exit status is 130."""
    base, db_url, run = served
    client = httpx.Client(base_url=base, headers={"Authorization": "Bearer w"}, timeout=30)
    first, second = free_port(), free_port()
    servers = []
    try:
        for port in (first, second):
            probe_and_wait(client, dest=f"127.0.0.1:{port}", headers={"Authorization": "Bearer w"})
            (tmp_path / str(port)).mkdir()  # each its own log
            servers.append(start_iperf3(tmp_path / str(port), port))
        schedule = run(f"dest=127.0.0.1:{first} max_impact=0.2 duration_s=1\n"
                       f"dest=127.0.0.1:{second} max_impact=0.2 duration_s=60\n", "--server", base, "--json",
                       "--concurrency", "1", started=True)
        try:
            wait_for(lambda: _observations(db_url) == 1, timeout_s=60, what="the first transfer stored")
            time.sleep(1)  # the second is running
            schedule.send_signal(signal.SIGTERM)
            out, err = schedule.communicate(timeout=60)
        finally:
            if schedule.poll() is None:
                schedule.kill()
                schedule.wait(30)
    finally:
        for server in servers:
            stop(server)
        client.close()
    assert schedule.returncode == 130, err
    assert "tame schedule: interrupted" in err and "Traceback" not in err
    done, cut = json.loads(out)["transfers"]
    assert done["error"] is None and done["observation_id"] is not None and done["dest"] == f"127.0.0.1:{first}"
    assert cut["dest"] == f"127.0.0.1:{second}" and "cancelled" in cut["error"] and cut["observation_id"] is None
    assert _observations(db_url) == 1


def test_the_report_says_how_old_each_transfers_advice_is_and_whether_it_was_stale_over_http_and_sql(
        service_factory, clock, tmp_path):
    """An operator reading `tame schedule` saw the streams a transfer was started on and not that their advice was
    stale: only GET /v1/advice said so. Each row now names its link and its advice's age and staleness as the API
    does: over HTTP the service's answer, over SQL the store's newest evidence judged against TAME_TTL_S (real time
    here, as a scheduler on another host reads it)."""
    ttl_s = 600.0
    clock.now = time.time()  # the store's times are the real clock's, which the SQL read judges them by
    base, client, app = service_factory(start_worker=False, ttl_s=ttl_s)
    pushed = client.post("/v1/probe-runs", json={"dest": KNOWN, "idle_rtt_s": 0.01,
                                                 "probes": [{"streams": 1, "throughput_bps": 40e6},
                                                            {"streams": 10, "throughput_bps": 90e6}]})
    assert pushed.status_code == 201, pushed.text
    db_url = app.state.service.store.db.url
    path = tmp_path / "queue"
    path.write_text(f"dest={KNOWN} max_impact=0.2 duration_s=1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAME_")}
    env.update(TAME_SITE=SITE, TAME_TTL_S=f"{ttl_s:g}", TAME_DATABASE_URL=f"sqlite:///{tmp_path}/other.sqlite3")

    def plan(*read):
        done = subprocess.run([sys.executable, "-m", "advisor", "schedule", str(path), "--plan", *read], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    for step, word in ((30.0, "fresh"), (ttl_s, "STALE: its evidence was older than the service's TAME_TTL_S")):
        clock.advance(step)
        api = client.get("/v1/advice", params={"dest": KNOWN, "max_impact": 0.2}).json()
        assert api["stale"] == (word != "fresh")
        assert plan("--server", base).startswith(
            f"1. {SITE} -> {KNOWN} (advice {api['age_s']:.0f} s old, {word}"), word
        (row,) = json.loads(plan("--server", base, "--json"))["transfers"]
        assert (row["advice_age_s"], row["advice_stale"]) == (api["age_s"], api["stale"])
    # Over SQL: fresh now (real time), then stale once the store's evidence is older than the TTL.
    said = re.fullmatch(rf"1\. {SITE} -> {re.escape(KNOWN)} \(advice ([0-9]+) s old, fresh\): budget 20\.0%, "
                        r"advised [0-9]+ \S+ streams? \(sql\)\n", plan("--database-url", db_url))
    assert said and int(said.group(1)) < 60, said
    with sqlite3.connect(db_url[len("sqlite:///"):]) as conn:
        conn.execute("UPDATE fits SET probed_at = probed_at - ?, fitted_at = fitted_at - ?", (2 * ttl_s, 2 * ttl_s))
    said = re.match(rf"1\. {SITE} -> {re.escape(KNOWN)} \(advice ([0-9]+) s old, STALE: its evidence was older "
                    r"than TAME_TTL_S\): budget 20\.0%", plan("--database-url", db_url))
    assert said and 2 * ttl_s <= int(said.group(1)) < 2 * ttl_s + 60, said
    (row,) = json.loads(plan("--database-url", db_url, "--json"))["transfers"]
    assert row["advice_stale"] is True and row["advice_age_s"] >= 2 * ttl_s
