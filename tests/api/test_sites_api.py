"""Links and sites over HTTP: advice per (src, dest), an agent's site registration and claims, a claimed job closed
by its run, and bad or hostile input to each (clear error, right status, nothing stored)."""

import json
import sqlite3

import pytest

from advisor.site_desk import fresh_destinations
from advisor.sites import SiteBudget, site_use
from tests.api.conftest import rate
from tests.sites import SITE

DEST = "127.0.0.1:5201"
PROBES = [{"streams": n, "throughput_bps": rate(n)} for n in (1, 10)]


# The store each test of the operator's ceiling runs on.
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def database_url(database, request, tmp_path):
    return request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/tame.sqlite3"


def stored(store):
    """The sites, links and probe jobs a store holds, on either database."""
    with store.db.transaction() as tx:
        return [tx.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("sites", "destinations", "probe_jobs")]


def counts(db_path):
    with sqlite3.connect(db_path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("destinations", "sites", "probe_jobs", "probe_runs", "fits", "observations")}


def test_advice_is_per_link_and_the_default_src_is_the_service_s_site(service_factory, tmp_path):
    base, client, app = service_factory(start_worker=False)
    control = app.state.settings.congestion_control
    assert client.post("/v1/probe-runs", json={"dest": DEST, "probes": PROBES, "congestion_control": control}
                       ).json()["src"] == SITE
    slower = [{"streams": n, "throughput_bps": rate(n) / 3} for n in (1, 10)]
    assert client.post("/v1/probe-runs", json={"src": "dtn2.example", "dest": DEST, "probes": slower,
                                               "congestion_control": control}).json()["src"] == "dtn2.example"
    here = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.2}).json()
    there = client.get("/v1/advice", params={"src": "DTN2.example", "dest": DEST, "max_impact": 0.2}).json()
    assert here["src"] == SITE and there["src"] == "dtn2.example"
    assert there["max_nondisruptive_throughput_bps"] == pytest.approx(here["max_nondisruptive_throughput_bps"] / 3,
                                                                      rel=1e-6)
    # Batch: per item, or ?src= for the items that name none.
    batch = client.post("/v1/advice:batch", params={"src": "dtn2.example"},
                        json=[{"dest": DEST, "max_impact": 0.2}, {"dest": DEST, "max_impact": 0.2, "src": SITE}]).json()
    assert [r["advice"]["src"] for r in batch["results"]] == ["dtn2.example", SITE]
    # The schedulers' view gives each link's own num_flows, as the API does, for every budget.
    with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
        for budget in (0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9):
            for src in (SITE, "dtn2.example"):
                (flows,) = conn.execute("SELECT coalesce(max(streams), 1) FROM current_advice WHERE src = ? "
                                        "AND dest = ? AND congestion_control = ? AND impact_bound <= ?",
                                        (src, DEST, here["congestion_control"], budget)).fetchone()
                api = client.get("/v1/advice", params={"src": src, "dest": DEST, "max_impact": budget}).json()
                assert flows == api["num_flows"], (src, budget)
    links = client.get("/v1/links").json()
    assert links["site"] == SITE
    assert sorted((l["src"], l["dest"]) for l in links["links"]) == [("dtn2.example", DEST), (SITE, DEST)]
    assert [l["src"] for l in client.get("/v1/links", params={"src": "dtn2.example"}).json()["links"]] == ["dtn2.example"]
    unknown = client.get("/v1/advice", params={"src": "dtn3", "dest": DEST, "max_impact": 0.2})
    assert unknown.status_code == 404 and "from dtn3" in unknown.json()["detail"]
    # An observation lands on its own link.
    observed = client.post("/v1/observations", json={"src": "dtn2.example", "dest": DEST, "streams": 4,
                                                     "throughput_bps": rate(4) / 3})
    assert observed.status_code == 202 and observed.json()["src"] == "dtn2.example" and observed.json()["refit"]


def test_an_agent_registers_claims_and_its_run_closes_the_job(service_factory, tmp_path):
    base, client, app = service_factory()  # the local worker probes only the service's own site
    registration = {"dests": [DEST, "127.0.0.2"], "max_probes": 1, "max_streams": 32, "probe_seconds_per_hour": 3600}
    site = client.put("/v1/sites/dtn2", json=registration)
    assert site.status_code == 200, site.text
    assert site.json() == {"site": "dtn2", "links": 2, "queued": 2, "deferred": 0, "refused": [],
                           "budget": {"max_probes": 1, "max_streams": 32, "probe_seconds_per_hour": 3600.0}}
    # Registering again (each round of the agent) queues nothing new: the probes are queued already.
    assert client.put("/v1/sites/dtn2", json=registration).json()["queued"] == 0
    claim = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1", "max_streams": 64}).json()
    job = claim["job"]
    assert job["src"] == "dtn2" and job["dest"] in (DEST, "127.0.0.2:5201") and job["status"] == "running"
    other = ({DEST, "127.0.0.2:5201"} - {job["dest"]}).pop()
    # Lu's model adds no adaptive probe: the claim holds the job's highest level of the site's 32 streams.
    assert claim["max_streams"] == max(job["levels"]) and claim["use"] == {
        "probes": 1, "streams": max(job["levels"]), "probe_seconds": pytest.approx(claim["use"]["probe_seconds"])}
    second = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-2"}).json()
    assert second["job"] is None and "at most 1" in second["waiting"]
    # A run from an agent that does not hold the job is kept, and the job stays with its holder.
    stray = client.post("/v1/probe-runs", json={"src": "dtn2", "dest": job["dest"], "probes": PROBES, "job_id": job["id"],
                                                "owner": "agent-2"})
    assert stray.status_code == 201
    assert client.get(f"/v1/probes/{job['id']}").json()["status"] == "running"
    done = client.post("/v1/probe-runs", json={"src": "dtn2", "dest": job["dest"], "probes": PROBES, "job_id": job["id"],
                                               "owner": "agent-1"})
    assert done.status_code == 201 and done.json()["fitted"]
    assert client.get(f"/v1/probes/{job['id']}").json()["status"] == "done"
    assert client.get("/v1/advice", params={"src": "dtn2", "dest": job["dest"], "max_impact": 0.1}).status_code == 200
    assert client.post("/v1/sites/dtn2/claims", json={"owner": "agent-2"}).json()["job"]["dest"] == other


