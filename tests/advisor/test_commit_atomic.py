"""A probe run, its results, its fit, its curve and its job's final status are written in one
transaction (advisor/store.py record_run): a process SIGKILLed anywhere in it leaves all of them or
none, and a job left running by the dead process is re-queued.

The child is a small Python process that claims the job and stores a run through AdviceService.ingest_run,
as the worker does. The store's test hook (advisor.store.RECORD_RUN_PAUSE_ENV) names each step of the
transaction on stderr and pauses there (until told to go on, on stdin), so the child is killed at every
step in turn; then at seeded random moments of a transaction whose steps pause briefly.
"""

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.destinations import parse_destination
from advisor.settings import Settings
from advisor.store import RECORD_RUN_PAUSE_ENV, Store
from tests.sites import SITE

ROOT = Path(__file__).resolve().parents[2]
DEST = parse_destination("127.0.0.1:5201")
# The steps record_run names, in order: two probe results, and the curve paused half-way.
STEPS = ["begin", "destination", "result", "result", "fit", "curve", "job"]
CURVE_POINTS = Settings().n_max  # one curve point per stream count 1..n_max

CHILD = """
import sys, time
from advisor.destinations import parse_destination
from advisor.jobs import process_owner
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from probes.result import ProbeResult
from tests.api.conftest import rate
from tests.sites import SITE

url = sys.argv[1]
store = Store.open(url)
service = AdviceService(store, Settings(database_url=url, model="lu"))
store.recover_jobs(1000)
job = store.claim_job(process_owner(), lambda job: 3600.0, 1, src=SITE)
print("claimed", job.id, flush=True)
dest = parse_destination(job.dest)
results = [ProbeResult(dest=dest.key, streams=n, duration_s=1.0, omit_s=0.0, throughput_bps=rate(n),
                       sender_bps=rate(n), retransmits=0, rtt_mean_s=0.01) for n in (1, 10)]
service.ingest_run(dest, 0.01, results, time.time(), source="probe", job_id=job.id, address="127.0.0.1")
print("recorded", flush=True)
"""


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/tame.sqlite3"
    return request.getfixturevalue("pg_url")


def state(store):
    """(row counts, {job id: (status, probe_run_id)}) of the store."""
    with store.db.transaction() as tx:
        counts = {table: tx.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                  for table in ("probe_runs", "probe_results", "fits", "curve_points")}
        jobs = {row[0]: (row[1], row[2]) for row in tx.execute("SELECT id, status, probe_run_id FROM probe_jobs").fetchall()}
    return counts, jobs


def start_child(url, pause):
    env = {**os.environ, RECORD_RUN_PAUSE_ENV: str(pause)}
    return subprocess.Popen([sys.executable, "-c", CHILD, url], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)


def read_until(stream, wanted, timeout_s=120.0):
    """Lines of ``stream`` up to and including the first that starts with ``wanted`` (a generous bound)."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while True:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no line starting {wanted!r} in time; saw {seen}")
        line = stream.readline()
        if not line:
            raise AssertionError(f"the child ended before {wanted!r}; saw {seen}")
        seen.append(line.rstrip("\n"))
        if line.startswith(wanted):
            return seen


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()


def assert_all_or_none(store, before, job_id):
    """The store after a kill: the run and everything with it, or nothing of it and the job left running."""
    (counts_before, _), (counts, jobs) = before, state(store)
    status, run_id = jobs[job_id]
    if counts == counts_before:
        assert (status, run_id) == ("running", None), jobs[job_id]
        # The dead child's job goes back to the queue.
        assert store.recover_jobs(1000) == 1
        assert state(store)[1][job_id] == ("queued", None)
        return "none"
    assert counts == {"probe_runs": counts_before["probe_runs"] + 1,
                      "probe_results": counts_before["probe_results"] + 2,
                      "fits": counts_before["fits"] + 1,
                      "curve_points": counts_before["curve_points"] + CURVE_POINTS}, (counts_before, counts)
    assert status == "done" and run_id is not None, jobs[job_id]
    with store.db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM probe_results WHERE probe_run_id = ?", (run_id,)).fetchone()[0] == 2
        (fit_id,) = tx.execute("SELECT id FROM fits WHERE probe_run_id = ?", (run_id,)).fetchone()
        assert tx.execute("SELECT count(*) FROM curve_points WHERE fit_id = ?", (fit_id,)).fetchone()[0] == CURVE_POINTS
    return "all"


def assert_intact(store):
    if store.db.dialect == "sqlite":
        with store.db.transaction() as tx:
            assert tx.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_sigkill_inside_record_run_leaves_all_or_none(db_url):
    store = Store.open(db_url)
    try:
        job, _ = store.enqueue_job(DEST, [1, 10], 1.0, src=SITE)
        # At each step of the transaction in turn: the child is sleeping there when it is killed.
        for index, step in enumerate(STEPS):
            before = state(store)
            child = start_child(db_url, pause="stdin")
            try:
                seen = read_until(child.stderr, "record_run step")
                for _ in range(index):
                    child.stdin.write("\n")
                    child.stdin.flush()
                    seen += read_until(child.stderr, "record_run step")
                assert seen[-1] == f"record_run step {step}", seen
            finally:
                kill(child)
            assert assert_all_or_none(store, before, job.id) == "none", step
            assert_intact(store)

        # At seeded random moments of a transaction whose seven steps pause 50 ms each.
        rng = random.Random(30)
        for _ in range(10):
            job, _ = store.enqueue_job(DEST, [1, 10], 1.0, src=SITE)  # the same job while it is not done
            before = state(store)
            child = start_child(db_url, pause=0.05)
            try:
                read_until(child.stdout, "claimed")
                time.sleep(rng.uniform(0.0, 0.45))
            finally:
                kill(child)
            assert_all_or_none(store, before, job.id)
            assert_intact(store)

        # Not killed: the run is stored whole and the job done.
        job, _ = store.enqueue_job(DEST, [1, 10], 1.0, src=SITE)
        before = state(store)
        child = start_child(db_url, pause="")
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert "recorded" in out
        assert assert_all_or_none(store, before, job.id) == "all"
        assert_intact(store)
    finally:
        store.close()
