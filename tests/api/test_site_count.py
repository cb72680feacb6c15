"""The sites the store holds (TAME_MAX_SITES) over HTTP, on a real SQLite file and on PostgreSQL. Without TAME_TOKEN
any client may name a site, and each site brings its own TAME_MAX_SITE_LINKS links: a write that would make one
site more is refused (422, saying what to do) and nothing is stored; the sites the store has, and the service's own,
go on as before; and a site that holds nothing and is not registered again goes when the store is pruned."""

from dataclasses import replace

import pytest

from advisor.retention import Retention, prune
from tests.api.conftest import rate
from tests.sites import SITE

DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
CAP = 3
AGE_S = 2 * 3600.0
PROBES = [{"streams": n, "throughput_bps": rate(n)} for n in (1, 10)]


def observation(src, dest="127.0.0.1:5201"):
    return {"src": src, "dest": dest, "streams": 2, "throughput_bps": rate(2)}


def stored(store):
    with store.db.transaction() as tx:
        return {table: tx.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("sites", "destinations", "probe_jobs", "probe_runs", "observations")}


def assert_refused_for_the_cap(response, site):
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    for part in (f"keeps {CAP} sites", f"TAME_MAX_SITES={CAP}", f"{site} would be another", "nothing was stored",
                 "TAME_RUN_MAX_AGE_S", "TAME_TOKEN"):
        assert part in detail, detail


@pytest.mark.parametrize("database", DATABASES)
def test_a_new_site_past_the_cap_is_refused_until_an_idle_one_is_pruned(database, request, tmp_path, service_factory,
                                                                       clock):
    url = request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/tame.sqlite3"
    base, client, app = service_factory(start_worker=False, url=url, max_sites=CAP, ttl_s=AGE_S / 2)
    store = app.state.service.store
    # Three sites, each made by a different write: a registration, an observation, a pushed run.
    assert client.put("/v1/sites/site-a", json={"dests": []}).status_code == 200
    assert client.post("/v1/observations", json=observation("site-b")).status_code == 202
    pushed = client.post("/v1/probe-runs", json={"src": "site-c", "dest": "127.0.0.1:5201", "probes": PROBES})
    assert pushed.status_code == 201, pushed.text
    before = stored(store)

    # A fourth, by any write, is refused and leaves the store as it was (main's code made a site for each of a
    # thousand names a client gave in 1.6 s, each with its own 2,000 links, and never removed a registered one).
    assert_refused_for_the_cap(client.put("/v1/sites/site-d", json={"dests": ["127.0.0.1:5201"]}), "site-d")
    assert_refused_for_the_cap(client.post("/v1/observations", json=observation("site-d")), "site-d")
    assert_refused_for_the_cap(client.post("/v1/probe-runs", json={"src": "site-d", "dest": "127.0.0.1:5201",
                                                                   "probes": PROBES}), "site-d")
    assert stored(store) == before
    # The sites it has go on: a new link of one, a registration of another; and the service's own site is not counted.
    assert client.post("/v1/observations", json=observation("site-b", "127.0.0.2:5201")).status_code == 202
    assert client.put("/v1/sites/site-c", json={"dests": ["127.0.0.3:5201"]}).status_code == 200
    own = client.post("/v1/observations", json=observation(SITE))
    assert own.status_code == 202, own.text

    # Past TAME_RUN_MAX_AGE_S with nothing newer, pruning removes site-a's registration (no link) and site-b's
    # links, and with them both sites; site-c, registered again just now, stays.
    clock.advance(AGE_S + 1)
    assert client.put("/v1/sites/site-c", json={"dests": ["127.0.0.3:5201"]}).status_code == 200
    pruned = prune(store, replace(Retention(), run_max_age_s=AGE_S)).deleted
    assert pruned["sites"] == 1 and pruned["destinations"] >= 3, pruned
    assert [r[0] for r in stored(store)["sites"]] == ["site-c"]
    with store.db.transaction() as tx:
        assert tx.execute("SELECT src, dest FROM destinations").fetchall() == [("site-c", "127.0.0.3:5201")]
    assert client.put("/v1/sites/site-d", json={"dests": ["127.0.0.1:5201"]}).status_code == 200
    assert client.post("/v1/observations", json=observation("site-e")).status_code == 202
    assert_refused_for_the_cap(client.post("/v1/observations", json=observation("site-f")), "site-f")


def test_the_sites_the_operator_gave_tokens_are_neither_refused_nor_counted(service_factory):
    # TAME_SITE_TOKENS names the sites the operator runs agents at: the cap is for the sites clients name beyond
    # them. With TAME_MAX_SITES=1 and the main token's writes for two other sites, each token's site still registers
    # and writes, and counts against nothing.
    tokens = (("site-a", "token-a-0123456789"), ("site-b", "token-b-0123456789"))
    base, client, app = service_factory(start_worker=False, max_sites=1, token="main-token-0123456789",
                                        site_tokens=tokens)
    main = {"Authorization": "Bearer main-token-0123456789"}
    assert client.post("/v1/observations", json=observation("site-x"), headers=main).status_code == 202
    refused = client.post("/v1/observations", json=observation("site-y"), headers=main)
    assert refused.status_code == 422 and "keeps 1 sites" in refused.json()["detail"], refused.text
    for site, secret in tokens:
        registered = client.put(f"/v1/sites/{site}", json={"dests": ["127.0.0.1:5201"]},
                                headers={"Authorization": f"Bearer {secret}"})
        assert registered.status_code == 200 and registered.json()["links"] == 1, registered.text
    observed = client.post("/v1/observations", json=observation("site-a", "127.0.0.2:5201"),
                           headers={"Authorization": "Bearer token-a-0123456789"})
    assert observed.status_code == 202, observed.text
    # The token sites did not take the one place: site-x holds it, and site-y is still refused.
    assert client.post("/v1/observations", json=observation("site-y"), headers=main).status_code == 422