def test_a_claim_whose_answer_never_came_is_given_again_to_its_agent_alone(service_factory, clock):
    # The service commits a claim and its answer is lost: the agent's next claim names the probes it runs, and the
    # one it was given without knowing comes back with a fresh lease, before any other job and within the budget.
    base, client, app = service_factory(start_worker=False)
    registration = {"dests": [DEST, "127.0.0.2"], "max_probes": 2, "max_streams": 64, "probe_seconds_per_hour": 3600}
    assert client.put("/v1/sites/dtn2", json=registration).status_code == 200
    claims = "/v1/sites/dtn2/claims"
    lost = client.post(claims, json={"owner": "agent-1", "holding": []}).json()
    clock.advance(100.0)
    again = client.post(claims, json={"owner": "agent-1", "holding": []}).json()
    assert again["job"]["id"] == lost["job"]["id"] and again["job"]["attempts"] == 1
    assert again["lease_until"] == pytest.approx(lost["lease_until"] + 100.0) and again["max_streams"] == lost["max_streams"]
    assert again["use"]["probes"] == 1  # one probe, not a second job beside the forgotten one
    # The 100 s it sat claimed are charged, as a lapsed lease's would be: leaving a job out of holding (again and
    # again) never takes its time off the site's hour (a hunt kept one claim 3,690 s for 90 s charged).
    assert again["use"]["probe_seconds"] == pytest.approx(lost["use"]["probe_seconds"] + 100.0)
    # Another agent of the site, or the same one naming it, gets the next job instead.
    assert client.post(claims, json={"owner": "agent-2", "holding": []}).json()["job"]["id"] != lost["job"]["id"]
    assert client.post(claims, json={"owner": "agent-1", "holding": [lost["job"]["id"]]}).json()["job"] is None
    # An agent that does not say what it runs (older ones) is not given anything twice.
    assert client.post(claims, json={"owner": "agent-1"}).json()["job"] is None


def test_a_job_left_out_of_holding_again_and_again_is_not_given_past_the_site_s_hourly_budget(service_factory, clock):
    # A review's agent left its job out of `holding` just before each lease ended: the job came back with a fresh
    # lease 26 times in an hour, 3,678 probe-seconds against a 300 s/h budget. Now each round charges the seconds and
    # gives the job again only while the hour has room for its lease.
    base, client, app = service_factory(start_worker=False, default_duration_s=2.0, max_probe_duration_s=2.0)
    budget = 300
    registration = {"dests": [DEST], "max_probes": 1, "max_streams": 64, "probe_seconds_per_hour": budget}
    assert client.put("/v1/sites/dtn2", json=registration).status_code == 200, client.put(
        "/v1/sites/dtn2", json=registration).text
    claims = "/v1/sites/dtn2/claims"
    first = client.post(claims, json={"owner": "agent-1", "holding": []}).json()
    job, lease_s = first["job"]["id"], first["lease_s"]
    given = 0
    for _ in range(int(3600 // (lease_s - 1))):
        clock.advance(lease_s - 1)
        answer = client.post(claims, json={"owner": "agent-1", "holding": []}).json()
        if answer["job"] is None:
            break
        assert answer["job"]["id"] == job
        given += 1
        assert answer["use"]["probe_seconds"] <= budget, (given, answer["use"])
    assert answer["job"] is None and "probe-seconds this hour are spent" in answer["waiting"], answer
    assert given <= budget // (lease_s - 1)
    assert client.get(f"/v1/probes/{job}").json()["status"] == "queued"  # back in the queue, not lost


def test_a_claim_never_gives_a_probe_to_a_destination_the_service_no_longer_allows(service_factory, tmp_path):
    # Queued while port 22 was allowed; the operator then restarts the service with TAME_ALLOWED_PORTS=5201. A site's
    # agent checks only its own list (any port unless its operator set one): the service checks again at the claim.
    from advisor.allowlist import AllowList
    from advisor.site_desk import MAX_REFUSED_IN_A_CLAIM

    url = f"sqlite:///{tmp_path}/shared.sqlite3"
    _, before, _ = service_factory(start_worker=False, url=url, allowed=AllowList.parse("127.0.0.0/8"))
    dests = [f"127.0.0.{i}:22" for i in range(1, MAX_REFUSED_IN_A_CLAIM + 2)]
    registered = before.put("/v1/sites/dtn2", json={"dests": dests, "max_probes": 1})
    assert registered.status_code == 200 and registered.json()["queued"] == len(dests), registered.text
    _, after, _ = service_factory(start_worker=False, url=url, allowed=AllowList.parse("127.0.0.0/8", "5201"))
    claims = "/v1/sites/dtn2/claims"
    first = after.post(claims, json={"owner": "agent-1"}).json()
    assert first["job"] is None and "no longer allows" in first["waiting"], first
    assert first["use"] == {"probes": 0, "streams": 0, "probe_seconds": 0.0}
    second = after.post(claims, json={"owner": "agent-1"}).json()
    assert second["job"] is None and second["waiting"] == "no queued probe", second
    import sqlite3

    with sqlite3.connect(tmp_path / "shared.sqlite3") as db:
        jobs = db.execute("SELECT status, error FROM probe_jobs WHERE src = 'dtn2'").fetchall()
    assert len(jobs) == len(dests)
    for status, error in jobs:
        assert status == "failed" and "never run: probes to port 22 are not allowed" in error, (status, error)


def test_a_claimed_job_whose_name_does_not_resolve_now_is_a_failed_attempt_not_a_failed_claim(service_factory):
    # A review's resolver failed after registration: the claim answered 422 with the job already claimed, so the
    # job stayed running in an agent's name it never learnt, and tame agent --site stopped at the 422.
    from advisor.errors import InvalidRequest

    base, client, app = service_factory(start_worker=False)
    registered = client.put("/v1/sites/dtn2", json={"dests": ["lo.test:5201"], "max_probes": 2})
    assert registered.status_code == 200 and registered.json()["queued"] == 1, registered.text
    service = app.state.service
    attempts = service.settings.max_probe_attempts

    def dns_down(host):
        raise InvalidRequest(f"dest host {host!r} does not resolve: [Errno -3] Temporary failure in name resolution")

    service.resolver = dns_down
    for attempt in range(1, attempts + 1):
        answer = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1", "holding": []})
        assert answer.status_code == 200 and answer.json()["job"] is None, answer.text
        assert "could not start" in answer.json()["waiting"] and "does not resolve" in answer.json()["waiting"]
        with service.store.db.transaction() as tx:  # one attempt a claim, to the back of the queue
            [(status, owner, counted, error)] = tx.execute(
                "SELECT status, owner, attempts, error FROM probe_jobs WHERE src = 'dtn2'").fetchall()
        assert owner is None and counted == attempt and "Temporary failure in name resolution" in error
        assert status == ("failed" if attempt == attempts else "queued"), (attempt, status)


@pytest.mark.parametrize("method, path, body, status, says", [
    ("PUT", "/v1/sites/bad%20site", {"dests": [DEST]}, 422, "must name a site"),
    ("PUT", "/v1/sites/" + "a" * 65, {"dests": [DEST]}, 422, "at most 64"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "max_streams": 5}, 422, "give at least 10"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "probe_seconds_per_hour": 2}, 422, "give at least"),
    ("POST", "/v1/probes", {"dest": DEST, "src": "never-registered"}, 422, "not registered"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "max_probes": 0}, 422, "max_probes"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "max_streams": 100000}, 422, "max_streams"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "probe_seconds_per_hour": "lots"}, 422, "probe_seconds_per_hour"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST] * 2001}, 422, "dests"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "admin": True}, 422, "admin"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "congestion_control": "tame"}, 422, "fractional"),
    ("POST", "/v1/sites/nowhere/claims", {"owner": "a"}, 422, "not registered"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": ""}, 422, "owner"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "x" * 201}, 422, "owner"),
    ("POST", "/v1/probe-runs", {"dest": DEST, "probes": PROBES, "src": "a'; DROP TABLE fits;--"}, 422, "must name a site"),
    ("POST", "/v1/probe-runs", {"dest": DEST, "probes": PROBES, "job_id": "x"}, 422, "together"),
    ("POST", "/v1/observations", {"dest": DEST, "streams": 2, "throughput_bps": 1e6, "src": "-x"}, 422, "site"),
    ("POST", "/v1/probes", {"dest": DEST, "src": "é"}, 422, "site"),
    ("GET", "/v1/advice?dest=127.0.0.1&max_impact=0.1&src=a%00b", None, 422, "site"),
    ("GET", "/v1/links?src=" + "b" * 300, None, 422, "src"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "owner": "x" * 201}, 422, "owner"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "owner": ""}, 422, "owner"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "owner": 12}, 422, "owner"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "owner": ["agent-1"]}, 422, "owner"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "owner": "agent\x1b[2J"}, 422, "printable"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "owner": "agent\u202e1"}, 422, "printable"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "agent\n1"}, 422, "printable"),
    # Numbers are numbers: not true for 1, nor text, nor 2.0 for a whole number.
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "max_probes": True}, 422, "max_probes: Input should be a valid integer"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "max_probes": "2"}, 422, "max_probes"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "max_streams": 2.0}, 422, "max_streams"),
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "probe_seconds_per_hour": "900"}, 422, "probe_seconds_per_hour"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "a", "max_streams": True}, 422, "max_streams"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "a", "holding": "job-1"}, 422, "holding"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "a", "holding": [""]}, 422, "holding"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "a", "holding": ["x" * 65]}, 422, "holding"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "a", "holding": [str(i) for i in range(65)]}, 422, "holding"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "a", "holding": [1]}, 422, "holding"),
    ("POST", "/v1/observations", {"dest": DEST, "streams": True, "throughput_bps": 1e6}, 422, "streams"),
    ("POST", "/v1/probe-runs", {"dest": DEST, "probes": [{"streams": 1.0, "throughput_bps": 1e6}]}, 422, "streams"),
    ("POST", "/v1/probes", {"dest": DEST, "duration_s": "10"}, 422, "duration_s"),
])
def test_bad_site_input_is_refused_and_nothing_is_stored(service_factory, tmp_path, method, path, body, status, says):
    base, client, app = service_factory(start_worker=False)
    before = counts(tmp_path / "tame.sqlite3")
    response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert says in response.json()["detail"]
    assert counts(tmp_path / "tame.sqlite3") == before


