"""Text an agent sends about a probe (a claim's failure error, a hand-back's lookup_error) is stored and shown to
others (GET /v1/probes/ID, `tame advise`, an operator's terminal): it is kept on one line, each character a terminal
acts on (ESC, CR, a newline, C1 controls, bidi overrides and isolates) as a visible escape, and the rest as sent.
Names a client gives (an agent's, a site's, a destination, a congestion control, an Idempotency-Key) are refused
(422 naming the field, nothing stored) when they hold such a character. Real HTTP, a real SQLite file and the
PostgreSQL fixture."""

import pytest

DEST = "127.0.0.1:5201"
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# Clears the screen, moves home, reverses what follows (Trojan Source), forges a second line, rewrites this one,
# and a C1 CSI (U+009B), a right-to-left isolate, a tag character; a backslash and non-ASCII text stay as sent.
HOSTILE = "refused\x1b[2J\x1b[H \u202eevil\u202c\nFAKE LINE\r\t\x9b31m \u2067x\u2069 \U000e0041 C:\\tmp é"
SHOWN = ("refused\\x1b[2J\\x1b[H \\u202eevil\\u202c\\nFAKE LINE\\r\\t\\x9b31m \\u2067x\\u2069 \\U000e0041 C:\\tmp é")
PROBES = [{"streams": 1, "throughput_bps": 1e6}, {"streams": 10, "throughput_bps": 5e6}]


def _claimed(service_factory, request, database):
    url = request.getfixturevalue("pg_url") if database == "postgres" else None
    base, client, app = service_factory(start_worker=False, url=url)
    assert client.put("/v1/sites/dtn2", json={"dests": [DEST], "owner": "agent-1"}).status_code == 200
    job = client.post("/v1/sites/dtn2/claims", json={"owner": "agent-1"}).json()["job"]["id"]
    return client, app.state.service.store, job


def _stored_errors(store):
    with store.db.transaction() as tx:
        return [row[0] for row in tx.execute("SELECT error FROM probe_jobs WHERE error IS NOT NULL").fetchall()]


@pytest.mark.parametrize("database", DATABASES)
@pytest.mark.parametrize("route, field, kept_as", [
    ("failure", "error", "attempt 1 failed: {}; re-queued"),
    ("release", "lookup_error", "not started: at agent-1: {}; re-queued, tried again in 5 s"),
], ids=["failure", "release"])
def test_an_agents_error_is_stored_on_one_line_with_its_control_characters_as_escapes(
        service_factory, request, database, route, field, kept_as):
    client, store, job = _claimed(service_factory, request, database)
    answer = client.post(f"/v1/sites/dtn2/claims/{job}/{route}", json={"owner": "agent-1", field: HOSTILE})
    assert answer.status_code == 200, answer.text
    (stored,) = _stored_errors(store)
    assert stored == kept_as.format(SHOWN) == answer.json()["error"]
    assert stored.isprintable()  # no control, format or separator character, a newline among them
    assert client.get(f"/v1/probes/{job}").json()["error"] == stored


def test_an_agents_error_is_stored_at_most_as_long_as_it_may_be_sent_however_many_escapes_it_makes(
        service_factory, request):
    # 1,000 ESC characters, the most an error may hold, escape to 4,000 characters: the first 1,000 are kept.
    client, store, job = _claimed(service_factory, request, "sqlite")
    answer = client.post(f"/v1/sites/dtn2/claims/{job}/failure", json={"owner": "agent-1", "error": "\x1b" * 1000})
    assert answer.status_code == 200, answer.text
    shown = "\\x1b" * 250
    assert _stored_errors(store) == [f"attempt 1 failed: {shown}; re-queued"]


def test_an_agents_error_of_printable_text_is_kept_as_sent(service_factory, request):
    client, store, job = _claimed(service_factory, request, "sqlite")
    said = "iperf3: unable to connect to server: Connection refused — 试试 \\x1b is text"
    answer = client.post(f"/v1/sites/dtn2/claims/{job}/failure", json={"owner": "agent-1", "error": said})
    assert answer.status_code == 200, answer.text
    assert _stored_errors(store) == [f"attempt 1 failed: {said}; re-queued"]


def _tables(store):
    with store.db.transaction() as tx:
        return [tx.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("destinations", "probe_jobs", "probe_runs", "request_keys", "sites")]


# Each name a client gives, with a control or bidi character in it, and the field the 422 names.
NAMES = [
    ("PUT", "/v1/sites/dtn2", {"dests": [DEST], "owner": "agent\u202e-2"}, {}, "owner"),
    ("POST", "/v1/sites/dtn2/claims", {"owner": "agent-1\x1b[2J"}, {}, "owner"),
    ("POST", "/v1/sites/dtn2/claims/{job}/failure", {"owner": "agent-1\x9b", "error": "x"}, {}, "owner"),
    ("PUT", "/v1/sites/dtn%1B3", {"dests": [DEST], "owner": "agent-1"}, {}, "site"),
    ("POST", "/v1/probes", {"dest": "127.0.0.1\u2066:5201"}, {}, "dest"),
    ("POST", "/v1/observations", {"dest": DEST, "streams": 1, "throughput_bps": 1e6, "congestion_control": "cubic\x1b"},
     {}, "congestion_control"),
    ("POST", "/v1/probe-runs", {"dest": DEST, "probes": PROBES}, {"Idempotency-Key": b"run-1\x9b"}, "Idempotency-Key"),
]


@pytest.mark.parametrize("method, path, body, headers, field", NAMES,
                         ids=["site-owner", "claim-owner", "failure-owner", "site", "dest", "control", "key"])
def test_a_name_holding_a_control_or_bidi_character_is_refused_naming_it_and_nothing_is_stored(
        service_factory, request, method, path, body, headers, field):
    client, store, job = _claimed(service_factory, request, "sqlite")
    before = _tables(store)
    answer = client.request(method, path.replace("{job}", job), json=body, headers=headers)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert field in detail and detail.isprintable(), detail
    assert _tables(store) == before
    assert client.get(f"/v1/probes/{job}").json()["status"] == "running"


def test_a_key_the_body_may_not_give_is_named_in_the_422_with_its_control_characters_escaped(service_factory):
    base, client, app = service_factory(start_worker=False)
    body = '{"dests": [], "owner": "agent-1", "\u202eevil\x9b2J": 1}'.encode()
    answer = client.put("/v1/sites/dtn2", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == "\\u202eevil\\x9b2J: Extra inputs are not permitted"
