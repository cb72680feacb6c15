"""`tame agent --push` keeps what it could not deliver and sends it on the next round (issue 31, defect 8).

Real processes throughout: an `iperf3 -s` on loopback, the agent (`python -m advisor agent --once`)
and a `tame serve` that is down for the first round and up for the second.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
import pytest

from advisor.commands.agent import SPOOL_FORM, default_spool_dir
from advisor.db import Database
from tests.api.conftest import free_port, wait_for

pytestmark = pytest.mark.iperf


@pytest.fixture
def iperf_server():
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed")
    port = free_port()
    proc = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def agent(env, *args):
    return subprocess.run([sys.executable, "-m", "advisor", "agent", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def agent_setup(tmp_path, dest):
    """(environment, destination file listing ``dest``) for an agent and the server it pushes to: short probes at
    two levels, no warm-up, no extension and no adaptive level (one round is a few seconds of iperf3), no token."""
    env = {**os.environ, "TAME_PROBE_LEVELS": "1,2", "TAME_PROBE_DURATION_S": "1", "TAME_PROBE_MAX_DURATION_S": "1",
           "TAME_PROBE_OMIT_S": "0", "TAME_MODEL": "lu", "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8",
           "TAME_DATABASE_URL": f"sqlite:///{tmp_path}/server.sqlite3"}
    env.pop("TAME_TOKEN", None)
    dests = tmp_path / "dests.txt"
    dests.write_text(f"{dest}\n")
    return env, dests


@contextmanager
def served(env, port=None):
    """A `tame serve --no-worker` on 127.0.0.1 (``port``, else a free one) over env's database: yields its URL."""
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "advisor", "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--no-worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _healthy(base), what="tame serve")
        yield base
    finally:
        server.terminate()
        server.wait(30)


def test_a_run_the_service_could_not_take_is_spooled_and_delivered_next_round(tmp_path, iperf_server):
    env, dests = agent_setup(tmp_path, iperf_server)
    spool = tmp_path / "spool"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    push = ["--dest-file", str(dests), "--push", base, "--spool", str(spool), "--once"]

    # Round 1: nothing listens at the service's address. The probe runs; its run is kept.
    first = agent(env, *push)
    assert first.returncode == 0, first.stderr
    spooled = sorted(spool.glob("*.json"))
    assert len(spooled) == 1, first.stderr
    assert "kept in" in first.stderr
    record = json.loads(spooled[0].read_text())
    assert record["form"] == SPOOL_FORM and record["payload"]["dest"] == iperf_server
    # Ten minutes pass before the service is back: the run, delivered then, is dated by its probes, not its arrival.
    assert time.time() - 60 < record["spooled_at"] <= time.time()
    spooled[0].write_text(json.dumps({**record, "spooled_at": record["spooled_at"] - 600}))
    assert [p["streams"] for p in record["payload"]["probes"]] == [1, 2]
    # A run the service will refuse (422: no stream count 0) waits in the spool beside it, older.
    bad = spool / "0-refused.json"
    bad.write_text(json.dumps({"form": SPOOL_FORM, "payload": {
        "dest": iperf_server, "probes": [{"streams": 0, "throughput_bps": 1e6}]}}))

    with served(env, port):
        # Round 2: the spool goes first. The refused run is set aside, the kept one delivered, and the
        # destination is then fresh, so no new probe runs.
        second = agent(env, *push)
        assert second.returncode == 0, second.stderr
        assert "from the spool" in second.stdout
        assert second.stdout.count("pushed run") == 1
        assert "refused the run" in second.stderr and "HTTP 422" in second.stderr
        assert list(spool.glob("*.json")) == []
        assert [p.name for p in (spool / "rejected").iterdir()] == ["0-refused.json"]
        paths = httpx.get(f"{base}/v1/paths", timeout=30).json()["paths"]
        assert [p["dest"] for p in paths] == [iperf_server]
        assert 600 <= paths[0]["age_s"] < 700 and paths[0]["stale"] is False
    runs = rows(env, "SELECT r.source, count(p.id), max(p.omit_s) FROM probe_runs r "
                     "JOIN probe_results p ON p.probe_run_id = r.id GROUP BY r.id")
    assert len(runs) == 1 and runs[0][1] == 2  # the one run, with both probes
    assert runs[0][2] == 0  # probed with the agent's TAME_PROBE_OMIT_S, not the default 5 s warm-up