def test_a_budget_short_of_the_plan_is_told_the_whole_seconds_that_fit(service_factory):
    # Lu's plan of levels 1 and 10 at 30.125 s (probes.plan.ProbePlan.worst_case_s): each probe runs 5 + 30.125 + 20 s,
    # then again at 60 s, 5 + 60 + 20; two probes, each twice (one idle retry); 20 s for the idle RTT:
    # 20 + 2 * 2 * (55.125 + 85) = 580.5 s, so 580 probe-seconds an hour are too few and 581 enough.
    base, client, app = service_factory(start_worker=False, default_duration_s=30.125)
    refused = client.put("/v1/sites/dtn2", json={"dests": [DEST], "probe_seconds_per_hour": 580})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == (
        "probe_seconds_per_hour 580 is below one probe plan's longest time, 580.5 s (TAME_PROBE_LEVELS, "
        "TAME_PROBE_DURATION_S, TAME_PROBE_MAX_DURATION_S, TAME_PROBE_OMIT_S, TAME_MODEL): give at least 581")
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "probe_seconds_per_hour": 581}).status_code == 200


def test_a_pushed_run_naming_a_bad_owner_is_refused_and_nothing_is_stored(service_factory, tmp_path):
    """POST /v1/probe-runs checks the agent's name as claims and registrations do (advisor.limits.check_owner): a
    bad or hostile owner is a 422 naming owner, and neither the run nor its fit is stored nor the claimed job closed;
    one server for every value, so that the test stays fast."""
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]
    run = {"src": "dtn2", "dest": job["dest"], "probes": PROBES, "job_id": job["id"]}
    before = counts(tmp_path / "tame.sqlite3"), stored(app.state.service.store)
    for owner, says in [
        ("", "owner must name the agent"), ("x" * 201, "owner: String should have at most 200 characters"),
        (12, "owner"), (["agent-1"], "owner"), ({"name": "agent-1"}, "owner"),
        ("agent-1\n", "printable"), ("agent-1\r\nX-Owner: agent-2", "printable"),
        ("agent-1\x00", "owner: the body holds a NUL"),  # refused as every string holding one is (api/bodies.py)
        ("agent\x1b[2J", "printable"), ("agent\u202e1", "printable"), ("agent\u200b1", "printable"),
        ("agent\udcff", "owner"),  # a lone surrogate, as an undecodable host name gives
    ]:
        # Sent as ASCII JSON: the surrogate's \udcff escape is valid JSON that httpx's UTF-8 encoder would refuse.
        response = client.post("/v1/probe-runs", content=json.dumps({**run, "owner": owner}),
                               headers={"Content-Type": "application/json"})
        assert response.status_code == 422, (owner, response.text)
        assert says in response.json()["detail"], (owner, response.text)
        assert (counts(tmp_path / "tame.sqlite3"), stored(app.state.service.store)) == before, owner
    assert client.get(f"/v1/probes/{job['id']}").json()["status"] == "running"
    # The claim's own owner still closes the job.
    done = client.post("/v1/probe-runs", json={**run, "owner": "agent-1"})
    assert done.status_code == 201 and client.get(f"/v1/probes/{job['id']}").json()["status"] == "done"


