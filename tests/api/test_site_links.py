"""The links one site may have (TAME_MAX_SITE_LINKS) over HTTP, on a real SQLite file and on PostgreSQL: a site's
token writes for any destination within the allow-list, and each new one is a link with its own retention allowance,
so the number of links bounds the store per site. Past the cap a new link is refused (422, saying what to do) and
nothing is stored; the site's existing links, and other sites, go on as before."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import rate

DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SITE_TOKENS = {"token": "s3cret", "site_tokens": (("site-a", "token-a-0123456789"), ("site-b", "token-b-0123456789"))}
AS_A = {"Authorization": "Bearer token-a-0123456789"}
AS_B = {"Authorization": "Bearer token-b-0123456789"}
PROBES = [{"streams": n, "throughput_bps": rate(n), "raw": "x" * 1000} for n in (1, 10)]
CAP = 3
LINKS = [f"127.0.0.{i}:5201" for i in range(2, 2 + CAP)]
NEW = "127.0.0.20:5201"


def url_for(database, request, tmp_path):
    return request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/tame.sqlite3"


def capped_service(database, request, tmp_path, service_factory, cap=CAP):
    """(client, app, store) of a live server whose sites may have ``cap`` links, on ``database``."""
    base, client, app = service_factory(start_worker=False, url=url_for(database, request, tmp_path),
                                        max_site_links=cap, **SITE_TOKENS)
    return client, app, app.state.service.store


def stored(store):
    """Every row a write could add, per table (the sites row's last_seen_at left out: a registration refreshes it)."""
    with store.db.transaction() as tx:
        return {table: tx.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("destinations", "probe_jobs", "probe_runs", "probe_results", "fits", "observations")}


def links_of(store, src):
    with store.db.transaction() as tx:
        return sorted(r[0] for r in tx.execute("SELECT dest FROM destinations WHERE src = ?", (src,)).fetchall())


def observation(dest, src="site-a", streams=2):
    return {"src": src, "dest": dest, "streams": streams, "throughput_bps": rate(streams)}


def assert_refused_for_the_cap(response, dest=NEW):
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    for part in (f"site site-a has {CAP} links", f"TAME_MAX_SITE_LINKS={CAP}", f"{dest} would be another",
                 "Write for a link it has", "TAME_RUN_MAX_AGE_S", "never while TAME_RUN_MAX_AGE_S is 0",
                 "raise TAME_MAX_SITE_LINKS"):
        assert part in detail, detail


@pytest.mark.parametrize("database", DATABASES)
def test_a_site_s_writes_past_its_link_cap_are_refused_and_nothing_is_stored(database, request, tmp_path,
                                                                              service_factory):
    client, app, store = capped_service(database, request, tmp_path, service_factory)
    # Three links, each made by a different write: a registration, an observation, a pushed run.
    registered = client.put("/v1/sites/site-a", json={"dests": LINKS[:1], "owner": "agent-a"}, headers=AS_A)
    assert registered.status_code == 200 and registered.json()["refused"] == [], registered.text
    assert client.post("/v1/observations", json=observation(LINKS[1]), headers=AS_A).status_code == 202
    pushed = client.post("/v1/probe-runs", json={"src": "site-a", "dest": LINKS[2], "probes": PROBES}, headers=AS_A)
    assert pushed.status_code == 201 and pushed.json()["fitted"], pushed.text
    assert links_of(store, "site-a") == LINKS
    before = stored(store)

    # A fourth link, by any write, is refused and leaves the store as it was.
    assert_refused_for_the_cap(client.post("/v1/observations", json=observation(NEW), headers=AS_A))
    assert_refused_for_the_cap(client.post("/v1/probe-runs", json={"src": "site-a", "dest": NEW, "probes": PROBES},
                                           headers=AS_A))
    assert_refused_for_the_cap(client.post("/v1/probes", json={"src": "site-a", "dest": NEW}, headers=AS_A))
    # The same destination under another spelling is the same new link.
    assert_refused_for_the_cap(client.post("/v1/observations", json=observation("127.0.0.20"), headers=AS_A))
    assert stored(store) == before

    # A registration keeps its links that exist and leaves the new one out, saying why (as it does a destination
    # outside the allow-list); the agent goes on with the rest.
    again = client.put("/v1/sites/site-a", json={"dests": [*LINKS, NEW], "owner": "agent-a"}, headers=AS_A)
    assert again.status_code == 200, again.text
    assert again.json()["links"] == CAP
    [left_out] = again.json()["refused"]
    assert left_out["dest"] == NEW and f"TAME_MAX_SITE_LINKS={CAP}" in left_out["error"]
    assert links_of(store, "site-a") == LINKS
    with store.db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM probe_jobs WHERE dest = ?", (NEW,)).fetchone()[0] == 0

    # At the cap, the site's existing links take every write.
    assert client.post("/v1/observations", json=observation(LINKS[0], streams=3), headers=AS_A).status_code == 202
    assert client.post("/v1/probe-runs", json={"src": "site-a", "dest": LINKS[1], "probes": PROBES},
                       headers=AS_A).status_code == 201
    advice = client.get("/v1/advice", params={"src": "site-a", "dest": LINKS[2], "max_impact": 0.3}, headers=AS_A)
    assert advice.status_code == 200, advice.text

    # The cap is per site: site-b, and the operator's token for the service's own site, still make links.
    assert client.post("/v1/observations", json=observation(NEW, src="site-b"), headers=AS_B).status_code == 202
    assert client.post("/v1/observations", json={"dest": NEW, "streams": 2, "throughput_bps": 1e6},
                       headers={"Authorization": "Bearer s3cret"}).status_code == 202
    assert links_of(store, "site-a") == LINKS


@pytest.mark.parametrize("database", DATABASES)
def test_a_queued_probe_holds_its_link_s_place_so_its_run_is_never_refused(database, request, tmp_path,
                                                                             service_factory):
    client, app, store = capped_service(database, request, tmp_path, service_factory)
    # A registration makes the links and queues their probes; the runs that answer them are pushed later.
    assert client.put("/v1/sites/site-a", json={"dests": LINKS[:2], "owner": "agent-a"}, headers=AS_A
                      ).json()["queued"] == 2
    # A probe of a third destination is queued: no link row yet, but it counts.
    assert client.post("/v1/probes", json={"src": "site-a", "dest": LINKS[2]}, headers=AS_A).status_code == 202
    assert links_of(store, "site-a") == LINKS[:2]
    assert_refused_for_the_cap(client.post("/v1/observations", json=observation(NEW), headers=AS_A))
    # Its run, pushed when the agent has probed it, makes the third link.
    for _ in range(3):
        job = client.post("/v1/sites/site-a/claims", json={"owner": "agent-a"}, headers=AS_A).json()["job"]
        ran = client.post("/v1/probe-runs", json={"src": "site-a", "dest": job["dest"], "probes": PROBES,
                                                  "job_id": job["id"], "owner": "agent-a"}, headers=AS_A)
        assert ran.status_code == 201, ran.text
    assert links_of(store, "site-a") == LINKS


@pytest.mark.parametrize("database", DATABASES)
def test_links_that_hold_nothing_age_out_and_then_new_ones_are_accepted(database, request, tmp_path, service_factory,
                                                                         clock):
    from advisor.retention import prune

    client, app, store = capped_service(database, request, tmp_path, service_factory)
    retention = app.state.settings.retention
    # At the cap: a link with a fit, one with an observation only, one with a probe queued (a registration's).
    assert client.post("/v1/probe-runs", json={"src": "site-a", "dest": LINKS[0], "probes": PROBES},
                       headers=AS_A).json()["fitted"]
    assert client.post("/v1/observations", json=observation(LINKS[1]), headers=AS_A).status_code == 202
    assert client.put("/v1/sites/site-a", json={"dests": [LINKS[2]], "owner": "agent-a"}, headers=AS_A
                      ).json()["queued"] == 1
    advice = {"src": "site-a", "dest": LINKS[0], "max_impact": 0.3}
    before = client.get("/v1/advice", params=advice, headers=AS_A).json()
    assert_refused_for_the_cap(client.post("/v1/observations", json=observation(NEW), headers=AS_A))

    assert prune(store, retention).deleted["destinations"] == 0  # all written to within TAME_RUN_MAX_AGE_S
    clock.advance(retention.run_max_age_s + 1)
    # The fitted link is still read: its advice, stale now, queues a probe, and so it is in use.
    assert client.get("/v1/advice", params=advice, headers=AS_A).json()["stale"] is True
    assert prune(store, retention).deleted["destinations"] == 1
    # The observation-only link went; the fitted one and the one whose probe waits stay, the advice as it was.
    assert links_of(store, "site-a") == [LINKS[0], LINKS[2]]
    after = client.get("/v1/advice", params=advice, headers=AS_A).json()
    assert {k: v for k, v in after.items() if k not in ("age_s", "stale")} == \
           {k: v for k, v in before.items() if k not in ("age_s", "stale")}
    # The place it held takes a new link, and the cap holds again after it.
    assert client.post("/v1/observations", json=observation(NEW), headers=AS_A).status_code == 202
    assert_refused_for_the_cap(client.post("/v1/observations", json=observation(LINKS[1]), headers=AS_A),
                               dest=LINKS[1])


@pytest.mark.parametrize("database", DATABASES)
def test_a_write_to_a_link_being_pruned_is_kept(database, request, tmp_path, service_factory, clock):
    """Pruning removes links while writes to them arrive: every write acknowledged is in the store afterwards, each on
    a link (the one it found, kept for it, or the link made again), and none fails."""
    import threading
    from dataclasses import replace

    from advisor.retention import prune

    dests = [f"127.0.2.{i}:5201" for i in range(1, 121)]
    client, app, store = capped_service(database, request, tmp_path, service_factory, cap=len(dests))
    retention = replace(app.state.settings.retention, batch=4)
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda d: client.post("/v1/observations", json=observation(d), headers=AS_A).status_code,
                            dests)) == {202}
    clock.advance(retention.run_max_age_s + 1)
    pruning = threading.Thread(target=prune, args=(store, retention), kwargs={"max_batches": 1000})
    pruning.start()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda d: client.post("/v1/observations", json=observation(d, streams=3),
                                                      headers=AS_A), dests))
    pruning.join(60)
    assert [a.status_code for a in answers] == [202] * len(dests), [a.text for a in answers if a.status_code != 202]
    with store.db.transaction() as tx:
        kept = dict(tx.execute("SELECT o.id, d.dest FROM observations o JOIN destinations d ON d.id = o.destination_id "
                               "WHERE o.streams = 3").fetchall())
    assert {a.json()["id"]: a.json()["dest"] for a in answers} == kept


