"""`tame agent` stopped by SIGTERM (systemctl stop, docker stop) mid-probe: it kills the probe and exits 0, and a
job it held goes back to the queue at once, not counted as an attempt, its site charged only what it ran. Real
processes: `tame serve`, `iperf3 -s` on loopback, the agent."""

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.api.conftest import free_port, wait_for
from tests.api.procs import TAME, start_iperf3, start_serve, stop
from tests.api.test_agent_site_cli import SHORT_PROBES

pytestmark = pytest.mark.iperf

# Two levels of 3 s: a plan of some 8 s, so the signal comes while a probe runs.
PROBES = {**SHORT_PROBES, "TAME_PROBE_DURATION_S": "3", "TAME_PROBE_MAX_DURATION_S": "3"}


def agent_env(tmp_path, **extra):
    env = {**os.environ, **PROBES, "XDG_STATE_HOME": str(tmp_path / "state"), **extra}
    env.pop("TAME_TOKEN", None)
    return env


def rows(db, sql):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def probing_to(port):
    """Pids of processes whose command line names iperf3's client to ``port`` (a probe still sending)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-c" in argv and str(port).encode() in argv:
            found.append(int(entry.name))
    return found


def served_link(tmp_path):
    """(port, process) of `iperf3 -s` on loopback, (process, URL, database) of `tame serve --no-worker` with PROBES,
    and a destination file naming the iperf3 server."""
    iperf_port = free_port()
    iperf = start_iperf3(tmp_path, iperf_port)
    (tmp_path / "serve").mkdir()
    db = tmp_path / "tame.sqlite3"
    serve, base = start_serve(tmp_path / "serve", db, env=PROBES, args=("--no-worker",))
    dests = tmp_path / "dests"
    dests.write_text(f"127.0.0.1:{iperf_port}\n")
    return iperf_port, iperf, serve, base, db, dests


def default_sigint():
    """Run in the child before exec: SIGINT as a terminal gives it, whatever this test's parent set (a shell's
    background job starts with it ignored, and the agent leaves an ignored signal ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def terminated(agent, iperf_log, signum=signal.SIGTERM):
    """``signum`` to ``agent`` once a probe of it is sending (iperf3 -s accepted it): (exit status, seconds it took)."""
    wait_for(lambda: iperf_log.read_text(errors="replace").count("Accepted connection") >= 2, timeout_s=60,
             what="a probe sending")
    sent = time.monotonic()
    agent.send_signal(signum)
    return agent.wait(30), time.monotonic() - sent


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_site_agent_stopped_by_a_signal_hands_its_probe_back_at_once(tmp_path, signum):
    """Before: killed outright (by SIGTERM; by Ctrl-C, a KeyboardInterrupt), its job stayed running for the rest of
    its lease (137 s in the hunt), the site's hour was charged the whole lease and an attempt was counted. Now: exit 0
    within seconds, the job queued again with no attempt counted, the hour charged the seconds it ran, no probe left
    sending, and the next agent probes it now."""
    iperf_port, iperf, serve, base, db, dests = served_link(tmp_path)
    agent_argv = [TAME, "agent", "--site", "dtn1", "--server", base, "--dest-file", str(dests), "--interval", "1"]
    err = tmp_path / "agent.err"
    agent = subprocess.Popen(agent_argv, env=agent_env(tmp_path), stdout=subprocess.DEVNULL, stderr=err.open("wb"),
                             stdin=subprocess.DEVNULL, preexec_fn=default_sigint)
    try:
        status, took_s = terminated(agent, tmp_path / "iperf3.log", signum)
        [(lease_s,)] = rows(db, "SELECT seconds_reserved FROM probe_jobs")
        assert status == 0, err.read_text()
        assert took_s < 10 and f"tame agent: stopped by {signum.name}" in err.read_text()
        assert "Traceback" not in err.read_text()
        [(job_status, attempts, error)] = rows(db, "SELECT status, attempts, error FROM probe_jobs")
        assert (job_status, attempts) == ("queued", 0) and "handed back by" in error
        [(spent_s,)] = rows(db, "SELECT seconds FROM spent_attempts")
        assert 0 < spent_s < 15 < lease_s, (spent_s, lease_s)
        assert probing_to(iperf_port) == []
        again = subprocess.run([*agent_argv, "--once"], env=agent_env(tmp_path), capture_output=True, text=True,
                               timeout=120)
        assert again.returncode == 0, again.stderr
        assert rows(db, "SELECT status, attempts FROM probe_jobs") == [("done", 1)]
    finally:
        stop(agent)
        stop(serve)
        stop(iperf)


def test_a_local_agent_stopped_by_sigterm_puts_its_job_back_uncounted(tmp_path):
    """`tame agent` on the local store: its worker kills the probe and re-queues the job, the attempt not counted
    (before: killed outright, the job left running under a dead owner)."""
    iperf_port = free_port()
    iperf = start_iperf3(tmp_path, iperf_port)
    db = tmp_path / "local.sqlite3"
    dests = tmp_path / "dests"
    dests.write_text(f"127.0.0.1:{iperf_port}\n")
    env = agent_env(tmp_path, TAME_DATABASE_URL=f"sqlite:///{db}", TAME_ALLOWED_DESTINATIONS="127.0.0.0/8")
    err = tmp_path / "agent.err"
    agent = subprocess.Popen([TAME, "agent", "--dest-file", str(dests), "--interval", "1"], env=env,
                             stdout=subprocess.DEVNULL, stderr=err.open("wb"), stdin=subprocess.DEVNULL)
    try:
        status, took_s = terminated(agent, tmp_path / "iperf3.log")
        assert status == 0 and took_s < 10, err.read_text()
        assert rows(db, "SELECT status, attempts, error FROM probe_jobs") == [
            ("queued", 0, "interrupted: the service stopped; re-queued")]
        assert probing_to(iperf_port) == []
    finally:
        stop(agent)
        stop(iperf)


def test_a_pushing_agent_stopped_by_sigterm_stops_its_probe_and_exits_0(tmp_path):
    iperf_port, iperf, serve, base, db, dests = served_link(tmp_path)
    err = tmp_path / "agent.err"
    agent = subprocess.Popen([TAME, "agent", "--push", base, "--dest-file", str(dests), "--interval", "1"],
                             env=agent_env(tmp_path, TAME_ALLOWED_DESTINATIONS="127.0.0.0/8"),
                             stdout=subprocess.DEVNULL, stderr=err.open("wb"), stdin=subprocess.DEVNULL)
    try:
        status, took_s = terminated(agent, tmp_path / "iperf3.log")
        assert status == 0 and took_s < 10, err.read_text()
        assert err.read_text().endswith("tame agent: stopped by SIGTERM\n"), err.read_text()
        assert probing_to(iperf_port) == [] and rows(db, "SELECT count(*) FROM probe_runs") == [(0,)]
    finally:
        stop(agent)
        stop(serve)
        stop(iperf)