def test_site_routes_need_the_write_token(service_factory, tmp_path):
    base, client, app = service_factory(token="s3cret", start_worker=False)
    before = counts(tmp_path / "tame.sqlite3")
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST]}).status_code == 401
    assert client.post("/v1/sites/dtn2/claims", json={"owner": "a"}).status_code == 401
    assert counts(tmp_path / "tame.sqlite3") == before
    ok = client.put("/v1/sites/dtn2", json={"dests": [DEST]}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


def test_a_recent_transfer_keeps_its_link_fresh_so_no_probe_is_queued(service_factory, clock):
    """Probing that scales: an observation refits the link with its per-stream evidence, as a probe's would, and
    the link's freshness counts from it, so the site's registration queues no probe for it."""
    base, client, app = service_factory(start_worker=False, ttl_s=600.0)
    service = app.state.service
    assert client.post("/v1/probe-runs", json={"src": "dtn2", "dest": DEST, "probes": PROBES}).status_code == 201
    clock.advance(601)
    # (GET /v1/links reads without queueing the re-probe a stale GET /v1/advice would queue.)
    assert [l["stale"] for l in client.get("/v1/links", params={"src": "dtn2"}).json()["links"]] == [True]
    seen = []
    build_fit = service.build_fit
    service.build_fit = lambda points, *a, **k: seen.append(points) or build_fit(points, *a, **k)
    observed = client.post("/v1/observations", json={
        "src": "dtn2", "dest": DEST, "streams": 3, "throughput_bps": rate(3), "duration_s": 60,
        "stream_bps": [rate(3) / 3] * 3, "stream_retransmits": [4, 5, 6]})
    assert observed.status_code == 202 and observed.json()["refit"] is True
    transfer = seen[-1][-1]
    assert (transfer.streams, transfer.stream_retransmits, transfer.retransmits, transfer.duration_s) == (3, (4, 5, 6), 15, 60)
    advice = client.get("/v1/advice", params={"src": "dtn2", "dest": DEST, "max_impact": 0.1}).json()
    assert advice["stale"] is False and advice["age_s"] == 0 and advice["observations_used"] == 1
    assert [l["stale"] for l in client.get("/v1/links", params={"src": "dtn2"}).json()["links"]] == [False]
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST]}).json()["queued"] == 0
    clock.advance(0.8 * 600 + 1)  # due again before it goes stale
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST]}).json()["queued"] == 1


def test_transfers_keep_a_link_fresh_only_until_its_newest_probe_is_too_old(service_factory, clock):
    """A busy link is probed again once its newest probe is TAME_PROBE_MAX_AGE_S old, though transfers keep its
    advice fresh: /v1/paths says why, a site's registration queues the probe, and GET /v1/advice (also answered
    warm, from the fast path) serves the advice, not stale, and queues the local link's probe."""
    base, client, app = service_factory(start_worker=False, ttl_s=600.0, probe_max_age_s=1800.0)
    control = app.state.settings.congestion_control
    for src in (SITE, "dtn2"):
        assert client.post("/v1/probe-runs", json={"src": src, "dest": DEST, "probes": PROBES,
                                                   "congestion_control": control}).status_code == 201
    probed_at = clock()
    transfer = {"dest": DEST, "streams": 3, "throughput_bps": rate(3)}

    def observe_both():
        for src in (SITE, "dtn2"):
            assert client.post("/v1/observations", json={**transfer, "src": src}).json()["refit"] is True

    def advice():
        return client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.1}).json()

    def paths(src):
        return {p["dest"]: p for p in client.get("/v1/paths", params={"src": src}).json()["paths"]}

    for step in (600, 600, 599.8):  # a transfer every TTL or so, up to just before the bound: nothing is due
        clock.advance(step)
        observe_both()
        assert paths("dtn2")[DEST]["reprobe_due"] is None
        assert client.put("/v1/sites/dtn2", json={"dests": [DEST]}).json()["queued"] == 0
        assert advice()["stale"] is False
    assert app.state.service.store.job_counts() == {}
    # Read again just past the bound, within the cache's consistency bound: answered warm, from the fast path.
    clock.advance(0.4)
    assert clock() > probed_at + 1800
    warm = advice()
    assert warm["stale"] is False and warm["observations_used"] == 3
    assert app.state.service.store.active_job(DEST, control, src=SITE).status == "queued"
    here, there = paths(SITE)[DEST], paths("dtn2")[DEST]
    assert (here["stale"], here["reprobe_due"]) == (False, "probe_max_age")
    assert (there["stale"], there["reprobe_due"]) == (False, "probe_max_age")
    # What a pushing `tame agent` reads over HTTP says the same.
    assert DEST not in fresh_destinations(list(paths("dtn2").values()), control, control)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST]}).json()["queued"] == 1


def test_a_refused_destination_is_left_out_and_the_rest_registered(service_factory):
    base, client, app = service_factory(start_worker=False)
    answer = client.put("/v1/sites/dtn2", json={"dests": ["evil.test", DEST, "nowhere.test", "127.0.0.1:99999"]}).json()
    assert answer["links"] == 1 and answer["queued"] == 1
    assert [r["dest"] for r in answer["refused"]] == ["evil.test", "nowhere.test", "127.0.0.1:99999"]
    assert ["allow" in answer["refused"][0]["error"], "resolve" in answer["refused"][1]["error"],
            "port 99999" in answer["refused"][2]["error"]] == [True, True, True]
    claims = [client.post("/v1/sites/dtn2/claims", json={"owner": "a"}).json()["job"] for _ in range(2)]
    assert claims[0]["dest"] == DEST and claims[1] is None


def test_a_full_probe_queue_defers_the_rest_of_a_registration(service_factory):
    base, client, app = service_factory(start_worker=False, max_queued_probes=3)
    dests = [f"127.0.0.{i}:5201" for i in range(1, 6)]
    first = client.put("/v1/sites/dtn2", json={"dests": dests}).json()
    assert (first["links"], first["queued"], first["deferred"]) == (5, 3, 2)
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "a"}).json()["job"]
    client.post("/v1/probe-runs", json={"src": "dtn2", "dest": job["dest"], "probes": PROBES, "job_id": job["id"],
                                        "owner": "a"})
    again = client.put("/v1/sites/dtn2", json={"dests": dests}).json()
    assert (again["queued"], again["deferred"]) == (1, 1)


