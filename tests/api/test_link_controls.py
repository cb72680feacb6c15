"""The congestion controls one link keeps results under (advisor.limits.MAX_LINK_CONTROLS) over HTTP, on a real
SQLite file and on PostgreSQL. A site's token could push a run or an observation under each of any number of made-up
names, each kept as a current fit, a refit window and an advice alternative (a hunt stored 3,000 on one link and one
advice read took 4.8 s). Past the cap a new control is refused (422, saying what to do) and nothing is stored; the
link's controls, and other links, go on as before."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from advisor.limits import MAX_LINK_CONTROLS
from tests.api.test_site_links import AS_A, DATABASES, PROBES, SITE_TOKENS, stored, url_for

DEST = "127.0.0.2:5201"
CONTROLS = [f"madeup{k}" for k in range(MAX_LINK_CONTROLS)]


def run(control, dest=DEST):
    return {"src": "site-a", "dest": dest, "probes": PROBES, "congestion_control": control}


def observation(control, dest=DEST):
    return {"src": "site-a", "dest": dest, "streams": 2, "throughput_bps": 2e6, "congestion_control": control}


@pytest.mark.parametrize("database", DATABASES)
def test_a_link_s_controls_past_the_cap_are_refused_and_nothing_is_stored(database, request, tmp_path,
                                                                           service_factory):
    base, client, app = service_factory(start_worker=False, url=url_for(database, request, tmp_path), **SITE_TOKENS)
    store = app.state.service.store
    for k, control in enumerate(CONTROLS):  # runs and observations both count
        write = client.post("/v1/probe-runs", json=run(control), headers=AS_A) if k % 2 else client.post(
            "/v1/observations", json=observation(control), headers=AS_A)
        assert write.status_code in (201, 202), write.text
    before = stored(store)

    for write in (client.post("/v1/probe-runs", json=run("onemore"), headers=AS_A),
                  client.post("/v1/observations", json=observation("onemore"), headers=AS_A)):
        assert write.status_code == 422, write.text
        detail = write.json()["detail"]
        assert f"holds results or probes under {MAX_LINK_CONTROLS} congestion controls" in detail, detail
        assert "'onemore' would be another, so nothing was stored" in detail and CONTROLS[0] in detail
    assert stored(store) == before

    # The link's own controls take every write, other links take new ones, and a read lists at most the cap.
    assert client.post("/v1/probe-runs", json=run(CONTROLS[0]), headers=AS_A).status_code == 201
    assert client.post("/v1/observations", json=observation("onemore", dest="127.0.0.3:5201"),
                       headers=AS_A).status_code == 202
    advice = client.get("/v1/advice", params={"src": "site-a", "dest": DEST, "max_impact": 0.0001,
                                              "cc": CONTROLS[1]}, headers=AS_A)
    assert advice.status_code == 200, advice.text
    assert len(advice.json().get("alternatives") or []) < MAX_LINK_CONTROLS


@pytest.mark.parametrize("database", DATABASES)
def test_new_controls_written_at_once_never_pass_the_cap(database, request, tmp_path, service_factory):
    base, client, app = service_factory(start_worker=False, url=url_for(database, request, tmp_path), **SITE_TOKENS)
    names = [f"racing{k}" for k in range(3 * MAX_LINK_CONTROLS)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda c: client.post("/v1/observations", json=observation(c), headers=AS_A)
                                .status_code, names))
    assert answers.count(202) == MAX_LINK_CONTROLS and set(answers) <= {202, 422, 503}, answers
    with app.state.service.store.db.transaction() as tx:
        held = tx.execute("SELECT count(DISTINCT congestion_control) FROM observations").fetchone()[0]
    assert held == MAX_LINK_CONTROLS


@pytest.mark.parametrize("database", DATABASES)
def test_the_migration_counts_the_controls_links_hold_already(database, request, tmp_path):
    # A store at schema 19 whose link holds runs under cubic and bbr, an observation under reno and one that did
    # not record its control: migration 0020 records the three, and the link has room for five more.
    import advisor.db

    everything = advisor.db.migrations()
    request.getfixturevalue("monkeypatch").setattr(advisor.db, "migrations",
                                                   lambda: {v: m for v, m in everything.items() if v <= 19})
    db = advisor.db.Database(url_for(database, request, tmp_path))
    try:
        db.migrate()
        with db.transaction(write=True) as tx:
            did = tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES ('site-a', ?, "
                             "'127.0.0.2', 5201, 1.0) RETURNING id", (DEST,)).fetchone()[0]
            for control in ("cubic", "bbr", "cubic", None):
                tx.execute("INSERT INTO probe_runs (destination_id, source, started_at, finished_at, probed_at, "
                           "congestion_control) VALUES (?, 'push', 1.0, 2.0, 2.0, ?)", (did, control))
            for control in ("reno", None):
                tx.execute("INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                           "congestion_control) VALUES (?, 2, 2e6, 3.0, ?)", (did, control))
        request.getfixturevalue("monkeypatch").setattr(advisor.db, "migrations", lambda: everything)
        assert 20 in db.migrate()
        with db.transaction() as tx:
            assert tx.execute("SELECT destination_id, congestion_control FROM link_controls ORDER BY 2").fetchall() \
                == [(did, "bbr"), (did, "cubic"), (did, "reno")]
    finally:
        db.close()


@pytest.mark.parametrize("database", DATABASES)
def test_a_probe_under_a_new_control_holds_its_place_and_one_past_the_cap_is_not_queued(database, request, tmp_path,
                                                                                      service_factory):
    # A probe is refused when its run would be: before, it was queued (202), claimed, run, and its run refused.
    base, client, app = service_factory(start_worker=False, url=url_for(database, request, tmp_path), **SITE_TOKENS)
    store = app.state.service.store
    assert client.put("/v1/sites/site-a", json={"dests": [], "owner": "agent-a"}, headers=AS_A).status_code == 200
    for control in CONTROLS[:-1]:
        assert client.post("/v1/observations", json=observation(control), headers=AS_A).status_code == 202
    queued = client.post("/v1/probes", json={"src": "site-a", "dest": DEST, "congestion_control": CONTROLS[-1]},
                         headers=AS_A)
    assert queued.status_code == 202, queued.text
    before = stored(store)
    # The queued probe holds the eighth place: a ninth control is refused, as a probe and as a result.
    for write in (client.post("/v1/probes", json={"src": "site-a", "dest": DEST, "congestion_control": "onemore"},
                              headers=AS_A),
                  client.post("/v1/observations", json=observation("onemore"), headers=AS_A)):
        assert write.status_code == 422 and "'onemore' would be another" in write.json()["detail"], write.text
    assert stored(store) == before
    # The probe's run is stored when it comes.
    claim = client.post("/v1/sites/site-a/claims", json={"owner": "agent-a"}, headers=AS_A).json()
    assert claim["job"]["id"] == queued.json()["id"], claim
    pushed = client.post("/v1/probe-runs", json={**run(CONTROLS[-1]), "job_id": claim["job"]["id"],
                                                 "owner": "agent-a"}, headers=AS_A)
    assert pushed.status_code == 201, pushed.text
