"""One client cannot fill the probe queue: queued jobs are bounded per remote address as well as in total."""

import httpx


def queued_by_client(app):
    with app.state.service.store.db.transaction() as tx:
        return dict(tx.execute("SELECT client, count(*) FROM probe_jobs WHERE status = 'queued' "
                               "GROUP BY client").fetchall())


def test_a_client_gets_429_past_its_share_and_others_still_queue(service_factory):
    base, client, app = service_factory(start_worker=False, max_queued_probes_per_client=2)
    for n in (1, 2):
        assert client.post("/v1/probes", json={"dest": f"127.0.0.{n}"}).status_code == 202
    full = client.post("/v1/probes", json={"dest": "127.0.0.3"})
    assert full.status_code == 429 and "per client" in full.json()["detail"]
    assert int(full.headers["Retry-After"]) >= 1
    # Asking again for a destination already queued is not a new job: still answered.
    assert client.post("/v1/probes", json={"dest": "127.0.0.1"}).json()["created"] is False
    # Another client (another source address on loopback) has a share of its own.
    other = httpx.Client(base_url=base, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    try:
        assert other.post("/v1/probes", json={"dest": "127.0.0.3"}).status_code == 202
    finally:
        other.close()
    assert queued_by_client(app) == {"127.0.0.1": 2, "127.0.0.2": 1}