def test_one_site_cannot_fill_the_probe_queue_all_sites_share(service_factory):
    # The queue takes 20 jobs, each client or other site 5: a site registering 30 links (one host, many ports)
    # queues 5 and is told the rest wait; another site and the service's own probes still get in.
    base, client, app = service_factory(start_worker=False, max_queued_probes=20, max_queued_probes_per_client=5)
    flood = client.put("/v1/sites/site-a", json={"dests": [f"127.0.0.9:{p}" for p in range(1000, 1030)]}).json()
    assert (flood["links"], flood["queued"], flood["deferred"]) == (30, 5, 25)
    again = client.put("/v1/sites/site-a", json={"dests": [f"127.0.0.9:{p}" for p in range(1000, 1030)]}).json()
    assert (again["queued"], again["deferred"]) == (0, 25)
    asked = client.post("/v1/probes", json={"src": "site-a", "dest": "127.0.0.9:2000"})
    assert asked.status_code == 429 and "site site-a has 5 probes waiting" in asked.json()["detail"]
    assert client.put("/v1/sites/site-b", json={"dests": ["127.0.0.5:5201"]}).json()["queued"] == 1
    assert client.post("/v1/probes", json={"dest": "127.0.0.6:5201"}).status_code == 202
    with sqlite3.connect(app.state.service.store.db.url[len("sqlite:///"):]) as conn:
        counts = dict(conn.execute("SELECT src, count(*) FROM probe_jobs WHERE status = 'queued' GROUP BY src"))
    assert counts == {"site-a": 5, "site-b": 1, SITE: 1}


def test_sites_sharing_a_destination_take_turns_and_a_waiting_claim_says_why(service_factory, clock):
    base, client, app = service_factory(start_worker=False)
    for site in ("dtn2", "dtn3"):
        assert client.put(f"/v1/sites/{site}", json={"dests": [DEST]}).json()["queued"] == 1
        clock.advance(1)
    # dtn2's job was queued first: dtn3's waits for it, and says so.
    waiting = client.post("/v1/sites/dtn3/claims", json={"owner": "b"}).json()
    assert waiting["job"] is None and "1 queued probe(s) of dtn3 wait" in waiting["waiting"]
    first = client.post("/v1/sites/dtn2/claims", json={"owner": "a"}).json()["job"]
    assert first["dest"] == DEST
    # A destination being probed from one site waits for it at the other.
    assert client.post("/v1/sites/dtn3/claims", json={"owner": "b"}).json()["job"] is None
    client.post("/v1/probe-runs", json={"src": "dtn2", "dest": DEST, "probes": PROBES, "job_id": first["id"], "owner": "a"})
    assert client.post("/v1/sites/dtn3/claims", json={"owner": "b"}).json()["job"]["dest"] == DEST


def claimed_run(service_factory, asked, ran_under=None):
    """Site dtn2's agent claims its probe of DEST under control ``asked`` (the service's default: cubic) and pushes a
    run under ``ran_under`` (None: names none): (client, job, the push's response)."""
    base, client, app = service_factory(start_worker=False, congestion_control="cubic")
    client.put("/v1/sites/dtn2", json={"dests": [DEST], "congestion_control": asked})
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "a"}).json()["job"]
    assert job["congestion_control"] == asked
    body = {"src": "dtn2", "dest": DEST, "probes": PROBES, "job_id": job["id"], "owner": "a"}
    if ran_under is not None:
        body["congestion_control"] = ran_under
    return client, job, client.post("/v1/probe-runs", json=body)


def test_a_claimed_run_under_another_control_fails_its_job_and_is_kept_as_that_control_s(service_factory):
    client, job, pushed = claimed_run(service_factory, "cubic", "reno")
    ran = pushed.json()
    assert "asked to run under cubic but used reno" in ran["error"]
    status = client.get(f"/v1/probes/{job['id']}").json()
    assert status["status"] == "failed" and "reno" in status["error"]
    assert client.get("/v1/advice", params={"src": "dtn2", "dest": DEST, "max_impact": 0.1, "cc": "reno"}).status_code == 200


def test_alternatives_for_another_site_s_link_name_that_site(service_factory):
    """When one stream breaks the budget on a remote site's link, the probes it suggests are of that link."""
    base, client, app = service_factory(start_worker=False, congestion_control="bbr")
    client.put("/v1/sites/dtn2", json={"dests": [DEST]})
    # Two streams take nearly all: no budget below that is met at one stream.
    steep = [{"streams": n, "throughput_bps": 1e9 * n / (n + 0.05)} for n in (1, 10)]
    client.post("/v1/probe-runs", json={"src": "dtn2", "dest": DEST, "probes": steep, "congestion_control": "bbr"})
    advice = client.get("/v1/advice", params={"src": "dtn2", "dest": DEST, "max_impact": 0.01}).json()
    probes = [a for a in advice["alternatives"] if a["kind"] == "probe"]
    assert probes and all(a["request"]["body"]["src"] == "dtn2" and a["command"].endswith("--src dtn2")
                          for a in probes)
    for a in probes:  # the suggested request is one the service takes for that site
        assert client.post("/v1/probes", json=a["request"]["body"]).status_code == 202


# -- site tokens (TAME_SITE_TOKENS): each writes only links from its own site ------------------------------------

SITE_TOKENS = {"token": "s3cret", "site_tokens": (("site-a", "token-a"), ("site-b", "token-b"))}
AS_SITE_A = {"Authorization": "Bearer token-a"}


