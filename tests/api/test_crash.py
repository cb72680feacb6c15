import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


def start_server(db_path, delay_s):
    port = free_port()
    env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{db_path}", "FAKE_DELAY_S": str(delay_s),
           "TAME_PROBE_DURATION_S": "1", "TAME_MODEL": "lu"}  # the fake path follows Lu's model
    proc = subprocess.Popen([sys.executable, "-m", "tests.api.fake_server", str(port)], cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, "server exited"
            return False

    wait_for(up, what="server start")
    return proc, base


def counts(db_path):
    db = sqlite3.connect(db_path)
    try:
        return {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("probe_runs", "probe_results", "fits", "curve_points")}
    finally:
        db.close()


def test_sigkill_during_a_probe_stores_nothing_and_the_next_start_recovers(tmp_path):
    db_path = tmp_path / "tame.sqlite3"
    proc, base = start_server(db_path, delay_s=60)
    try:
        job_id = httpx.post(f"{base}/v1/probes", json={"dest": "127.0.0.1"}).json()["id"]
        wait_for(lambda: httpx.get(f"{base}/v1/probes/{job_id}").json()["status"] == "running", what="probe running")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert counts(db_path) == {"probe_runs": 0, "probe_results": 0, "fits": 0, "curve_points": 0}
    (status,) = sqlite3.connect(db_path).execute("SELECT status FROM probe_jobs WHERE id = ?", (job_id,)).fetchone()
    assert status == "running"

    proc, base = start_server(db_path, delay_s=0)
    try:
        final = wait_for(lambda: (lambda s: s if s["status"] in ("done", "failed") else None)(
            httpx.get(f"{base}/v1/probes/{job_id}").json()), what="re-queued probe")
        assert final["status"] == "done" and final["attempts"] == 2, final
        # Lu's curve with the default margin: n* = 2.790 (tests/api/test_advice.py).
        assert httpx.get(f"{base}/v1/advice", params={"dest": "127.0.0.1", "max_impact": 0.5}).json()["num_flows"] == 2
    finally:
        proc.terminate()
        proc.wait(30)
    assert counts(db_path) == {"probe_runs": 1, "probe_results": 2, "fits": 1, "curve_points": 64}
