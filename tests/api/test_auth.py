import pytest

from tests.api.conftest import probe_and_wait

WRITE = {"Authorization": "Bearer s3cret"}


def test_writes_need_the_token_when_one_is_set(service_factory):
    base, client, app = service_factory(token="s3cret")
    assert client.post("/v1/probes", json={"dest": "127.0.0.1"}).status_code == 401
    wrong = client.post("/v1/probes", json={"dest": "127.0.0.1"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "TAME_TOKEN" in wrong.json()["detail"]
    assert wrong.headers["www-authenticate"] == "Bearer"
    assert client.post("/v1/observations", json={"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6}).status_code == 401
    probe_and_wait(client, headers=WRITE)
    # Reads stay open when no read token is configured.
    assert client.get("/v1/advice", params={"dest": "127.0.0.1", "max_impact": 0.1}).status_code == 200


def test_reads_need_a_token_when_a_read_token_is_set(service_factory):
    base, client, app = service_factory(token="s3cret", read_token="r3ad")
    assert client.get("/v1/paths").status_code == 401
    assert client.get("/v1/paths", headers={"Authorization": "Bearer r3ad"}).status_code == 200
    assert client.get("/v1/paths", headers=WRITE).status_code == 200
    assert client.get("/healthz").status_code == 200
    # The read token does not allow writes.
    assert client.post("/v1/probes", json={"dest": "127.0.0.1"}, headers={"Authorization": "Bearer r3ad"}).status_code == 401


@pytest.mark.parametrize("dest", ["192.0.2.1", "198.51.100.7:5201", "[2001:db8::1]:5201", "evil.test", "mixed.test"])
def test_probes_outside_the_allow_list_are_refused(service_factory, dest):
    base, client, app = service_factory(start_worker=False)
    response = client.post("/v1/probes", json={"dest": dest})
    assert response.status_code == 403, response.text
    assert "TAME_ALLOWED_DESTINATIONS" in response.json()["detail"]
    assert app.state.service.store.job_counts() == {}


@pytest.mark.parametrize("dest", ["127.0.0.1", "localhost:5202", "lo.test", "[::1]:5201"])
def test_probes_inside_the_allow_list_are_accepted(service_factory, dest):
    base, client, app = service_factory(start_worker=False)
    assert client.post("/v1/probes", json={"dest": dest}).status_code == 202


@pytest.mark.parametrize("body, words", [
    ({"dest": "no.such.host.test"}, "does not resolve"),
    ({"dest": "127.0.0.1", "levels": [4]}, "levels"),
    ({"dest": "127.0.0.1", "levels": [1, 1000]}, "levels"),
    ({"dest": "127.0.0.1", "duration_s": 0}, "duration_s"),
    ({"dest": "127.0.0.1:0"}, "port"),
    ({"dest": "-bad-.example"}, "host name"),
    ({"dest": "127.0.0.1", "unknown": 1}, "unknown"),
])
def test_bad_probe_requests_get_422(service_factory, body, words):
    base, client, app = service_factory(start_worker=False)
    response = client.post("/v1/probes", json=body)
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"]


def test_a_second_probe_of_a_destination_returns_the_active_one(service_factory):
    base, client, app = service_factory(start_worker=False)
    first = client.post("/v1/probes", json={"dest": "127.0.0.1"}).json()
    second = client.post("/v1/probes", json={"dest": "127.0.0.1:5201"}).json()
    assert first["created"] is True and second["created"] is False and second["id"] == first["id"]
    assert client.get("/v1/probes/nope").status_code == 404


def test_warm_advice_on_the_fast_path_still_needs_the_read_token(service_factory):
    from tests.api.conftest import rate

    base, client, app = service_factory(token="s3cret", read_token="r3ad", start_worker=False)
    run = {"dest": "127.0.0.1", "idle_rtt_s": 0.01,
           "probes": [{"streams": 1, "throughput_bps": rate(1)}, {"streams": 10, "throughput_bps": rate(10)}]}
    assert client.post("/v1/probe-runs", json=run, headers=WRITE).status_code == 201
    query = {"dest": "127.0.0.1:5201", "max_impact": 0.1}
    for _ in range(3):  # warm: answered from the cache by api/fastpath.py
        assert client.get("/v1/advice", params=query, headers={"Authorization": "Bearer r3ad"}).status_code == 200
    assert client.get("/v1/advice", params=query).status_code == 401
    assert client.get("/v1/advice", params=query, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/metrics").status_code == 401


def test_a_site_token_reads_as_the_read_token_does_and_a_wrong_token_is_401(service_factory):
    from tests.api.conftest import rate

    base, client, app = service_factory(token="s3cret", read_token="r3ad", site_tokens=(("site-a", "token-a"),),
                                        start_worker=False)
    site_a = {"Authorization": "Bearer token-a"}
    run = {"src": "site-a", "dest": "127.0.0.1", "idle_rtt_s": 0.01,
           "probes": [{"streams": 1, "throughput_bps": rate(1)}, {"streams": 10, "throughput_bps": rate(10)}]}
    assert client.post("/v1/probe-runs", json=run, headers=site_a).status_code == 201
    query = {"src": "site-a", "dest": "127.0.0.1:5201", "max_impact": 0.1}
    for _ in range(3):  # the first from the route, then warm: answered by api/fastpath.py
        assert client.get("/v1/advice", params=query, headers=site_a).status_code == 200
    # Reads are not limited to the token's site.
    assert client.get("/v1/links", headers=site_a).json()["links"][0]["src"] == "site-a"
    assert client.get("/v1/paths", params={"src": "other"}, headers=site_a).status_code == 200
    assert client.post("/v1/advice:batch", json=[{"dest": "127.0.0.1", "max_impact": 0.1}], headers=site_a
                       ).status_code == 200
    assert client.get("/metrics", headers=site_a).status_code == 200
    for wrong in ({"Authorization": "Bearer token-b"}, {"Authorization": "Bearer token-a2"}, {"Authorization": "token-a"}):
        assert client.get("/v1/advice", params=query, headers=wrong).status_code == 401
        refused = client.post("/v1/probe-runs", json=run, headers=wrong)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    # The read token still does not write, for any site.
    assert client.post("/v1/probe-runs", json=run, headers={"Authorization": "Bearer r3ad"}).status_code == 401
    assert client.put("/v1/sites/site-a", json={"dests": ["127.0.0.1"]},
                      headers={"Authorization": "Bearer r3ad"}).status_code == 401


def test_site_tokens_without_a_token_for_every_site_are_refused_at_the_boundary():
    from api.boundary import Boundary

    with pytest.raises(ValueError, match="writes open"):
        Boundary(None, token=None, read_token=None, caps={}, body_timeout_s=1.0, site_tokens=(("site-a", "t"),))


# -- the boundary's verdict is required: a write route never takes its absence for "a token for every site" ---------

def test_check_src_refuses_a_request_the_boundary_did_not_decide():
    from types import SimpleNamespace

    from starlette.datastructures import State

    from advisor.errors import WrongSite
    from api.boundary import TOKEN_SITE, check_src

    with pytest.raises(RuntimeError, match="api.boundary.Boundary"):
        check_src(SimpleNamespace(state=State()), "site-a")
    check_src(SimpleNamespace(state=State({TOKEN_SITE: None})), "site-b")  # TAME_TOKEN, or no token needed
    check_src(SimpleNamespace(state=State({TOKEN_SITE: "site-a"})), "site-a")
    with pytest.raises(WrongSite):
        check_src(SimpleNamespace(state=State({TOKEN_SITE: "site-a"})), "site-b")


@pytest.mark.parametrize("path, body", [
    ("/v1/probes", {"dest": "127.0.0.1"}),
    ("/v1/observations", {"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6}),
    ("/v1/probe-runs", {"dest": "127.0.0.1", "idle_rtt_s": 0.01,
                        "probes": [{"streams": 1, "throughput_bps": 1e6}, {"streams": 10, "throughput_bps": 2e6}]}),
])
def test_a_write_route_reached_without_the_boundary_writes_nothing(tmp_path, clock, path, body):
    from dataclasses import replace

    import httpx

    from advisor.allowlist import AllowList
    from advisor.settings import Settings
    from advisor.store import Store
    from api.app import create_app
    from api.boundary import Boundary
    from tests.api.conftest import live_server, resolver

    settings = replace(Settings(database_url=f"sqlite:///{tmp_path}/t.sqlite3", allowed=AllowList.parse("127.0.0.0/8")),
                       token="s3cret", site_tokens=(("site-a", "token-a-0123456789"),))
    store = Store.open(settings.database_url, clock=clock)
    try:
        app = create_app(settings, store, clock=clock, resolver=resolver)
        # An app assembled without its boundary (a refactor that drops or reorders it): nothing decided the token.
        app.user_middleware = [m for m in app.user_middleware if m.cls is not Boundary]
        with live_server(app) as base:
            # site-a's token writing for the service's own site: the boundary would let the route refuse it (403).
            response = httpx.post(base + path, json={**body, "src": settings.site},
                                  headers={"Authorization": "Bearer token-a-0123456789"}, timeout=30)
        assert response.status_code == 500, response.text
        with store.db.transaction() as tx:
            for table in ("probe_jobs", "observations", "probe_runs"):
                assert tx.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    finally:
        store.close()