def test_a_site_token_registers_claims_and_pushes_for_its_own_site(service_factory, tmp_path):
    base, client, app = service_factory(start_worker=False, **SITE_TOKENS)
    # The path's site is canonicalised before it is compared: Site-A is site-a.
    site = client.put("/v1/sites/Site-A", json={"dests": [DEST]}, headers=AS_SITE_A)
    assert site.status_code == 200 and site.json()["site"] == "site-a" and site.json()["queued"] == 1, site.text
    claim = client.post("/v1/sites/site-a/claims", json={"owner": "agent-a"}, headers=AS_SITE_A).json()
    job = claim["job"]
    assert job["src"] == "site-a"
    ran = client.post("/v1/probe-runs", json={"src": "site-a", "dest": DEST, "probes": PROBES, "job_id": job["id"],
                                              "owner": "agent-a"}, headers=AS_SITE_A)
    assert ran.status_code == 201 and ran.json()["src"] == "site-a" and ran.json()["fitted"], ran.text
    observed = client.post("/v1/observations", json={"src": "SITE-A", "dest": DEST, "streams": 2,
                                                     "throughput_bps": rate(2)}, headers=AS_SITE_A)
    assert observed.status_code == 202 and observed.json()["src"] == "site-a", observed.text
    probe = client.post("/v1/probes", json={"src": "site-a", "dest": DEST}, headers=AS_SITE_A)
    assert probe.status_code == 202 and probe.json()["src"] == "site-a", probe.text
    with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
        assert conn.execute("SELECT name FROM sites").fetchall() == [("site-a",)]
        assert conn.execute("SELECT DISTINCT d.src FROM probe_runs r JOIN destinations d ON d.id = r.destination_id"
                            ).fetchall() == [("site-a",)]
        assert conn.execute("SELECT d.src, o.streams FROM observations o JOIN destinations d ON d.id = o.destination_id"
                            ).fetchall() == [("site-a", 2)]
        assert conn.execute("SELECT id, status FROM probe_jobs WHERE src = 'site-a' ORDER BY requested_at"
                            ).fetchall()[0] == (job["id"], "done")


@pytest.mark.parametrize("method, path, body, says", [
    ("PUT", "/v1/sites/site-b", {"dests": [DEST]}, "registers and claims only for site-a, not site-b; "
                                                   "use /v1/sites/site-a"),
    ("PUT", "/v1/sites/Site-B", {"dests": [DEST]}, "not site-b"),
    ("PUT", "/v1/sites/bad%20site", {"dests": [DEST]}, "not that name"),
    ("POST", "/v1/sites/site-b/claims", {"owner": "agent-a"}, "use /v1/sites/site-a"),
    ("POST", "/v1/sites/site-b/claims/0123abcd/failure", {"owner": "agent-a", "error": "x"}, "use /v1/sites/site-a"),
    ("POST", "/v1/sites/site-b/claims/0123abcd/release", {"owner": "agent-a"}, "use /v1/sites/site-a"),
    ("POST", "/v1/probe-runs", {"src": "site-b", "dest": DEST, "probes": PROBES},
     'it writes only links from site-a, not from site-b; give "src": "site-a"'),
    ("POST", "/v1/probe-runs", {"dest": DEST, "probes": PROBES}, 'the request names no src; give "src": "site-a"'),
    ("POST", "/v1/observations", {"src": "site-b", "dest": DEST, "streams": 2, "throughput_bps": 1e6}, "not from site-b"),
    ("POST", "/v1/observations", {"dest": DEST, "streams": 2, "throughput_bps": 1e6}, "names no src"),
    ("POST", "/v1/probes", {"src": "site-b", "dest": DEST}, "not from site-b"),
    ("POST", "/v1/probes", {"dest": DEST}, "names no src"),
])
def test_a_site_token_is_refused_for_another_site_s_links_and_nothing_is_stored(service_factory, tmp_path, method,
                                                                                 path, body, says):
    base, client, app = service_factory(start_worker=False, **SITE_TOKENS)
    # site-b is registered and has a claimable job: what site-a's token must not reach.
    assert client.put("/v1/sites/site-b", json={"dests": [DEST]}, headers={"Authorization": "Bearer token-b"}
                      ).status_code == 200
    before = counts(tmp_path / "tame.sqlite3")
    response = client.request(method, path, json=body, headers=AS_SITE_A)
    assert response.status_code == 403, response.text
    detail = response.json()["detail"]
    assert detail.startswith("this token is site-a's: ") and says in detail, detail
    assert counts(tmp_path / "tame.sqlite3") == before
    with sqlite3.connect(tmp_path / "tame.sqlite3") as conn:
        assert conn.execute("SELECT status, owner FROM probe_jobs").fetchall() == [("queued", None)]


def test_the_token_for_every_site_writes_for_any_site(service_factory):
    base, client, app = service_factory(start_worker=False, **SITE_TOKENS)
    every = {"Authorization": "Bearer s3cret"}
    for site in ("site-a", "site-b"):
        assert client.put(f"/v1/sites/{site}", json={"dests": [DEST]}, headers=every).status_code == 200
        job = client.post(f"/v1/sites/{site}/claims", json={"owner": "op"}, headers=every).json()["job"]
        assert client.post("/v1/probe-runs", json={"src": site, "dest": DEST, "probes": PROBES, "job_id": job["id"],
                                                   "owner": "op"}, headers=every).status_code == 201
    # Without src: the service's own site, as before.
    assert client.post("/v1/observations", json={"dest": DEST, "streams": 2, "throughput_bps": 1e6}, headers=every
                       ).json()["src"] == SITE


def test_a_site_keeps_the_budget_its_live_agents_run_with(service_factory, tmp_path, clock):
    """Two agents of one site with different budgets: the second is refused with 409 naming the budget in force and
    who set it, and nothing of its registration is stored; the same budget from any agent is taken; once the site's
    agents are quiet, a new budget is."""
    from advisor.sites import BUDGET_HOLD_S

    base, client, app = service_factory(start_worker=False)
    db = tmp_path / "tame.sqlite3"
    first = {"dests": [DEST], "max_probes": 1, "max_streams": 32, "probe_seconds_per_hour": 3600, "owner": "agent-1"}
    assert client.put("/v1/sites/dtn2", json=first).status_code == 200
    before = counts(db)
    other = {**first, "dests": ["127.0.0.2"], "max_probes": 2, "owner": "agent-2"}
    refused = client.put("/v1/sites/dtn2", json=other)
    assert refused.status_code == 409, refused.text
    detail = refused.json()["detail"]
    assert "max_probes=1, max_streams=32, probe_seconds_per_hour=3600" in detail and "'agent-1'" in detail
    assert "asked for max_probes=2" in detail and "same budget" in detail and "stop the other one" in detail
    assert counts(db) == before
    without_owner = {k: v for k, v in other.items() if k != "owner"}
    assert client.put("/v1/sites/dtn2", json=without_owner).status_code == 409
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max_probes, budget_set_by FROM sites").fetchall() == [(1, "agent-1")]
    # The same budget from another agent (or one without an owner, as agents before owners were sent) is fine.
    assert client.put("/v1/sites/dtn2", json={**first, "owner": "agent-2"}).status_code == 200
    assert client.put("/v1/sites/dtn2", json={k: v for k, v in first.items() if k != "owner"}).status_code == 200
    clock.advance(BUDGET_HOLD_S)
    taken = client.put("/v1/sites/dtn2", json=other)
    assert taken.status_code == 200 and taken.json()["budget"]["max_probes"] == 2
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max_probes, budget_set_by, budget_set_at FROM sites").fetchall() == [
            (2, "agent-2", clock())]
    # The old budget is now the one refused.
    assert "'agent-2'" in client.put("/v1/sites/dtn2", json=first).json()["detail"]