def test_runs_an_agent_stopped_while_spooling_left_are_delivered_or_set_aside(tmp_path, iperf_server):
    # A writer killed after writing a record's temporary file, before renaming it (_spool), leaves the file: whole
    # (killed after its fsync) or in part. Ten minutes on, the next agent takes them up: the whole run is delivered,
    # the part set aside (also one dated ahead, by a clock set back since). A young one may be another agent's being
    # written: it stays as it is.
    env, dests = agent_setup(tmp_path, iperf_server)
    spool = tmp_path / "spool"
    spool.mkdir()
    record = json.dumps({"form": SPOOL_FORM, "idempotency_key": "left-1", "spooled_at": time.time() - 700,
                         "payload": {"dest": iperf_server, "probes": [{"streams": 1, "throughput_bps": 1e8},
                                                                      {"streams": 2, "throughput_bps": 1.5e8}]}})
    whole, part, young = (spool / f".{name}.json.tmp" for name in ("1-aaaaaaaa", "2-bbbbbbbb", "3-cccccccc"))
    whole.write_text(record)
    part.write_text(record[:40])
    young.write_text(record)
    os.utime(whole, (time.time() - 700, time.time() - 700))
    os.utime(part, (time.time() + 86400, time.time() + 86400))  # written before the clock was set back a day
    with served(env) as base:
        done = agent(env, "--dest-file", str(dests), "--push", base, "--spool", str(spool), "--once")
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("left by an agent stopped while spooling a run") == 2, done.stderr
        assert "from the spool" in done.stdout and "2-bbbbbbbb.json is unreadable" in done.stderr, done.stderr
        assert [p.name for p in (spool / "rejected").iterdir()] == ["2-bbbbbbbb.json"]
        assert sorted(p.name for p in spool.iterdir() if p.is_file()) == [young.name]
    # The whole run stored once, under the key it was spooled with (the agent then probed under its own control).
    assert rows(env, "SELECT count(*) FROM request_keys k JOIN probe_runs r ON r.id = k.record_id "
                     "WHERE k.idempotency_key = 'left-1'") == [(1,)]


def test_leftovers_that_are_no_run_an_agent_left_are_set_aside_and_never_stop_the_agent(tmp_path, iperf_server):
    # Anything named .NAME.json.tmp ten minutes old was taken up by renaming it to NAME.json whatever it was: a
    # leftover whose NAME.json is a directory (or a directory leftover beside a NAME.json file) raised
    # IsADirectoryError / NotADirectoryError out of the agent's loop, so the agent died at every start and delivered
    # nothing; a leftover named as a spooled run was renamed over that run, which was lost. Now a leftover that is not
    # a regular file (a directory, a FIFO, a symlink), or whose name is taken, is set aside in rejected/, the spooled
    # run is delivered, and the agent goes on.
    env, dests = agent_setup(tmp_path, iperf_server)
    spool = tmp_path / "spool"
    spool.mkdir()
    record = json.dumps({"form": SPOOL_FORM, "idempotency_key": "kept-1", "spooled_at": time.time() - 700,
                         "payload": {"dest": iperf_server, "probes": [{"streams": 1, "throughput_bps": 1e8},
                                                                      {"streams": 2, "throughput_bps": 1.5e8}]}})
    (spool / "1-aaaaaaaa.json").write_text(record)          # a spooled run ...
    (spool / ".1-aaaaaaaa.json.tmp").write_text("{")         # ... and a leftover of its name, written in part
    (spool / ".2-bbbbbbbb.json.tmp").write_text(record.replace("kept-1", "left-2"))
    (spool / "2-bbbbbbbb.json").mkdir()                      # a directory where the leftover's record goes
    (spool / "2-bbbbbbbb.json" / "x").write_text("")
    (spool / ".3-cccccccc.json.tmp").mkdir()                 # a directory, a FIFO and a symlink as leftovers
    os.mkfifo(spool / ".4-dddddddd.json.tmp")
    (spool / ".5-eeeeeeee.json.tmp").symlink_to(spool / "1-aaaaaaaa.json")
    for left in spool.glob(".*.json.tmp"):
        os.utime(left, (time.time() - 700, time.time() - 700), follow_symlinks=False)
    with served(env) as base:
        done = agent(env, "--dest-file", str(dests), "--push", base, "--spool", str(spool), "--once")
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert "from the spool" in done.stdout, (done.stdout, done.stderr)
    # (The directory 2-bbbbbbbb.json is set aside as an unreadable spooled run, as before.)
    assert sorted(p.name for p in (spool / "rejected").iterdir()) == [f".{n}.json.tmp" for n in (
        "1-aaaaaaaa", "2-bbbbbbbb", "3-cccccccc", "4-dddddddd", "5-eeeeeeee")] + ["2-bbbbbbbb.json"], done.stderr
    assert done.stderr.count("is no run an agent left") == 5, done.stderr
    # The spooled run stored once, under its key: the part-written leftover did not replace it.
    assert rows(env, "SELECT count(*) FROM request_keys k JOIN probe_runs r ON r.id = k.record_id "
                     "WHERE k.idempotency_key = 'kept-1'") == [(1,)]


