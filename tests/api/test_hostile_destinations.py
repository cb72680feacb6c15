"""Destinations as an attacker spells them, over HTTP: one key per host, nothing stored for what is refused."""

import pytest

from tests.api.conftest import probe_and_wait


def stored_destinations(app):
    with app.state.service.store.db.transaction() as tx:
        return [row[0] for row in tx.execute("SELECT dest FROM destinations ORDER BY dest").fetchall()]


def queued_jobs(app):
    with app.state.service.store.db.transaction() as tx:
        return tx.execute("SELECT dest FROM probe_jobs").fetchall()


@pytest.mark.parametrize("alias", ["[::ffff:7f00:1]", "::ffff:127.0.0.1", "[::FFFF:7f00:1]:5201"])
def test_aliases_of_one_address_share_its_job(service_factory, alias):
    _, client, app = service_factory(start_worker=False)
    first = client.post("/v1/probes", json={"dest": "127.0.0.1"}).json()
    again = client.post("/v1/probes", json={"dest": alias})
    assert again.status_code == 202, again.text
    assert again.json()["id"] == first["id"] and again.json()["created"] is False
    assert len(queued_jobs(app)) == 1


@pytest.mark.parametrize("dest, words", [
    ("0x7f000001", "read it as 127.0.0.1"),
    ("0x7f.1", "read it as 127.0.0.1"),
    ("127.0.0.1.", "read it as 127.0.0.1"),
    ("[::ffff:7f00:1%anything]", "link-local"),
    ("[::ffff:7f00:1%a b]", "link-local"),
    ("[fe80::1%a\nb]", "not a network interface"),
    ("x\n.localhost", "not a valid host name"),
    ("127.0.0.1:\uff15\uff12\uff10\uff11", "must be a number"),
    ("127.0.0.1:\u00b2", "must be a number"),
    ("http://127.0.0.1:5201/", "looks like a URL"),
])
def test_aliasing_spellings_are_refused_and_nothing_is_queued(service_factory, dest, words):
    _, client, app = service_factory(start_worker=False)
    for path, body in (("/v1/probes", {"dest": dest}),
                       ("/v1/observations", {"dest": dest, "streams": 4, "throughput_bps": 2e7})):
        response = client.post(path, json=body)
        assert response.status_code == 422 and words in response.json()["detail"], response.text
        assert "invalid literal" not in response.text
    assert queued_jobs(app) == [] and stored_destinations(app) == []


def test_observations_outside_the_allow_list_become_no_advice(service_factory):
    _, client, app = service_factory()
    assert probe_and_wait(client)["status"] == "done"
    refused = client.post("/v1/observations", json={"dest": "192.0.2.1", "streams": 4, "throughput_bps": 2e10})
    assert refused.status_code == 403 and "TAME_ALLOWED_DESTINATIONS" in refused.json()["detail"]
    assert stored_destinations(app) == ["127.0.0.1:5201"]
    assert client.get("/v1/advice", params={"dest": "192.0.2.1", "max_impact": 0.1}).status_code == 404


def test_ports_outside_tame_allowed_ports_are_refused_and_nothing_is_stored(service_factory):
    """An allowed host's other services (ssh, a web server) are not probe targets: with TAME_ALLOWED_PORTS set, a
    probe, pushed run or observation for another port is refused (403 naming the variable) and nothing is stored."""
    from advisor.allowlist import AllowList

    _, client, app = service_factory(start_worker=False,
                                     allowed=AllowList.parse("127.0.0.0/8", "5201-5210,5300"))
    probes = [{"streams": n, "throughput_bps": 1e8 * n} for n in (1, 10)]
    for dest in ("127.0.0.1:22", "127.0.0.1:5211", "127.0.0.1:80", "localhost:443"):
        for path, body in (("/v1/probes", {"dest": dest}), ("/v1/probe-runs", {"dest": dest, "probes": probes}),
                           ("/v1/observations", {"dest": dest, "streams": 2, "throughput_bps": 1e8})):
            refused = client.post(path, json=body)
            assert refused.status_code == 403, (dest, path, refused.text)
            assert "TAME_ALLOWED_PORTS" in refused.json()["detail"] and "5201-5210,5300" in refused.json()["detail"]
    assert stored_destinations(app) == [] and queued_jobs(app) == []
    for dest in ("127.0.0.1:5201", "127.0.0.1:5210", "127.0.0.1:5300"):
        assert client.post("/v1/observations", json={"dest": dest, "streams": 2, "throughput_bps": 1e8}
                           ).status_code == 202
