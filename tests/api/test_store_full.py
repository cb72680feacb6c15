"""A store whose disk fills up while a probe runs: the probe's run is kept, stored once space comes back, and its job
closed then, not left `running` with nobody running it until its lease (twenty minutes for the default plan) ran out.
Real processes: the app under uvicorn with the fake probe driver (tests/api/fake_server.py) on a SQLite file in a
small tmpfs, filled and freed by the test (mounting needs root: these tests fail, never skip, in CI)."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.conftest import free_port, wait_for
from tests.api.procs import TOKEN_VARIABLES, stop
from tests.api.test_agent_spool import small_tmpfs

ROOT = Path(__file__).resolve().parents[2]


def fill(folder: Path) -> Path:
    """A file in ``folder`` written until its file system is full; its path."""
    filler = folder / "filler"
    try:
        with filler.open("wb") as fh:
            while True:
                fh.write(b"x" * 65536)
                fh.flush()
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC
    return filler


def fake_server(db: Path, log: Path, delay_s: float):
    """tests.api.fake_server on a free port over ``db``, its output in ``log``: (Popen, base URL)."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(TOKEN_VARIABLES)},
           "TAME_DATABASE_URL": f"sqlite:///{db}", "FAKE_DELAY_S": str(delay_s), "TAME_PROBE_DURATION_S": "1",
           "TAME_MODEL": "lu"}
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.api.fake_server", str(port)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            return httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, what="the fake server")
    return proc, base


def test_a_run_the_full_store_could_not_take_is_stored_once_space_comes_back(tmp_path):
    log = tmp_path / "server.log"
    proc = None
    with small_tmpfs(tmp_path / "store", size="8m") as store:
        db = store / "tame.sqlite3"
        try:
            proc, base = fake_server(db, log, delay_s=2)
            job_id = httpx.post(f"{base}/v1/probes", json={"dest": "127.0.0.1"}, timeout=10).json()["id"]
            wait_for(lambda: httpx.get(f"{base}/v1/probes/{job_id}", timeout=10).json()["status"] == "running",
                     what="the probe running")
            filler = fill(store)
            # The probe ends and its run meets the full disk (before: the worker's thread died with a traceback).
            wait_for(lambda: "could not be stored" in log.read_text(errors="replace")
                     or "probe worker error" in log.read_text(errors="replace"), timeout_s=120,
                     what="the run meeting the full store")
            filler.unlink()
            # Well inside the job's lease (1272 s for this plan): before, the job stayed running all of it.
            final = wait_for(lambda: (lambda s: s if s["status"] != "running" else None)(
                httpx.get(f"{base}/v1/probes/{job_id}", timeout=10).json()), timeout_s=60,
                what="the job closed once space came back")
            assert final["status"] == "done" and final["attempts"] == 1 and final["error"] is None, final
            assert httpx.get(f"{base}/v1/advice", params={"dest": "127.0.0.1", "max_impact": 0.5},
                             timeout=10).status_code == 200
        finally:
            stop(proc)
        said = log.read_text(errors="replace")
        assert "Traceback" not in said, said
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert conn.execute("SELECT count(*) FROM probe_runs").fetchone()[0] == 1
            assert conn.execute("SELECT count(*) FROM fits").fetchone()[0] == 1
