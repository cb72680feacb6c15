"""`tame agent` with a spool it cannot write (a full disk, a read-only one): it says so, naming the directory and
what to do, and loses no run it can keep, nor dies. Real processes: `tame serve`, `iperf3 -s` on loopback, the agent,
and a small tmpfs as the spool (mounting needs root: these tests fail, never skip, in CI)."""

import json
import os
import sqlite3
import subprocess
from contextlib import contextmanager

import pytest

from tests.api.conftest import free_port, wait_for
from tests.api.procs import TAME, start_iperf3, start_serve, stop
from tests.api.test_agent_site_cli import SHORT_PROBES
from tests.api.test_idempotency import RUN


@contextmanager
def small_tmpfs(path, *, full=False, read_only=False, size="4k"):
    """A tmpfs of ``size`` at ``path`` (made), filled up when ``full``, mounted read-only when ``read_only``;
    unmounted after."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("mounting a tmpfs as the spool needs root")
        pytest.skip("mounting a tmpfs as the spool needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if read_only else ""), "tame-test-spool",
                    str(path)], check=True)
    try:
        if full:
            with pytest.raises(OSError), open(path / "filler", "wb") as fh:
                fh.write(b"x" * (2 << 20))
                fh.flush()
                os.fsync(fh.fileno())
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def agent_env(tmp_path):
    env = {**os.environ, **SHORT_PROBES, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("TAME_TOKEN", None)
    return env


def jobs(db):
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT status, attempts FROM probe_jobs").fetchall()


def runs(db):
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM probe_runs").fetchone()[0]


def left_in(spool):
    return sorted(name for name in os.listdir(spool) if name != "filler")


@pytest.mark.iperf
def test_a_site_run_the_full_spool_cannot_keep_is_held_and_delivered_when_the_service_is_back(tmp_path):
    """The service goes down while the site's probe runs, and the spool is full: the agent says it cannot keep the
    run there (naming the directory and the error), leaves no half-written file, holds the run in memory and
    delivers it once the service is back, closing the job (before: the run vanished and the job stayed running
    until its lease ended)."""
    iperf_port, serve_port = free_port(), free_port()
    iperf = start_iperf3(tmp_path, iperf_port)
    (tmp_path / "serve").mkdir()
    db = tmp_path / "tame.sqlite3"
    serve, base = start_serve(tmp_path / "serve", db, env=SHORT_PROBES, args=("--no-worker",), port=serve_port)
    dests = tmp_path / "dests"
    dests.write_text(f"127.0.0.1:{iperf_port}\n")
    out, err = tmp_path / "agent.out", tmp_path / "agent.err"
    agent = None
    try:
        with small_tmpfs(tmp_path / "spool", full=True) as spool:
            agent = subprocess.Popen([TAME, "agent", "--site", "dtn1", "--server", base, "--dest-file", str(dests),
                                      "--spool", str(spool), "--interval", "1"], env=agent_env(tmp_path),
                                     stdout=out.open("wb"), stderr=err.open("wb"), stdin=subprocess.DEVNULL)
            wait_for(lambda: jobs(db) == [("running", 1)], timeout_s=60, what="the site's probe running")
            stop(serve)
            wait_for(lambda: "kept in memory" in err.read_text(), timeout_s=60, what="the run held")
            said = err.read_text()
            assert f"the spool directory {spool} cannot be written (No space left on device)" in said, said
            assert "free space there" in said and "--spool" in said
            assert left_in(spool) == []  # no .tmp left behind
            serve, base = start_serve(tmp_path / "serve", db, env=SHORT_PROBES, args=("--no-worker",),
                                      port=serve_port)
            wait_for(lambda: "from memory" in out.read_text(), timeout_s=60, what="the held run delivered")
            assert runs(db) == 1 and jobs(db) == [("done", 1)]
            assert agent.poll() is None
    finally:
        stop(agent, serve, iperf)


@pytest.mark.iperf
def test_a_pushing_agent_whose_spool_is_full_says_so_and_does_not_die(tmp_path):
    """--push to a service that is not there, the spool full: the run cannot be kept anywhere past this --once
    round, and the agent says so and why, then exits 0 (before: a traceback, exit 1, and a .tmp left for ever)."""
    iperf_port = free_port()
    iperf = start_iperf3(tmp_path, iperf_port)
    dests = tmp_path / "dests"
    dests.write_text(f"127.0.0.1:{iperf_port}\n")
    env = {**agent_env(tmp_path), "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8"}
    try:
        with small_tmpfs(tmp_path / "spool", full=True) as spool:
            done = subprocess.run([TAME, "agent", "--push", f"http://127.0.0.1:{free_port()}", "--dest-file",
                                   str(dests), "--spool", str(spool), "--once"], env=env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert "Traceback" not in done.stderr
            assert f"the spool directory {spool} cannot be written (No space left on device)" in done.stderr
            assert "1 run(s) the service did not take and the spool could not keep are lost" in done.stderr
            assert left_in(spool) == []
    finally:
        stop(iperf)


@pytest.mark.parametrize("mode", [["--site", "dtn1", "--server"], ["--push"]])
def test_an_agent_whose_spool_is_read_only_stops_at_start_with_2(tmp_path, mode):
    """Checked before anything runs: exit 2, one line naming the directory, the error and what to do (before: the
    site agent ran on, and crashed at its first delivery from the spool, start after start)."""
    dests = tmp_path / "dests"
    dests.write_text("127.0.0.1:5201\n")
    with small_tmpfs(tmp_path / "spool", read_only=True) as spool:
        done = subprocess.run([TAME, "agent", *mode, f"http://127.0.0.1:{free_port()}", "--dest-file", str(dests),
                               "--spool", str(spool)], env=agent_env(tmp_path), capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"tame agent: the spool directory {spool} cannot be written (Read-only file system): free "
                           "space there, make it writable by this user, or give --spool another directory\n")


def test_a_run_delivered_from_a_spool_turned_read_only_is_reported_and_the_agent_goes_on(tmp_path):
    """A run waits in the spool; the spool's disk turns read-only (a remount after errors) while the agent runs.
    The run is delivered, its file cannot be removed: the agent says so and goes on, sending it again each round,
    which stores nothing new (its Idempotency-Key); before, it died with a traceback, start after start."""
    serve_port = free_port()
    (tmp_path / "serve").mkdir()
    db = tmp_path / "tame.sqlite3"
    dests = tmp_path / "dests"
    dests.write_text("# nothing to probe: the agent registers and delivers its spool\n")
    err = tmp_path / "agent.err"
    agent = serve = None
    try:
        with small_tmpfs(tmp_path / "spool") as spool:
            (spool / "1-kept.json").write_text(json.dumps({"form": "tame-agent-spool/1", "idempotency_key": "k-1",
                                                           "payload": {**RUN, "src": "dtn1"}}))
            # The service is not there yet: the agent starts, its spool writable, and waits for it.
            agent = subprocess.Popen([TAME, "agent", "--site", "dtn1", "--server", f"http://127.0.0.1:{serve_port}",
                                      "--dest-file", str(dests), "--spool", str(spool), "--interval", "1"],
                                     env=agent_env(tmp_path), stdout=subprocess.DEVNULL, stderr=err.open("wb"),
                                     stdin=subprocess.DEVNULL)
            wait_for(lambda: "cannot reach the advice service" in err.read_text(), timeout_s=60, what="a round")
            subprocess.run(["mount", "-o", "remount,ro", str(spool)], check=True)
            serve, base = start_serve(tmp_path / "serve", db, args=("--no-worker",), port=serve_port)
            wait_for(lambda: err.read_text().count("cannot remove") >= 2, timeout_s=60, what="two deliveries")
            said = err.read_text()
            assert f"delivered {spool / '1-kept.json'} but cannot remove it (Read-only file system)" in said, said
            assert "Traceback" not in said and agent.poll() is None
            assert runs(db) == 1  # sent every round, stored once
            assert left_in(spool) == ["1-kept.json"]
    finally:
        if agent is not None:
            agent.kill()
            agent.wait(30)
        if serve is not None:
            stop(serve)


@pytest.mark.iperf
def test_a_run_held_in_memory_goes_to_the_spool_once_it_has_room_and_outlives_the_agent(tmp_path):
    """The service is not there and the spool is full: the run is held in memory. Space comes back while the service
    is still away: the run is written to the spool with its key and probe time, and a stop then loses nothing
    (before: it stayed in memory only, and the stop reported it lost)."""
    iperf_port = free_port()
    iperf = start_iperf3(tmp_path, iperf_port)
    dests = tmp_path / "dests"
    dests.write_text(f"127.0.0.1:{iperf_port}\n")
    env = {**agent_env(tmp_path), "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8"}
    err = tmp_path / "agent.err"
    agent = None
    try:
        with small_tmpfs(tmp_path / "spool", full=True, size="1m") as spool:  # a run's record takes some kB
            agent = subprocess.Popen([TAME, "agent", "--push", f"http://127.0.0.1:{free_port()}", "--dest-file",
                                      str(dests), "--spool", str(spool), "--interval", "1"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=err.open("wb"), stdin=subprocess.DEVNULL)
            wait_for(lambda: "kept in memory" in err.read_text(), timeout_s=60, what="the run held")
            (spool / "filler").unlink()
            wait_for(lambda: left_in(spool), timeout_s=30, what="the held run written to the spool")
            agent.terminate()
            assert agent.wait(30) == 0, err.read_text()
            assert "are lost" not in err.read_text(), err.read_text()
            kept = [json.loads((spool / name).read_text()) for name in left_in(spool)]
            assert kept and all(r["form"] == "tame-agent-spool/1" and r["idempotency_key"] and r["spooled_at"] > 0
                                and r["payload"]["dest"] == f"127.0.0.1:{iperf_port}" for r in kept), kept
    finally:
        stop(agent, iperf)


@pytest.mark.iperf
def test_a_run_refused_for_the_agents_token_stays_in_the_spool_until_the_token_is_right(tmp_path):
    """401 is the agent's token, not the run: the run stays in the spool, not set aside as a refused run is
    (before: every spooled run went to rejected/ at the first round after a token rotation, never sent again)."""
    iperf_port = free_port()
    iperf = start_iperf3(tmp_path, iperf_port)
    (tmp_path / "serve").mkdir()
    db = tmp_path / "tame.sqlite3"
    serve, base = start_serve(tmp_path / "serve", db, env={"TAME_TOKEN": "right-token-0123456789"},
                              args=("--no-worker",))
    dests = tmp_path / "dests"
    dests.write_text(f"127.0.0.1:{iperf_port}\n")
    spool = tmp_path / "spool"
    env = {**agent_env(tmp_path), "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8"}
    try:
        done = subprocess.run([TAME, "agent", "--push", base, "--dest-file", str(dests), "--spool", str(spool),
                               "--once"], env={**env, "TAME_TOKEN": "wrong-token-0123456789"}, capture_output=True,
                              text=True, timeout=120)
        assert "HTTP 401" in done.stderr and "once the agent's token (TAME_TOKEN)" in done.stderr, done.stderr
        assert len(list(spool.glob("*.json"))) == 1 and not (spool / "rejected").exists()
        assert runs(db) == 0
        dests.write_text("# nothing to probe: the agent delivers its spool\n")
        done = subprocess.run([TAME, "agent", "--push", base, "--dest-file", str(dests), "--spool", str(spool),
                               "--once"], env={**env, "TAME_TOKEN": "right-token-0123456789"}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and "from the spool" in done.stdout, (done.stdout, done.stderr)
        assert runs(db) == 1 and list(spool.glob("*.json")) == []
    finally:
        stop(serve, iperf)
