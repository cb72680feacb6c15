"""A JSON body whose strings hold a NUL character (\\u0000) is refused as malformed (422, saying so), by every route,
and nothing is stored: PostgreSQL cannot store NUL in text, so a free-text field holding one (a claim's lookup_error
or failure error, a probe's raw output) was answered 503 "the advice store is unavailable", a status that tells an
agent to send it again, for ever, and an operator that the store is down."""

import pytest

DEST = "127.0.0.1:5201"
PROBES = [{"streams": 1, "throughput_bps": 1e6}, {"streams": 10, "throughput_bps": 5e6}]
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# Each route with a body that holds NUL in a string the schema takes as free text.
ROUTES = [
    ("/v1/sites/dtn2/claims/{job}/release", {"owner": "agent-1", "lookup_error": "a\x00b"}, "lookup_error"),
    ("/v1/sites/dtn2/claims/{job}/failure", {"owner": "agent-1", "error": "a\x00b"}, "error"),
    ("/v1/probe-runs", {"dest": DEST, "probes": [{**PROBES[0], "raw": "iperf3\x00"}, PROBES[1]]}, "probes[0].raw"),
    ("/v1/probe-runs", {"src": "dtn2", "dest": DEST, "probes": PROBES, "job_id": "{job}", "owner": "agent-1",
                        "congestion_control": "bbr", "\x00": 1}, "'\\x00'"),
]


def stored(store):
    with store.db.transaction() as tx:
        return [tx.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("probe_jobs", "probe_runs", "request_keys", "spent_attempts")]


@pytest.mark.parametrize("database", DATABASES)
@pytest.mark.parametrize("path, body, where", ROUTES, ids=["release", "failure", "raw", "key"])
def test_a_nul_character_in_a_string_is_refused_as_malformed_and_nothing_is_stored(service_factory, request, tmp_path,
                                                                                   database, path, body, where):
    url = request.getfixturevalue("pg_url") if database == "postgres" else None
    base, client, app = service_factory(start_worker=False, url=url)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]["id"]
    store = app.state.service.store
    before = stored(store)
    sent = {k: (v.replace("{job}", job) if isinstance(v, str) else v) for k, v in body.items()}
    response = client.post(path.replace("{job}", job), json=sent, headers={"Idempotency-Key": "nul-1"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"{where}: the body holds a NUL character"), response.text
    assert stored(store) == before
    assert client.get(f"/v1/probes/{job}").json()["status"] == "running"


def test_an_escaped_backslash_before_u0000_is_no_nul(service_factory):
    # The text \u0000 (a backslash, then u0000: "\\u0000" in JSON) is six characters, none of them NUL.
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]["id"]
    response = client.post(f"/v1/sites/dtn2/claims/{job}/failure", json={"owner": "agent-1", "error": "a\\u0000b"})
    assert response.status_code == 200, response.text
    assert "a\\u0000b" in client.get(f"/v1/probes/{job}").json()["error"]


def test_a_nul_in_a_body_sent_as_utf_16_is_refused_too(service_factory):
    # The parser reads UTF-16 (and UTF-32) bodies as well: their escape \u0000 is not the six bytes of UTF-8's.
    base, client, app = service_factory(start_worker=False)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]["id"]
    body = '{"owner": "agent-1", "lookup_error": "a\\u0000b"}'.encode("utf-16")
    response = client.post(f"/v1/sites/dtn2/claims/{job}/release", content=body,
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and "NUL" in response.json()["detail"], response.text
    assert client.get(f"/v1/probes/{job}").json()["status"] == "running"
