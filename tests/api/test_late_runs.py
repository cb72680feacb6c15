"""A run delivered late (an agent's spool) whose probes are older than the link's current advice is kept as history:
the advice, the schedulers' view and /v1/paths keep the newer fit, on SQLite and PostgreSQL."""

import pytest

from advisor.destinations import parse_destination
from probes.result import ProbeResult
from tests.sites import SITE

DEST = "127.0.0.1:5201"
WRITE = {"Authorization": "Bearer s3cret"}
FRESH = [{"streams": 1, "throughput_bps": 10e6}, {"streams": 10, "throughput_bps": 95e6}]
OLD = [{"streams": 1, "throughput_bps": 42e6}, {"streams": 10, "throughput_bps": 88e6}]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def served(request, service_factory):
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    _, client, app = service_factory(url=url, start_worker=False, model="auto", congestion_control="cubic",
                                     token="s3cret")
    return client, app.state.service


def view(service):
    with service.store.db.transaction() as tx:
        return tx.execute("SELECT DISTINCT fit_id, probed_at FROM current_advice WHERE src = ? AND dest = ?",
                          (SITE, DEST)).fetchall()


def test_a_late_run_with_older_probes_is_kept_as_history(served, clock):
    # The hunt (late_old_run.py): advice on probes 0 s old (54 streams) became 1 stream on probes 7200 s old, stale,
    # with a re-probe queued.
    client, service = served
    fresh = client.post("/v1/probe-runs", json={"dest": DEST, "probes": FRESH, "congestion_control": "cubic"},
                        headers=WRITE).json()
    assert fresh["current"] is True and fresh["history"] is None
    before = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3}).json()
    before_view, before_paths = view(service), client.get("/v1/paths").json()
    clock.advance(10)

    late = {"dest": DEST, "probes": OLD, "congestion_control": "cubic", "measured_ago_s": 7200.0}
    headers = {**WRITE, "Idempotency-Key": "spooled-run-1"}
    response = client.post("/v1/probe-runs", json=late, headers=headers)
    assert response.status_code == 201, response.text
    answer = response.json()
    assert answer["fitted"] is True and answer["current"] is False
    assert "history" in answer["history"] and "7190 s newer" in answer["history"]  # probed 7200 s before t0 + 10
    # Sent again under its key (its age grown), the first answer, nothing stored again.
    clock.advance(5)
    again = client.post("/v1/probe-runs", json={**late, "measured_ago_s": 7205.0}, headers=headers)
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json() == answer

    after = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.3}).json()
    assert (after["num_flows"], after["probed_at"], after["fitted_at"], after["stale"]) == (
        before["num_flows"], before["probed_at"], before["fitted_at"], False)
    assert view(service) == before_view
    assert client.get("/v1/paths").json() == before_paths | {"paths": [
        {**p, "age_s": p["age_s"] + 15} for p in before_paths["paths"]]}
    with service.store.db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM fits").fetchone()[0] == 2  # the late one kept, as history
        assert tx.execute("SELECT count(*) FROM probe_jobs WHERE status = 'queued'").fetchone()[0] == 0

    # An observation refits on the run with the newest probes, not on the late one.
    refit = client.post("/v1/observations", json={"dest": DEST, "streams": 4, "throughput_bps": 38e6,
                                                  "congestion_control": "cubic"}, headers=WRITE).json()
    assert refit["refit"] is True
    path = client.get("/v1/paths").json()["paths"][0]
    assert path["probed_at"] == before["probed_at"] and path["observations_used"] == 1


def test_a_late_run_closes_its_job_as_any_run(served, clock):
    client, service = served
    assert client.post("/v1/probe-runs", json={"dest": DEST, "probes": FRESH, "congestion_control": "cubic"},
                       headers=WRITE).status_code == 201
    dest = parse_destination(DEST)
    job, _ = service.store.enqueue_job(dest, [1, 10], 1.0, src=SITE, congestion_control="cubic")
    results = [ProbeResult(dest=DEST, streams=p["streams"], throughput_bps=p["throughput_bps"], duration_s=1.0,
                           omit_s=0.0, sender_bps=None) for p in OLD]
    run, error = service.ingest_run(dest, None, results, clock(), source="probe", job_id=job.id,
                                    congestion_control="cubic", measured_ago_s=3600.0)
    assert error is None and run.current is False and run.newer_probed_at == clock()
    assert service.store.job(job.id).status == "done" and service.store.job(job.id).probe_run_id == run.id