def test_a_pushing_agent_judges_freshness_by_its_server_s_own_site(tmp_path, iperf_server):
    """Runs pushed without src are the server's own site's: another site's fresh advice for the same destination
    does not make the agent skip it."""
    env, dests = agent_setup(tmp_path, iperf_server)
    with served(env) as base:
        other_site = httpx.post(f"{base}/v1/probe-runs", timeout=30, json={
            "src": "dtn1", "dest": iperf_server, "probes": [{"streams": 1, "throughput_bps": 1e8},
                                                           {"streams": 2, "throughput_bps": 1.5e8}]})
        assert other_site.status_code == 201, other_site.text
        done = agent(env, "--dest-file", str(dests), "--push", base, "--spool", str(tmp_path / "spool"), "--once")
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("pushed run") == 1, (done.stdout, done.stderr)
        own = httpx.get(f"{base}/v1/advice", params={"dest": iperf_server, "max_impact": 0.3}, timeout=30)
        assert own.status_code == 200 and own.json()["src"] != "dtn1"


def rows(env, sql):
    """The rows ``sql`` reads from the server's database."""
    db = Database(env["TAME_DATABASE_URL"])
    try:
        with db.transaction() as tx:
            return [tuple(r) for r in tx.execute(sql).fetchall()]
    finally:
        db.close()


def _healthy(base):
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_default_spool_follows_xdg_state_home(tmp_path):
    assert default_spool_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "tame" / "spool"
    assert default_spool_dir({}).parts[-4:] == (".local", "state", "tame", "spool")


def test_a_run_stored_whose_answer_was_lost_is_sent_again_and_stored_once(tmp_path, iperf_server):
    """The service commits the run, and the network loses its answer: the agent keeps the run and sends it again
    under the same Idempotency-Key next round, which stores nothing new and delivers it from the spool."""
    from tests.api.dropping_proxy import DroppingProxy

    env, dests = agent_setup(tmp_path, iperf_server)
    spool = tmp_path / "spool"
    with served(env) as base:
        port = int(base.rsplit(":", 1)[1])
        with DroppingProxy(("127.0.0.1", port), b"POST /v1/probe-runs") as proxy:
            push = ["--dest-file", str(dests), "--push", proxy.url, "--spool", str(spool), "--once"]
            first = agent(env, *push)
            assert first.returncode == 0 and proxy.dropped == 1, (first.stdout, first.stderr)
            assert "not delivered" in first.stderr and "kept in" in first.stderr
            [spooled] = spool.glob("*.json")
            key = json.loads(spooled.read_text())["idempotency_key"]
            stored = httpx.get(f"{base}/v1/paths", timeout=30).json()["paths"]
            assert [p["dest"] for p in stored] == [iperf_server]  # the service had it all along
            second = agent(env, *push)
            assert second.returncode == 0, second.stderr
            assert "from the spool" in second.stdout and second.stdout.count("pushed run") == 1, second.stdout
            assert list(spool.glob("*.json")) == []
    assert rows(env, "SELECT count(*) FROM probe_runs") == [(1,)]
    assert rows(env, "SELECT idempotency_key FROM request_keys") == [(key,)]


