"""Real processes at the boundary (issue 31): `tame serve` killed or stopped during a real iperf3
probe leaves no probe behind and its job finishes after a restart; a restart as PID 1 of a new
PID namespace recovers the job at once; a probe goes to the address checked, never the name again.

Loopback only: iperf3 servers on 127.0.0.1 and 127.0.0.2, servers on 127.0.0.1.
"""

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from advisor.allowlist import AllowList
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from advisor.worker import ProbeWorker
from probes.iperf import IperfDriver
from tests.api.conftest import free_port, wait_for
from tests.api.procs import start_serve

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.iperf


def iperf_server(tmp_path, address, port):
    """`iperf3 -s` bound to ``address``:``port``, its log a file (Popen, log path)."""
    assert shutil.which("iperf3"), "iperf3 is not installed"
    log = tmp_path / f"iperf3-{address}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["iperf3", "-s", "-B", address, "-p", str(port), "--forceflush"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wait_for(lambda: "Server listening" in log.read_text(errors="replace") or proc.poll() is not None,
             timeout_s=30, what="iperf3 -s")
    assert proc.poll() is None, log.read_text(errors="replace")
    return proc, log


def stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


def probe_workers_of(pid):
    """Pids of the `probes.iperf_worker` processes whose parent is process ``pid`` (only the ones it started),
    measuring probes only (not the 2 s idle-RTT test, which would end on its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if b"probes.iperf_worker" in argv and b"--bandwidth-bps" not in argv and int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid):
    """True while ``pid`` runs: a zombie has exited (whoever adopted it reaps it when it will)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def serve(db_path, *prefix, module=("advisor", "serve"), options=(), **env):
    """`tame serve` (or another module) on a free port over ``db_path``: (Popen, base URL)."""
    port = free_port()
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{db_path}", "TAME_ALLOWED_DESTINATIONS": "127.0.0.1/32",
           "TAME_MODEL": "lu", "TAME_MAX_CONCURRENT_PROBES": "2", "TAME_PROBE_MAX_DURATION_S": "3", **env}
    args = ["--port", str(port), *options] if module == ("advisor", "serve") else [str(port)]
    proc = subprocess.Popen([*prefix, sys.executable, "-m", *module, *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, "server exited"
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, what="server start")
    return proc, base


def job_row(db_path, job_id):
    db = sqlite3.connect(db_path)
    try:
        return db.execute("SELECT status, attempts, error FROM probe_jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        db.close()


def finished(base, job_id):
    status = httpx.get(f"{base}/v1/probes/{job_id}", timeout=10).json()
    return status if status["status"] in ("done", "failed") else None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_server_stopped_during_a_probe_leaves_no_probe_and_the_job_finishes_after_a_restart(tmp_path, sig):
    iperf_port = free_port()
    iperf, _ = iperf_server(tmp_path, "127.0.0.1", iperf_port)
    try:
        db_path = tmp_path / "tame.sqlite3"
        proc, base = serve(db_path)
        try:
            response = httpx.post(f"{base}/v1/probes", json={"dest": f"127.0.0.1:{iperf_port}", "levels": [1, 2],
                                                              "duration_s": 3}, timeout=10)
            assert response.status_code == 202, response.text
            job_id = response.json()["id"]
            wait_for(lambda: probe_workers_of(proc.pid), what="an iperf3 worker of the server")
            workers = probe_workers_of(proc.pid)
            proc.send_signal(sig)
            proc.wait(30)
            stopped = time.monotonic()
            # SIGKILL: the kernel's parent-death signal; SIGTERM: the shutdown kills it before the server exits.
            wait_for(lambda: not any(alive(pid) for pid in workers), timeout_s=2.0,
                     what="the probe worker to die with the server")
            print(f"{sig.name}: workers {workers} gone {time.monotonic() - stopped:.3f} s after the server exited")
        finally:
            stop(proc)
        status, attempts, error = job_row(db_path, job_id)
        if sig == signal.SIGTERM:
            # Handed back, not failed: the interrupted attempt is not counted.
            assert (status, attempts) == ("queued", 0) and "service stopped" in error, (status, attempts, error)
        else:
            assert status == "running"
        proc, base = serve(db_path)
        try:
            final = wait_for(lambda: finished(base, job_id), timeout_s=120, what="the re-queued probe")
            assert final["status"] == "done", final
            assert final["attempts"] == (2 if sig == signal.SIGKILL else 1)
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        stop(iperf)


@pytest.mark.netns  # root: unshare --pid
def test_a_restart_as_pid_1_of_a_new_pid_namespace_recovers_the_job_at_once(tmp_path):
    # Like a container restarted: each server is PID 1 of its own namespace, so the dead owner's
    # pid (1) is alive again; its start time is not. The lease (minutes) would be far too late.
    db_path = tmp_path / "tame.sqlite3"
    # --kill-child: stopping unshare (the test's teardown) stops the server in the namespace too.
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    env = {"FAKE_DELAY_S": "60", "TAME_PROBE_DURATION_S": "1"}
    outer, base = serve(db_path, *namespace, module=("tests.api.fake_server",), **env)
    try:
        job_id = httpx.post(f"{base}/v1/probes", json={"dest": "127.0.0.1"}, timeout=10).json()["id"]
        wait_for(lambda: job_row(db_path, job_id)[0] == "running", what="probe running")
        (owner,) = sqlite3.connect(db_path).execute("SELECT owner FROM probe_jobs WHERE id = ?", (job_id,)).fetchone()
        assert owner.split(":")[1] == "1", owner
        # SIGKILL to the namespace's PID 1 (its pid out here is unshare's child): the namespace dies with it.
        (server,) = [int(p) for p in Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()]
        os.kill(server, signal.SIGKILL)
        outer.wait(30)
    finally:
        stop(outer)
    assert job_row(db_path, job_id)[0] == "running"
    restarted = time.monotonic()
    outer, base = serve(db_path, *namespace, module=("tests.api.fake_server",), **{**env, "FAKE_DELAY_S": "0"})
    try:
        final = wait_for(lambda: finished(base, job_id), timeout_s=60, what="the re-queued probe")
        assert final["status"] == "done" and final["attempts"] == 2, final
        assert time.monotonic() - restarted < 60
    finally:
        stop(outer)


def test_the_probes_go_to_the_address_checked_even_when_the_system_resolves_the_name_elsewhere(tmp_path):
    # The service's resolver says localhost is 127.0.0.2 (allowed); the system's says 127.0.0.1 (not
    # allowed): the name re-pointed between check and use. Every probe must reach the 127.0.0.2 server.
    port = free_port()
    checked, checked_log = iperf_server(tmp_path, "127.0.0.2", port)
    other, other_log = iperf_server(tmp_path, "127.0.0.1", port)
    store = Store.open(f"sqlite:///{tmp_path}/tame.sqlite3")
    try:
        settings = Settings(database_url=store.db.url, allowed=AllowList.parse("127.0.0.2/32"), model="lu",
                            default_levels=(1, 2), default_duration_s=1.0, omit_s=0.0, max_probe_duration_s=1.0)
        service = AdviceService(store, settings, resolver=lambda host: {"localhost": ["127.0.0.2"]}[host])
        job, _ = service.request_probe(f"localhost:{port}")
        assert ProbeWorker(service, IperfDriver()).run_once()
        assert "Accepted connection" not in other_log.read_text(errors="replace")
        final = store.job(job.id)
        assert final.status == "done", final.error
        assert "Accepted connection" in checked_log.read_text(errors="replace")
        with store.db.transaction() as tx:
            assert tx.execute("SELECT address FROM probe_runs WHERE job_id = ?", (job.id,)).fetchone()[0] == "127.0.0.2"
    finally:
        store.close()
        stop(checked)
        stop(other)


def test_a_full_queue_answers_429_with_retry_after(tmp_path):
    proc, base = serve(tmp_path / "tame.sqlite3", options=["--no-worker"], TAME_MAX_QUEUED_PROBES="2",
                       TAME_ALLOWED_DESTINATIONS="127.0.0.0/8")
    try:
        for n in (1, 2):
            assert httpx.post(f"{base}/v1/probes", json={"dest": f"127.0.0.{n}:1"}, timeout=10).status_code == 202
        full = httpx.post(f"{base}/v1/probes", json={"dest": "127.0.0.3:1"}, timeout=10)
        assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1, full.text
    finally:
        proc.terminate()
        proc.wait(30)


def test_sigterm_closes_the_store_so_sqlite_folds_its_log_back_into_the_file(tmp_path):
    """uvicorn re-raises SIGTERM once it has shut down, so nothing after it runs: the store is closed as the app
    stops instead, and SQLite's last connection folds the write-ahead log into the file and removes it."""
    db = tmp_path / "tame.sqlite3"
    proc, base = start_serve(tmp_path, db, args=("--no-worker",))
    try:
        posted = httpx.post(f"{base}/v1/probe-runs", timeout=30, json={"dest": "127.0.0.1:5201", "probes": [
            {"streams": 1, "throughput_bps": 1e8}, {"streams": 10, "throughput_bps": 4e8}]})
        assert posted.status_code == 201, posted.text
        assert (tmp_path / "tame.sqlite3-wal").exists()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        stop(proc)
    assert not (tmp_path / "tame.sqlite3-wal").exists()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM probe_runs").fetchone()[0] == 1