@pytest.mark.parametrize("database", DATABASES)
def test_concurrent_first_writes_make_no_more_links_than_the_cap(database, request, tmp_path, service_factory):
    # PostgreSQL runs the writes in parallel: the count and the insert are one step per site (an advisory lock).
    client, app, store = capped_service(database, request, tmp_path, service_factory)
    dests = [f"127.0.1.{i}:5201" for i in range(1, 13)]
    with ThreadPoolExecutor(len(dests)) as pool:
        statuses = list(pool.map(lambda dest: client.post("/v1/observations", json=observation(dest),
                                                          headers=AS_A).status_code, dests))
    assert sorted(statuses) == [202] * CAP + [422] * (len(dests) - CAP)
    made = links_of(store, "site-a")
    assert len(made) == CAP and set(made) == {d for d, s in zip(dests, statuses) if s == 202}


def test_the_link_cap_is_a_validated_setting():
    from advisor.errors import ConfigError
    from advisor.limits import MAX_SITE_LINKS
    from advisor.settings import Settings

    assert Settings.from_env({}).max_site_links == MAX_SITE_LINKS
    assert Settings.from_env({"TAME_MAX_SITE_LINKS": "5"}).max_site_links == 5
    for bad in ("0", "x", "1.5"):
        with pytest.raises(ConfigError, match="TAME_MAX_SITE_LINKS"):
            Settings.from_env({"TAME_MAX_SITE_LINKS": bad})