# -- the operator's ceiling on every site's budget (TAME_MAX_SITE_*) ---------------------------------------------

CEILING = SiteBudget(max_probes=2, max_streams=32, probe_seconds_per_hour=3600)
AT_CEILING = {"dests": [DEST], "max_probes": 2, "max_streams": 32, "probe_seconds_per_hour": 3600, "owner": "agent-1"}


@pytest.mark.parametrize("database", DATABASES)
def test_a_registration_above_the_operator_s_ceiling_is_refused_naming_it(database, request, tmp_path,
                                                                           service_factory):
    """A site's token holder cannot give its site more probing than the operator allows any site: 422 naming the
    field, the ceiling and the variable that sets it, and nothing stored, for a new site and a registered one (even
    from the agent that set its budget, which may otherwise change it)."""
    base, client, app = service_factory(start_worker=False, url=database_url(database, request, tmp_path),
                                        site_ceiling=CEILING)
    store = app.state.service.store
    taken = client.put("/v1/sites/dtn2", json=AT_CEILING)
    assert taken.status_code == 200 and taken.json()["budget"] == CEILING.to_json(), taken.text
    before = stored(store)
    for site in ("dtn2", "dtn3"):
        for asked, says in (
                ({"max_probes": 3}, ["max_probes 3 is above 2, the most this service gives any site "
                                     "(TAME_MAX_SITE_PROBES, set by its operator): give at most 2 "
                                     "(tame agent --max-probes)"]),
                ({"max_streams": 33}, ["max_streams 33 is above 32", "TAME_MAX_SITE_STREAMS", "--max-streams"]),
                ({"probe_seconds_per_hour": 3600.5}, ["probe_seconds_per_hour 3600.5 is above 3600",
                                                      "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR",
                                                      "--probe-seconds-per-hour"]),
                ({"max_probes": 64, "max_streams": 4096}, ["max_probes 64 is above 2",
                                                           "; max_streams 4096 is above 32"]),
        ):
            refused = client.put(f"/v1/sites/{site}", json={**AT_CEILING, "dests": ["127.0.0.2"], **asked})
            assert refused.status_code == 422, refused.text
            detail = refused.json()["detail"]
            assert all(part in detail for part in says), detail
    assert stored(store) == before


@pytest.mark.parametrize("database", DATABASES)
def test_a_lowered_ceiling_holds_a_site_registered_above_it(database, request, tmp_path, service_factory):
    """The operator lowers the ceiling (restarts the service with it; here a second server over the same store)
    after a site registered more: its claims are held to the ceiling and say so, its agent's next registration with
    the old budget is refused, and one within the ceiling is taken at once, though the site's agents look alive."""
    url = database_url(database, request, tmp_path)
    base, client, app = service_factory(start_worker=False, url=url)
    above = {**AT_CEILING, "dests": [DEST, "127.0.0.2", "127.0.0.3"], "max_probes": 3, "max_streams": 64}
    assert client.put("/v1/sites/dtn2", json=above).json()["queued"] == 3
    base, lowered, app = service_factory(start_worker=False, url=url, site_ceiling=CEILING)
    claim = lowered.post("/v1/sites/dtn2/claims", json={"owner": "agent-1", "max_streams": 64}).json()
    assert claim["job"] is not None and claim["budget"] == CEILING.to_json()
    second = lowered.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()
    assert second["job"] is not None and second["budget"] == CEILING.to_json()
    third = lowered.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()
    assert third["job"] is None and "2 probe(s) of dtn2 running, at most 2" in third["waiting"]
    refused = lowered.put("/v1/sites/dtn2", json=above)
    assert refused.status_code == 422 and "max_probes 3 is above 2" in refused.json()["detail"]
    restarted = lowered.put("/v1/sites/dtn2", json={**above, "max_probes": 2, "max_streams": 32, "owner": "agent-2"})
    assert restarted.status_code == 200, restarted.text
    assert restarted.json()["budget"] == CEILING.to_json()


@pytest.mark.parametrize("database", DATABASES)
def test_a_probe_a_site_s_budget_in_force_could_never_run_is_refused(database, request, tmp_path, service_factory):
    """POST /v1/probes for a site's link with a level above the site's budget held to the operator's ceiling: 422
    naming the limit and what sets it, and nothing queued (the site's claim would fail it at once)."""
    url = database_url(database, request, tmp_path)
    base, client, app = service_factory(start_worker=False, url=url)
    assert client.put("/v1/sites/dtn2", json={**AT_CEILING, "dests": [], "max_streams": 64}).status_code == 200
    base, lowered, app = service_factory(start_worker=False, url=url, site_ceiling=CEILING)
    before = stored(app.state.service.store)
    refused = lowered.post("/v1/probes", json={"dest": DEST, "src": "dtn2", "levels": [1, 48]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == (
        "this probe would never run: it needs 48 streams; site dtn2's budget in force allows 32 (the operator's "
        "TAME_MAX_SITE_STREAMS): request it with fewer streams or levels, or raise the budget")
    assert stored(app.state.service.store) == before
    accepted = lowered.post("/v1/probes", json={"dest": DEST, "src": "dtn2", "levels": [1, 32]})
    assert accepted.status_code == 202, accepted.text


def test_a_registration_counts_fits_that_recorded_no_control_for_the_default_control_only(service_factory):
    """A fit stored without its control answers the service's default control and no other (GET /v1/advice), so a
    registration under another control queues its link, as the advice under that control is missing."""
    base, client, app = service_factory(start_worker=False)
    default = app.state.settings.congestion_control
    other = next(c for c in ("reno", "cubic") if c != default)
    for site in ("dtn2", "dtn3"):
        assert client.post("/v1/probe-runs", json={"src": site, "dest": DEST, "probes": PROBES}).status_code == 201
    # The run recorded no control: as a store from before controls were kept.
    with sqlite3.connect(app.state.service.store.db.url[len("sqlite:///"):]) as conn:
        conn.execute("UPDATE fits SET congestion_control = NULL")
        conn.execute("UPDATE probe_runs SET congestion_control = NULL")
    app.state.service.drop_cache()
    advice = {"dest": DEST, "max_impact": 0.1}
    assert client.get("/v1/advice", params={**advice, "src": "dtn2"}).status_code == 200
    assert client.get("/v1/advice", params={**advice, "src": "dtn2", "cc": other}).status_code == 404
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "congestion_control": other}).json()["queued"] == 1
    assert client.put("/v1/sites/dtn3", json={"dests": [DEST], "congestion_control": default}).json()["queued"] == 0


