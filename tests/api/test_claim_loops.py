"""A site's agent that claims and hands back probes in a loop, over HTTP on a real SQLite file and on PostgreSQL: each
attempt's seconds count in the site's hourly budget, and the rows keeping them stay a few a minute
(advisor.limits.SPENT_ATTEMPTS_BUCKET_S), however fast the loop runs."""

import pytest

from advisor.limits import BUDGET_WINDOW_S, SPENT_ATTEMPTS_BUCKET_S
from advisor.sites import LEASE_SLACK_S

DEST = "127.0.0.1:5201"
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def spent_rows(store, site):
    with store.db.transaction() as tx:
        return tx.execute("SELECT started_at, seconds FROM spent_attempts WHERE src = ? ORDER BY started_at",
                          (site,)).fetchall()


def claim_and_hand_back(client, clock, times, held_s):
    """Claim the site's probe and hand it back ``held_s`` later, ``times`` times; the last claim's answer."""
    for _ in range(times):
        claimed = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1", "max_streams": 64}).json()
        assert claimed["job"] is not None, claimed
        clock.advance(held_s)
        released = client.post(f"/v1/sites/dtn2/claims/{claimed['job']['id']}/release", json={"owner": "agent-1"})
        assert released.status_code == 200 and released.json()["status"] == "queued", released.text
    return claimed


@pytest.mark.parametrize("database", DATABASES)
def test_claims_handed_back_in_a_loop_keep_a_row_of_spent_seconds_a_minute_not_one_each(database, request, tmp_path,
                                                                                      service_factory, clock):
    url = request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/tame.sqlite3"
    base, client, app = service_factory(start_worker=False, url=url)
    store = app.state.service.store
    registration = {"dests": [DEST], "max_probes": 1, "max_streams": 64, "probe_seconds_per_hour": 3600}
    assert client.put("/v1/sites/dtn2", json=registration).status_code == 200
    # Start on a bucket's first second, so the 300 hand-backs 0.1 s apart (30 s) fall in one bucket.
    clock.advance(-clock() % SPENT_ATTEMPTS_BUCKET_S)
    claim_and_hand_back(client, clock, 300, 0.1)
    # Main's code kept a row per hand-back: 300 here, a million an hour for a client looping at 300 a second, each
    # read by every claim of the site as it sums its hour.
    [(started_at, seconds)] = spent_rows(store, "dtn2")
    assert seconds == pytest.approx(30.0)
    assert started_at == pytest.approx(clock() - 0.1)  # the latest start: no attempt leaves the hour early
    # Every second is still charged: the next claim's use counts them all.
    claimed = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1", "max_streams": 64}).json()
    # (the probe just claimed holds its plan's longest time: its lease less advisor.sites.LEASE_SLACK_S)
    assert claimed["use"]["probe_seconds"] == pytest.approx(30.0 + claimed["lease_s"] - LEASE_SLACK_S)
    clock.advance(1.0)
    client.post(f"/v1/sites/dtn2/claims/{claimed['job']['id']}/release", json={"owner": "agent-1"})
    assert sum(s for _, s in spent_rows(store, "dtn2")) == pytest.approx(31.0)
    # A loop through the whole hour, a hand-back every 30 s: one row a bucket.
    for _ in range(int(BUDGET_WINDOW_S // 30)):
        clock.advance(29.0)
        claim_and_hand_back(client, clock, 1, 1.0)
    rows = spent_rows(store, "dtn2")
    assert len(rows) <= BUDGET_WINDOW_S / SPENT_ATTEMPTS_BUCKET_S + 2, len(rows)
    assert sum(s for _, s in rows) == pytest.approx(31.0 + BUDGET_WINDOW_S // 30)
