"""A JSON body with an object that gives one key twice is refused like any malformed body (422, the key named), by
every route that reads one, and nothing is stored: JSON parsers keep one of the two values, silently, so the
service would otherwise act on a value the sender may not have meant."""

import sqlite3

import pytest

DEST = "127.0.0.1:5201"
PROBES = '[{"streams": 1, "throughput_bps": 1e6}, {"streams": 10, "throughput_bps": 5e6}]'
OBSERVATION = f'"dest": "{DEST}", "streams": 4, "throughput_bps": 4e6'
# Each route: method, path, a body it takes, one giving a top-level key twice and one giving a key twice in an object
# inside (where the route's schema holds no object, in a value: the rule holds anywhere in the body), each with the
# key, and whether the body it takes stores something. {job} is a probe claimed by agent-1 of site dtn2.
ROUTES = [
    ("POST", "/v1/probes", f'{{"dest": "{DEST}"}}',
     (f'{{"dest": "{DEST}", "dest": "127.0.0.2:5201"}}', "dest"),
     (f'{{"dest": "{DEST}", "levels": [1, {{"streams": 1, "streams": 2}}]}}', "streams"), True),
    ("POST", "/v1/observations", f"{{{OBSERVATION}}}",
     (f'{{{OBSERVATION}, "streams": 8}}', "streams"),
     (f'{{{OBSERVATION}, "stream_bps": [{{"bps": 1, "bps": 2}}]}}', "bps"), True),
    ("POST", "/v1/probe-runs", f'{{"dest": "{DEST}", "probes": {PROBES}}}',
     (f'{{"dest": "{DEST}", "probes": {PROBES}, "dest": "127.0.0.2:5201"}}', "dest"),
     (f'{{"dest": "{DEST}", "probes": [{{"streams": 1, "throughput_bps": 1e6}}, '
      f'{{"streams": 10, "throughput_bps": 5e6, "throughput_bps": 5e9}}]}}', "throughput_bps"), True),
    ("POST", "/v1/advice:batch", f'[{{"dest": "{DEST}", "max_impact": 0.1}}]',
     (f'[{{"dest": "{DEST}", "max_impact": 0.1, "max_impact": 1}}]', "max_impact"),
     (f'[{{"dest": "{DEST}", "max_impact": 0.1, "cc": {{"name": "bbr", "name": "cubic"}}}}]', "name"), False),
    ("PUT", "/v1/sites/dtn3", f'{{"dests": ["{DEST}"], "max_probes": 1}}',
     (f'{{"dests": ["{DEST}"], "max_probes": 1, "max_probes": 2}}', "max_probes"),
     (f'{{"dests": [{{"dest": "{DEST}", "dest": "127.0.0.2"}}]}}', "dest"), True),
    ("POST", "/v1/sites/dtn2/claims", '{"owner": "agent-1", "holding": ["{job}"]}',
     ('{"owner": "agent-1", "holding": ["{job}"], "owner": "agent-2"}', "owner"),
     ('{"owner": "agent-1", "holding": [{"id": "{job}", "id": "x"}]}', "id"), True),
    ("POST", "/v1/sites/dtn2/claims/{job}/failure", '{"owner": "agent-1", "error": "refused"}',
     ('{"owner": "agent-1", "error": "refused", "owner": "agent-2"}', "owner"),
     ('{"owner": "agent-1", "error": {"why": "refused", "why": "reset"}}', "why"), True),
    ("POST", "/v1/sites/dtn2/claims/{job}/release", '{"owner": "agent-1"}',
     ('{"owner": "agent-1", "owner": "agent-2"}', "owner"),
     ('{"owner": {"name": "agent-1", "name": "agent-2"}}', "name"), True),
]
# An Idempotency-Key on every request: a refused body does not claim it either.
HEADERS = {"Content-Type": "application/json", "Idempotency-Key": "dup-keys-1"}


def stored(path):
    """Every row of every table of the SQLite file: a refused request changes none."""
    with sqlite3.connect(path) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: sorted(db.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr) for table in tables}


@pytest.fixture
def served(service_factory, tmp_path):
    """(client, a probe of dtn2 claimed by agent-1, the store's rows now)."""
    base, client, app = service_factory(start_worker=False)
    site = {"dests": [DEST], "max_probes": 1, "max_streams": 64, "probe_seconds_per_hour": 3600, "owner": "agent-1"}
    assert client.put("/v1/sites/dtn2", json=site).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]["id"]
    db = tmp_path / "tame.sqlite3"
    return client, job, db


def send(client, method, path, body, job):
    return client.request(method, path.replace("{job}", job), content=body.replace("{job}", job).encode(),
                          headers=HEADERS)


@pytest.mark.parametrize("method, path, good, top, nested, writes", ROUTES, ids=[r[1] for r in ROUTES])
def test_a_key_given_twice_is_refused_naming_it_and_nothing_is_stored(served, method, path, good, top, nested,
                                                                      writes):
    client, job, db = served
    before = stored(db)
    for body, key in (top, nested):
        response = send(client, method, path, body, job)
        assert response.status_code == 422, (body, response.text)
        assert response.json() == {"detail": f"the body gives {key!r} twice in one object; give each key once"}, body
        assert stored(db) == before, body
    # The route takes the body that gives each key once, and what it stores shows in the rows compared.
    response = send(client, method, path, good, job)
    assert response.status_code in (200, 201, 202), response.text
    assert (stored(db) != before) == writes


def test_a_key_given_twice_is_answered_as_a_body_that_is_not_json(served):
    client, job, db = served
    malformed = send(client, "POST", "/v1/observations", f'{{"dest": "{DEST}", ', job)
    twice = send(client, "POST", "/v1/observations", f'{{{OBSERVATION}, "dest": "127.0.0.2"}}', job)
    assert malformed.status_code == twice.status_code == 422
    assert list(malformed.json()) == list(twice.json()) == ["detail"]
    assert "not valid JSON" in malformed.json()["detail"], malformed.text


def test_a_key_given_twice_in_a_large_probe_run_is_refused(served):
    # The check runs on every object of a body at its largest: 16 probes, each with 128-stream lists.
    client, job, db = served
    streams = ", ".join(["1e6"] * 128)
    probe = f'{{"streams": 128, "throughput_bps": 1.28e8, "stream_bps": [{streams}], "raw": "{"x" * 100_000}"}}'
    probes = ", ".join([probe] * 15 + [probe[:-1] + ', "streams": 1}'])
    before = stored(db)
    response = send(client, "POST", "/v1/probe-runs", f'{{"dest": "{DEST}", "probes": [{probes}]}}', job)
    assert response.status_code == 422 and "'streams' twice" in response.json()["detail"], response.text
    assert stored(db) == before