class HangingService:
    """A listener on 127.0.0.1 that answers every GET 503 at once and never answers a POST /v1/probe-runs (a service
    stuck in its write): ``posted`` is set when one has arrived."""

    def __init__(self):
        import socket
        import threading

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.posted = threading.Event()
        self._held = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                head += chunk
            if head.startswith(b"POST /v1/probe-runs"):
                self._held.append(conn)  # read, never answered
                self.posted.set()
                continue
            body = b'{"detail": "busy"}'
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
            conn.close()

    def close(self):
        self._sock.close()
        for conn in self._held:
            conn.close()


def test_an_agent_killed_while_its_run_is_being_sent_delivers_it_after_a_restart(tmp_path, iperf_server):
    """The service takes the run's request and does not answer (stuck in a write; the agent waits 30 s for it), and
    the agent is SIGKILLed meanwhile: the run was written to the spool before it was sent, so the next start
    delivers it, stored once (before: it was only in the dead agent's memory, and lost)."""
    env, dests = agent_setup(tmp_path, iperf_server)
    spool = tmp_path / "spool"
    hanging = HangingService()
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "agent", "--dest-file", str(dests), "--push",
                             hanging.url, "--spool", str(spool), "--once"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        assert hanging.posted.wait(120), "the agent never sent its run"
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        hanging.close()
    [kept] = spool.glob("*.json")
    assert json.loads(kept.read_text())["payload"]["dest"] == iperf_server
    dests.write_text("# nothing to probe: the agent delivers its spool\n")
    with served(env) as base:
        done = agent(env, "--dest-file", str(dests), "--push", base, "--spool", str(spool), "--once")
        assert done.returncode == 0, done.stderr
        assert "from the spool" in done.stdout and done.stdout.count("pushed run") == 1, (done.stdout, done.stderr)
        assert list(spool.glob("*.json")) == []
    assert rows(env, "SELECT count(*) FROM probe_runs") == [(1,)]


def test_a_destination_the_pushing_agents_own_allow_list_refuses_says_the_agent_refused_it(tmp_path):
    """The server allows 127.0.0.0/8; the agent's own TAME_ALLOWED_DESTINATIONS does not. Its refusal said "not
    allowed on this service", sending the operator to the server's list, which allows it."""
    env, dests = agent_setup(tmp_path, "127.0.0.1:5201")
    with served(env) as base:
        done = agent({**env, "TAME_ALLOWED_DESTINATIONS": "10.0.0.0/8"}, "--dest-file", str(dests), "--push", base,
                     "--spool", str(tmp_path / "spool"), "--once")
    assert done.returncode == 0, done.stderr
    assert ("tame agent: 127.0.0.1:5201: probes to 127.0.0.1 are not allowed on this agent; ask the operator to add "
            "it to TAME_ALLOWED_DESTINATIONS\n") in done.stderr, done.stderr
    assert "pushed run" not in done.stdout


def test_a_destination_the_in_process_agents_allow_list_refuses_says_the_agent_refused_it(tmp_path):
    """A plain `tame agent` (no --push, no --site) runs the service in its own process on its own
    TAME_ALLOWED_DESTINATIONS, and said "not allowed on this service" both when it asked for a probe and when its
    worker took one queued before the list was narrowed (as a pushing agent did, test above)."""
    from advisor.service import AdviceService
    from advisor.settings import Settings
    from advisor.store import Store

    env, dests = agent_setup(tmp_path, "127.0.0.1:5201")
    settings = Settings.from_env(env)  # allows 127.0.0.0/8: the probe is queued
    store = Store.open(settings.database_url)
    try:
        job, created = AdviceService(store, settings).request_probe("127.0.0.1:5201")
    finally:
        store.close()
    assert created
    done = agent({**env, "TAME_ALLOWED_DESTINATIONS": "10.0.0.0/8"}, "--dest-file", str(dests), "--once")
    assert done.returncode == 0, done.stderr
    refusal = ("probes to 127.0.0.1 are not allowed on this agent; ask the operator to add it to "
               "TAME_ALLOWED_DESTINATIONS")
    assert f"tame agent: 127.0.0.1:5201: {refusal}\n" in done.stderr, done.stderr  # asking for a probe
    # The queued probe, failed by the worker with its job's error as stored.
    failed = f"tame agent: 127.0.0.1:5201: probe failed: DestinationNotAllowed: {refusal}\n"
    assert failed in done.stderr, done.stderr
    assert "this service" not in done.stderr, done.stderr