def test_a_claimed_probe_its_agent_could_not_run_goes_behind_the_site_s_others_and_counts_what_it_took(
        service_factory, clock):
    """An agent whose probe fails at once (nothing listens there) reports it: the job queues again behind the site's
    other probes, the site's budget counts the seconds the attempt took (not its lease's worth), and after
    TAME_MAX_PROBE_ATTEMPTS attempts the job fails saying why. Only the agent holding the claim may report it."""
    base, client, app = service_factory(start_worker=False)
    dead, live = "127.0.0.9:5201", DEST
    assert client.put("/v1/sites/dtn2", json={"dests": [dead], "owner": "agent-1"}).status_code == 200
    clock.advance(1)
    assert client.put("/v1/sites/dtn2", json={"dests": [dead, live], "owner": "agent-1"}).status_code == 200
    attempts = app.state.settings.max_probe_attempts
    for attempt in range(1, attempts + 1):
        job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]
        assert job["dest"] == (dead if attempt == 1 else live if attempt == 2 else dead), (attempt, job)
        if job["dest"] == live:
            # The live link, behind the failed one, gets its turn; the failed one comes back after it.
            ran = client.post("/v1/probe-runs", json={"src": "dtn2", "dest": live, "probes": PROBES,
                                                      "job_id": job["id"], "owner": "agent-1"})
            assert ran.status_code == 201, ran.text
            job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]
        clock.advance(2)
        for who, status in (("agent-2", 404), ("agent-1", 200), ("agent-1", 404)):  # only its holder, once
            told = client.post(f"/v1/sites/dtn2/claims/{job['id']}/failure",
                               json={"owner": who, "error": "connection refused"})
            assert told.status_code == status, told.text
        assert told.json()["detail"].startswith("agent-1 of dtn2 holds no running probe")
    final = client.get(f"/v1/probes/{job['id']}").json()
    assert final["status"] == "failed" and f"failed {attempts} times" in final["error"]
    assert "connection refused" in final["error"]
    use = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["use"]
    assert use["probe_seconds"] == pytest.approx(2 * attempts)  # what the dead attempts took; the live probe none


def test_a_claimed_probe_handed_back_is_queued_at_once_and_counts_only_what_it_took(service_factory, clock):
    """POST /v1/sites/NAME/claims/ID/release (an agent stopping): the job is queued again now, its attempt not
    counted, the site's hour holds the 5 s it ran; only its holder may hand it back, and only once."""
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]
    clock.advance(5)
    for who, status in (("agent-2", 404), ("agent-1", 200), ("agent-1", 404)):
        told = client.post(f"/v1/sites/dtn2/claims/{job['id']}/release", json={"owner": who})
        assert told.status_code == status, told.text
    assert "holds no running probe" in told.json()["detail"]
    back = client.get(f"/v1/probes/{job['id']}").json()
    assert (back["status"], back["attempts"]) == ("queued", 0) and "handed back by agent-1" in back["error"]
    again = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-3"}).json()
    assert again["job"]["id"] == job["id"] and again["use"]["probe_seconds"] > 5  # 5 s spent + the new claim's
    assert client.post(f"/v1/sites/dtn2/claims/{job['id']}/release", json={"owner": "agent-3", "x": 1}
                       ).status_code == 422


@pytest.mark.parametrize("body", [{"owner": "agent-1"}, {"owner": "agent-1", "error": ""},
                                  {"owner": "agent-1", "error": "x" * 1001}, {"owner": "agent-1", "error": "x", "y": 1},
                                  {"owner": "", "error": "x"}, {"owner": "agent\n1", "error": "x"}])
def test_a_bad_failure_report_is_refused_and_the_claim_kept(service_factory, body):
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]
    told = client.post(f"/v1/sites/dtn2/claims/{job['id']}/failure", json=body)
    assert told.status_code == 422, told.text
    assert client.get(f"/v1/probes/{job['id']}").json()["status"] == "running"


def test_a_run_pushed_after_its_lease_lapsed_closes_the_job_back_in_the_queue(service_factory, clock):
    """The agent's run arrives late (its spool held it past the lease): no one holds the job, which is back in the
    queue, so the run closes it rather than leaving the link to be probed again; the site's hour counts the lapsed
    attempt once (its lease's worth, as spent_attempts keeps it)."""
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    claim = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()
    job = claim["job"]
    clock.now = claim["lease_until"] + 1
    assert app.state.service.store.recover_jobs(3, owner_is_dead=lambda owner: False) == 1
    assert client.get(f"/v1/probes/{job['id']}").json()["status"] == "queued"
    spent = site_use(app.state.service.store, "dtn2").seconds
    late = client.post("/v1/probe-runs", json={"src": "dtn2", "dest": DEST, "probes": PROBES, "job_id": job["id"],
                                               "owner": "agent-1"})
    assert late.status_code == 201 and late.json()["fitted"], late.text
    assert client.get(f"/v1/probes/{job['id']}").json()["status"] == "done"
    after = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-2"}).json()
    assert after["job"] is None and after["waiting"] == "no queued probe"
    assert after["use"]["probe_seconds"] == pytest.approx(spent)


def test_a_claimed_run_that_names_no_control_is_answered_under_its_job_s(service_factory):
    # A run pushed for a claim without "congestion_control" is kept under its job's control (the one it was asked to
    # run under), and its fit is that control's advice; the answer said null ("not recorded"), the body's field, so a
    # sender was told its run answers no control's queries when it answers its job's.
    client, job, ran = claimed_run(service_factory, "reno")
    assert ran.status_code == 201 and ran.json()["error"] is None, ran.text
    assert ran.json()["congestion_control"] == "reno" and ran.json()["current"] is True
    advice = client.get("/v1/advice", params={"src": "dtn2", "dest": DEST, "max_impact": 0.1, "cc": "reno"}).json()
    assert advice["congestion_control"] == "reno"
    paths = client.get("/v1/paths", params={"src": "dtn2"}).json()["paths"]
    assert [p["congestion_control"] for p in paths] == ["reno"]
    # Without a claim the run is kept as not recorded, and says so.
    unclaimed = client.post("/v1/probe-runs", json={"src": "dtn2", "dest": "127.0.0.2", "probes": PROBES}).json()
    assert unclaimed["congestion_control"] is None
