"""The lookup-retry back-off (Store.defer_attempt, migration 0022) over HTTP: a job whose name lookup did not finish
waits 5 s, twice as long each time more, and fails the 12th time, for a name that never resolves in time."""

import pytest

DEST = "127.0.0.1:5201"


def claim(client):
    answer = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"})
    assert answer.status_code == 200, answer.text
    return answer.json()["job"]


def hand_back_slow(client, job):
    told = client.post(f"/v1/sites/dtn2/claims/{job['id']}/release",
                       json={"owner": "agent-1", "lookup_error": "dest host 'x' did not resolve within 5 s"})
    assert told.status_code == 200, told.text
    return told.json()


def test_a_lookup_that_finished_starts_the_back_off_again(service_factory, clock):
    # A job handed back for its lookup 11 times (a slow DNS for two hours) whose name then resolved, so its probe
    # ran and failed (nothing listened): the next slow lookup is the first of a new spell, a 5 s wait, not its 12th,
    # which failed the job as "never run: its name lookup did not finish as it was to start, 12 times".
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    for _ in range(11):
        job = claim(client)
        assert hand_back_slow(client, job)["status"] == "queued"
        clock.advance(3601)
    job = claim(client)
    ran = client.post(f"/v1/sites/dtn2/claims/{job['id']}/failure", json={"owner": "agent-1",
                                                                          "error": "connection refused"})
    assert ran.status_code == 200 and ran.json()["status"] == "queued", ran.text
    clock.advance(1)
    job = claim(client)
    back = hand_back_slow(client, job)
    assert back["status"] == "queued", back["error"]
    assert "tried again in 5 s" in back["error"], back["error"]


@pytest.mark.parametrize("body, says", [
    ({"owner": "agent-1", "lookup_error": ""}, "lookup_error"),
    ({"owner": "agent-1", "lookup_error": "x" * 1001}, "lookup_error"),
    ({"owner": "agent-1", "lookup_error": 5}, "lookup_error"),
    ({"owner": "agent-1", "lookup_error": True}, "lookup_error"),
    ({"owner": "agent-1", "lookup_error": ["slow"]}, "lookup_error"),
    ({"owner": "agent-1", "lookup_error": {"slow": 1}}, "lookup_error"),
    ({"owner": "agent-1", "lookup_error": "a\x00b"}, "lookup_error: the body holds a NUL"),
    ({"lookup_error": "slow"}, "owner"),
    ({"owner": "agent-1", "lookup_error": "slow", "retry_after_s": 0}, "retry_after_s"),
])
def test_a_bad_lookup_hand_back_is_refused_and_the_claim_kept(service_factory, body, says):
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = claim(client)
    told = client.post(f"/v1/sites/dtn2/claims/{job['id']}/release", json=body)
    assert told.status_code == 422 and says in told.json()["detail"], told.text
    after = client.get(f"/v1/probes/{job['id']}").json()
    assert (after["status"], after["error"]) == ("running", None)


def test_a_lookup_hand_back_counts_once_for_its_holder_alone(service_factory, clock):
    # Another site's path, another agent, the same hand-back sent again: 404, the job as it was; the one hand-back
    # makes one 5 s wait, and the claim says when the job is tried again.
    base, client, app = service_factory(start_worker=False)
    for site, dest in (("dtn2", DEST), ("dtn3", "127.0.0.2:5201")):
        assert client.put(f"/v1/sites/{site}", json={"dests": [dest], "owner": "agent-1"}).status_code == 200
    job = claim(client)
    body = {"owner": "agent-1", "lookup_error": "slow"}
    assert client.post(f"/v1/sites/dtn3/claims/{job['id']}/release", json=body).status_code == 404
    assert client.post(f"/v1/sites/dtn2/claims/{job['id']}/release",
                       json={**body, "owner": "agent-2"}).status_code == 404
    assert client.get(f"/v1/probes/{job['id']}").json()["status"] == "running"
    assert "tried again in 5 s" in hand_back_slow(client, job)["error"]
    assert client.post(f"/v1/sites/dtn2/claims/{job['id']}/release", json=body).status_code == 404
    waiting = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()
    assert waiting["job"] is None and "tried again in 5 s" in waiting["waiting"], waiting
    clock.advance(5)
    assert claim(client)["id"] == job["id"]


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_job_waiting_for_its_name_lookup_says_until_when_and_which_wait(service_factory, clock, request, tmp_path,
                                                                          database):
    # GET /v1/probes/ID said "queued" and nothing more: a job held back for its lookup looked like one no agent took.
    url = request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/tame.sqlite3"
    base, client, app = service_factory(start_worker=False, url=url)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = claim(client)
    assert (job["retry_at"], job["lookup_waits"]) == (None, 0)
    for waits, wait_s in ((1, 5), (2, 10)):
        back = hand_back_slow(client, job)
        shown = client.get(f"/v1/probes/{job['id']}").json()
        assert shown == back
        assert (shown["status"], shown["retry_at"], shown["lookup_waits"]) == ("queued", clock() + wait_s, waits)
        clock.advance(wait_s)
        # Its wait over, it waits no more, though it is not claimed yet.
        assert client.get(f"/v1/probes/{job['id']}").json()["retry_at"] is None
        job = claim(client)
        assert (job["status"], job["retry_at"], job["lookup_waits"]) == ("running", None, waits)
    for _ in range(10):  # the 12th wait fails it
        hand_back_slow(client, job)
        clock.advance(3600)
        job = claim(client) or client.get(f"/v1/probes/{job['id']}").json()
    assert (job["status"], job["retry_at"], job["lookup_waits"]) == ("failed", None, 12), job
