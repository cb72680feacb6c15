"""A server without a probe worker (`tame serve --no-worker`, the agent probing) still prunes its store."""

from advisor.retention import Retention
from tests.api.conftest import rate, wait_for


def fit_count(app):
    with app.state.service.store.db.transaction() as tx:
        return tx.execute("SELECT count(*) FROM fits").fetchone()[0]


def test_a_server_without_a_worker_prunes_its_fits(service_factory):
    base, client, app = service_factory(driver=None, retention=Retention(keep_fits=2, interval_s=0.2))
    assert app.state.worker is None
    for scale in (1.0, 1.1, 1.2, 1.3, 1.4):
        pushed = client.post("/v1/probe-runs", json={"dest": "127.0.0.1", "probes": [
            {"streams": 1, "throughput_bps": rate(1) * scale}, {"streams": 10, "throughput_bps": rate(10) * scale}]})
        assert pushed.status_code == 201, pushed.text
    wait_for(lambda: fit_count(app) == 2, timeout_s=30, what="the pruner keeping the newest 2 fits")
    advice = client.get("/v1/advice", params={"dest": "127.0.0.1", "max_impact": 0.3})
    assert advice.status_code == 200
    assert advice.json()["probes"][0]["throughput_bps"] == rate(1) * 1.4  # the newest fit stays
