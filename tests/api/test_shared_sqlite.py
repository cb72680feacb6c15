"""One SQLite file, three writing processes at once: two `tame serve --no-worker` taking observations
and pushed probe runs from client threads, and a `tame agent --once` probing a real `iperf3 -s` on
127.0.0.1 and storing its job and run locally. No write the servers acknowledged is lost, no response
is a 5xx, and no process reports "database is locked".
"""

import os
import sqlite3
import subprocess
import threading

import httpx
import pytest

from tests.api.conftest import free_port, rate
from tests.api.procs import TAME, start_iperf3, start_serve, stop

pytestmark = pytest.mark.iperf

FAST_PLAN = {"TAME_PROBE_DURATION_S": "1", "TAME_PROBE_MAX_DURATION_S": "1", "TAME_MODEL": "lu"}
# Each client thread writes at least MIN_ROUNDS pairs (observation, probe run) and goes on until the
# agent has exited, so the agent's writes, its run's transaction last, fall among the servers'.
# MAX_ROUNDS only bounds a run where the agent hangs.
MIN_ROUNDS, MAX_ROUNDS = 60, 5000


def test_two_servers_and_an_agent_share_one_sqlite_file(tmp_path):
    db_path = tmp_path / "tame.sqlite3"
    iperf_port = free_port()
    agent_dest = f"127.0.0.1:{iperf_port}"
    dest_file = tmp_path / "destinations.txt"
    dest_file.write_text(f"{agent_dest}\n")
    iperf = start_iperf3(tmp_path, iperf_port)
    servers = []
    agent = None
    try:
        for _ in range(2):
            servers.append(start_serve(tmp_path, db_path, env=FAST_PLAN, args=("--no-worker",)))
        env = {**os.environ, "TAME_DATABASE_URL": f"sqlite:///{db_path}", **FAST_PLAN}
        with (tmp_path / "agent.out").open("wb") as out, (tmp_path / "agent.err").open("wb") as err:
            agent = subprocess.Popen([TAME, "agent", "--once", "--dest-file", str(dest_file)], env=env,
                                     stdout=out, stderr=err, stdin=subprocess.DEVNULL)

        acked_observations: dict[str, int] = {}
        acked_runs: set[int] = set()
        failures = []
        lock = threading.Lock()

        def client(index, base):
            dest = f"127.0.0.{10 + index}:5201"  # one destination per thread, so its count is its own
            observed, runs = 0, []
            with httpx.Client(base_url=base, timeout=120) as http:
                for i in range(MAX_ROUNDS):
                    if i >= MIN_ROUNDS and agent.poll() is not None:
                        break
                    n = 1 + i % 8
                    answer = http.post("/v1/observations", json={"dest": dest, "streams": n,
                                                                 "throughput_bps": rate(n)})
                    if answer.status_code == 202:
                        observed += 1
                    else:
                        failures.append(("observation", answer.status_code, answer.text))
                    answer = http.post("/v1/probe-runs", json={"dest": dest, "probes": [
                        {"streams": 1, "throughput_bps": rate(1)}, {"streams": 10, "throughput_bps": rate(10)}]})
                    if answer.status_code == 201:
                        runs.append(answer.json()["probe_run_id"])
                    else:
                        failures.append(("probe-run", answer.status_code, answer.text))
            with lock:
                acked_observations[dest] = observed
                acked_runs.update(runs)

        threads = [threading.Thread(target=client, args=(i, servers[i % 2][1])) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        assert not any(thread.is_alive() for thread in threads)
        assert agent.wait(300) == 0, (tmp_path / "agent.err").read_text(errors="replace")
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        for proc, _ in servers:
            stop(proc)
        stop(iperf)

    assert failures == []
    logs = {path.name: path.read_text(errors="replace") for path in tmp_path.glob("*.err")}
    assert not [name for name, text in logs.items() if "locked" in text.lower()], logs
    with sqlite3.connect(db_path) as db:
        for dest, count in acked_observations.items():
            stored = db.execute("SELECT count(*) FROM observations o JOIN destinations d ON d.id = o.destination_id "
                                "WHERE d.dest = ?", (dest,)).fetchone()[0]
            assert stored == count >= MIN_ROUNDS, dest
        stored_runs = {row[0] for row in db.execute("SELECT id FROM probe_runs WHERE source = 'push'")}
        assert stored_runs == acked_runs and len(acked_runs) >= 4 * MIN_ROUNDS
        # The agent's own job and run went into the same file.
        status, run_id = db.execute("SELECT status, probe_run_id FROM probe_jobs WHERE dest = ?",
                                    (agent_dest,)).fetchone()
        assert status == "done", status
        assert db.execute("SELECT source, address FROM probe_runs WHERE id = ?", (run_id,)).fetchone() == \
            ("probe", "127.0.0.1")
        assert db.execute("SELECT count(*) FROM probe_results WHERE probe_run_id = ?", (run_id,)).fetchone()[0] == 2
