"""The README's HTTP example as processes: a real `tame serve` probing a real `iperf3 -s` on 127.0.0.1
through its own worker (probes.iperf.IperfDriver), then advice over HTTP and the same stream count
from the `current_advice` SQL view of the file it wrote.

Kept short by settings only: 1 s probes that are never extended (TAME_PROBE_MAX_DURATION_S=1), no
warm-up (TAME_PROBE_OMIT_S=0) and Lu's model, which adds no adaptive third probe: the plan takes a few seconds.
"""

import sqlite3

import httpx
import pytest
from numpy.testing import assert_allclose

from tests.api.conftest import free_port, wait_for
from tests.api.procs import start_iperf3, start_serve, stop

pytestmark = pytest.mark.iperf


def test_serve_probes_a_real_iperf3_and_advises_what_the_view_says(tmp_path):
    iperf_port = free_port()
    db_path = tmp_path / "tame.sqlite3"
    iperf = start_iperf3(tmp_path, iperf_port)
    serve = None
    try:
        serve, base = start_serve(tmp_path, db_path, env={
            "TAME_PROBE_DURATION_S": "1", "TAME_PROBE_MAX_DURATION_S": "1", "TAME_PROBE_OMIT_S": "0",
            "TAME_MODEL": "lu", "TAME_ALLOWED_DESTINATIONS": "127.0.0.0/8"})
        dest = f"127.0.0.1:{iperf_port}"
        with httpx.Client(base_url=base, timeout=30) as http:
            accepted = http.post("/v1/probes", json={"dest": dest, "levels": [1, 2], "duration_s": 1})
            assert accepted.status_code == 202, accepted.text
            job_id = accepted.json()["id"]
            # A generous bound: the plan itself takes about 15 s.
            job = wait_for(lambda: (lambda s: s if s["status"] in ("done", "failed") else None)(
                http.get(f"/v1/probes/{job_id}").json()), timeout_s=180, what="the probe job")
            assert job["status"] == "done", job
            advice = http.get("/v1/advice", params={"dest": dest, "max_impact": 0.2})
            assert advice.status_code == 200, advice.text
            advice = advice.json()
    finally:
        if serve is not None:
            stop(serve)
        stop(iperf)

    db = sqlite3.connect(db_path)
    try:
        run_id, address = db.execute("SELECT probe_run_id, address FROM probe_jobs WHERE id = ?", (job_id,)).fetchone()
        assert address == "127.0.0.1"
        stored = db.execute("SELECT streams, throughput_bps FROM probe_results WHERE probe_run_id = ? ORDER BY streams",
                            (run_id,)).fetchall()
        (view_flows,) = db.execute("SELECT coalesce(max(streams), 1) FROM current_advice "
                                   "WHERE dest = ? AND impact_bound <= ?", (dest, 0.2)).fetchone()
    finally:
        db.close()
    assert [s for s, _ in stored] == [1, 2]
    assert all(bps > 0 for _, bps in stored), stored
    assert advice["dest"] == dest and advice["model"] == "lu"
    got = sorted((p["streams"], p["throughput_bps"]) for p in advice["probes"])
    assert [s for s, _ in got] == [1, 2]
    assert_allclose([bps for _, bps in got], [bps for _, bps in stored], rtol=1e-12)
    assert advice["num_flows"] == view_flows
