"""A probe of a test-bed path under a chosen congestion control is stored under the control iperf3 reports.

The issue's path (issue 32 item 5): 30 Mbit/s, 60 ms RTT, 3 CUBIC cross flows, one BDP of queue. `tame agent
--once --congestion-control reno` probes it from the sender namespace into a SQLite file; the stored run and
fit say reno, and the advice under reno answers while the host's default control has none.
"""

import sqlite3
import subprocess
import sys

import pytest

from probes.testbed import TestbedSpec

pytestmark = [pytest.mark.netns, pytest.mark.iperf]

# 30 Mbit/s x 60 ms / 8 = 225 kB: one bandwidth-delay product of queue.
ISSUE_PATH = TestbedSpec(rate_bps=30e6, rtt_s=0.060, queue_bytes=225_000, cross_flows=3, name="x")


@pytest.mark.parametrize("testbed_path", [ISSUE_PATH], indirect=True)
def test_a_reno_probe_is_stored_as_reno(testbed_path, tmp_path):
    dest = f"{testbed_path.server_addr}:{testbed_path.server_port}"
    (tmp_path / "dests").write_text(dest + "\n")
    db = tmp_path / "tame.sqlite3"
    env = ["env", f"TAME_DATABASE_URL=sqlite:///{db}", f"TAME_ALLOWED_DESTINATIONS={testbed_path.server_addr}/32",
           "TAME_MODEL=lu", "TAME_PROBE_LEVELS=1,2", "TAME_PROBE_DURATION_S=2", "TAME_PROBE_MAX_DURATION_S=2",
           "TAME_PRUNE_INTERVAL_S=0"]
    done = subprocess.run(
        testbed_path.in_sender([*env, sys.executable, "-m", "advisor", "agent", "--once", "--dest-file",
                                str(tmp_path / "dests"), "--congestion-control", "reno"]),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT congestion_control FROM probe_runs").fetchall()
        fits = conn.execute("SELECT congestion_control FROM current_fits").fetchall()
        jobs = conn.execute("SELECT congestion_control, status, error FROM probe_jobs").fetchall()
        raw = [r for (r,) in conn.execute("SELECT raw FROM probe_results")]
    assert runs == [("reno",)] and fits == [("reno",)], (runs, fits, jobs)
    assert jobs == [("reno", "done", None)]
    # iperf3 itself said so: its summary names the sender's control.
    assert raw and all('"sender_tcp_congestion":"reno"' in r.replace(" ", "") for r in raw)


@pytest.mark.parametrize("testbed_path", [ISSUE_PATH], indirect=True)
def test_a_control_this_kernel_lacks_is_refused_before_probing(testbed_path):
    dest = f"{testbed_path.server_addr}:{testbed_path.server_port}"
    done = subprocess.run(testbed_path.in_sender([sys.executable, "-m", "advisor", "probe", dest,
                                                  "--congestion-control", "nosuchcc"]),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert "not available in this kernel" in done.stderr and "tcp_available_congestion_control" in done.stderr
