"""Writes sent again under their Idempotency-Key are stored once (advisor/idempotency.py), over HTTP on a real
SQLite file and on PostgreSQL: the repeat gets the first answer and stores nothing, at once from many threads as
well; a key sent with another body, and a malformed key, are refused (422) with nothing stored; keys are per site
and per kind of write; a key goes when retention prunes the record it names. The two clients that send again (the
agent's spool, `tame transfer`'s report) are tested through a relay that loses the server's answer after it
committed."""

import json
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from advisor.destinations import parse_destination
from advisor.idempotency import MAX_KEY_LENGTH
from advisor.observations import Observation
from tests.api.conftest import rate
from tests.api.dropping_proxy import DroppingProxy

DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
DEST = "127.0.0.2:5201"
RUN = {"dest": DEST, "probes": [{"streams": n, "throughput_bps": rate(n)} for n in (1, 4, 10)]}
OBSERVATION = {"dest": DEST, "streams": 3, "throughput_bps": rate(3)}
SITE_TOKENS = {"site_tokens": (("site-a", "token-a-0123456789"), ("site-b", "token-b-0123456789")),
               "token": "s3cret"}
AS_A = {"Authorization": "Bearer token-a-0123456789"}
AS_B = {"Authorization": "Bearer token-b-0123456789"}
TABLES = ("destinations", "probe_runs", "probe_results", "fits", "curve_points", "observations", "request_keys")


def make(database, request, tmp_path, service_factory, **settings):
    url = request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/tame.sqlite3"
    return service_factory(start_worker=False, url=url, **settings)


def counts(app) -> dict[str, int]:
    with app.state.service.store.db.transaction() as tx:
        return {t: tx.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def keyed(key, headers=None):
    return {"Idempotency-Key": key, **(headers or {})}


@pytest.mark.parametrize("database", DATABASES)
@pytest.mark.parametrize("route, body, status", [("/v1/probe-runs", RUN, 201),
                                                 ("/v1/observations", OBSERVATION, 202)])
def test_a_write_sent_again_under_its_key_is_stored_once(database, route, body, status, request, tmp_path,
                                                         service_factory):
    base, client, app = make(database, request, tmp_path, service_factory)
    key = str(uuid.uuid4())
    first = client.post(route, json=body, headers=keyed(key))
    assert first.status_code == status, first.text
    assert "idempotent-replayed" not in first.headers
    stored = counts(app)
    again = client.post(route, json=body, headers=keyed(key))
    assert again.status_code == status, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    # As a structured-field string (quoted), the same key.
    quoted = client.post(route, json=body, headers=keyed(f'"{key}"'))
    assert quoted.json() == first.json() and quoted.headers["idempotent-replayed"] == "true"
    assert counts(app) == stored
    # Without a key, or under another, the same body is another write.
    assert client.post(route, json=body).status_code == status
    assert client.post(route, json=body, headers=keyed(str(uuid.uuid4()))).json() != first.json()
    grown = counts(app)
    table = "probe_runs" if route == "/v1/probe-runs" else "observations"
    assert grown[table] == stored[table] + 2 and grown["request_keys"] == stored["request_keys"] + 1


@pytest.mark.parametrize("database", DATABASES)
def test_a_re_sent_run_whose_age_grew_is_the_same_run_and_another_body_under_its_key_is_refused(
        database, request, tmp_path, service_factory):
    base, client, app = make(database, request, tmp_path, service_factory)
    key = uuid.uuid4().hex
    first = client.post("/v1/probe-runs", json=RUN, headers=keyed(key))
    assert first.status_code == 201, first.text
    stored = counts(app)
    # The agent's spool sends a run again with its age since the probes: still the same request.
    later = client.post("/v1/probe-runs", json={**RUN, "measured_ago_s": 600.0}, headers=keyed(key))
    assert later.status_code == 201 and later.json() == first.json()
    for other in ({**RUN, "probes": RUN["probes"][:2]}, {**RUN, "dest": "127.0.0.3:5201"},
                  {**RUN, "congestion_control": "reno"}):
        refused = client.post("/v1/probe-runs", json=other, headers=keyed(key))
        assert refused.status_code == 422, refused.text
        assert "Idempotency-Key was sent with another probe-run" in refused.json()["detail"]
    # The key names a probe run: an observation under it is a write of its own.
    assert client.post("/v1/observations", json=OBSERVATION, headers=keyed(key)).status_code == 202
    after = counts(app)
    assert after["probe_runs"] == stored["probe_runs"] and after["observations"] == stored["observations"] + 1


@pytest.mark.parametrize("database", DATABASES)
def test_one_key_sent_at_once_from_many_threads_stores_one_write(database, request, tmp_path, service_factory):
    base, client, app = make(database, request, tmp_path, service_factory)
    key = uuid.uuid4().hex
    before = counts(app)

    def send(_):
        response = client.post("/v1/probe-runs", json=RUN, headers=keyed(key))
        return response.status_code, response.json()["probe_run_id"], response.headers.get("idempotent-replayed")

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(send, range(24)))
    assert {a[0] for a in answers} == {201} and len({a[1] for a in answers}) == 1, answers
    assert [a[2] for a in answers].count(None) == 1  # one stored it, every other was answered from it
    after = counts(app)
    assert after["probe_runs"] == before["probe_runs"] + 1 and after["request_keys"] == before["request_keys"] + 1


@pytest.mark.parametrize("database", DATABASES)
def test_keys_are_per_site(database, request, tmp_path, service_factory):
    base, client, app = make(database, request, tmp_path, service_factory, **SITE_TOKENS)
    key = uuid.uuid4().hex
    a = client.post("/v1/probe-runs", json={**RUN, "src": "site-a"}, headers=keyed(key, AS_A))
    b = client.post("/v1/probe-runs", json={**RUN, "src": "site-b"}, headers=keyed(key, AS_B))
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    assert a.json()["probe_run_id"] != b.json()["probe_run_id"] and "idempotent-replayed" not in b.headers
    # Site b cannot learn or replay site a's write by its key: its token writes for site-b only.
    assert client.post("/v1/probe-runs", json={**RUN, "src": "site-a"}, headers=keyed(key, AS_B)).status_code == 403


@pytest.mark.parametrize("key", ["", " ", "a b", "x" * (MAX_KEY_LENGTH + 1), "ключ", "a;b", '"', '""', "a\tb",
                                 "key'); DROP TABLE request_keys;--"])
def test_a_malformed_key_is_refused_and_nothing_stored(key, tmp_path, service_factory):
    base, client, app = service_factory(start_worker=False)
    before = counts(app)
    for route, body in (("/v1/probe-runs", RUN), ("/v1/observations", OBSERVATION)):
        status, answer = raw_post(base, route, body, key.encode("utf-8"))
        assert status == 422, (key, answer)
        assert "Idempotency-Key must be" in json.loads(answer)["detail"]
    assert counts(app) == before


def raw_post(base, route, body, key: bytes) -> tuple[int, str]:
    """POST ``body`` with the header bytes as given (httpx refuses some that a hostile client can send)."""
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n").encode() + b"Idempotency-Key: " + key
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"\r\n\r\n" + payload)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2].decode()


def test_the_longest_key_is_taken(tmp_path, service_factory):
    base, client, app = service_factory(start_worker=False)
    key = "A-z0._:~+/=" + "9" * (MAX_KEY_LENGTH - 11)
    assert client.post("/v1/observations", json=OBSERVATION, headers=keyed(key)).status_code == 202
    assert client.post("/v1/observations", json=OBSERVATION,
                       headers=keyed(key)).headers["idempotent-replayed"] == "true"


@pytest.mark.parametrize("database", DATABASES)
def test_a_key_goes_when_its_record_is_pruned(database, request, tmp_path, service_factory, clock):
    """Keys are bounded as the records are: a client writing under ever new keys grows the keys no faster than the
    runs and observations retention keeps."""
    from advisor.retention import Retention, prune

    retention = Retention(keep_fits=1, keep_runs=1, run_max_age_s=3 * 86400.0)
    base, client, app = make(database, request, tmp_path, service_factory, retention=retention)
    store = app.state.service.store
    keys = [uuid.uuid4().hex for _ in range(3)]
    first = [client.post("/v1/probe-runs", json=RUN, headers=keyed(k)).json() for k in keys]
    assert prune(store, retention).deleted["request_keys"] == 2  # the two older runs went, and their keys
    assert counts(app)["probe_runs"] == counts(app)["request_keys"] == 1
    newest = client.post("/v1/probe-runs", json=RUN, headers=keyed(keys[2]))
    assert newest.headers["idempotent-replayed"] == "true" and newest.json() == first[2]
    # A write sent again after its record went is another write.
    again = client.post("/v1/probe-runs", json=RUN, headers=keyed(keys[0]))
    assert again.status_code == 201 and "idempotent-replayed" not in again.headers
    # A link that ages out takes its records' keys with it.
    clock.advance(retention.run_max_age_s + 60)
    counted = prune(store, retention)
    assert counted.deleted["destinations"] == 1 and counts(app)["request_keys"] == 0


@pytest.mark.parametrize("database", DATABASES)
def test_an_equivalent_body_is_the_same_request(database, request, tmp_path, service_factory):
    """src left out or naming the site it resolves to, and a field written out at its default, do not change the
    request a key names."""
    base, client, app = make(database, request, tmp_path, service_factory)
    own = app.state.settings.site
    for route, body in (("/v1/probe-runs", RUN), ("/v1/observations", OBSERVATION)):
        key = uuid.uuid4().hex
        first = client.post(route, json=body, headers=keyed(key)).json()
        for same in ({**body, "src": own}, {**body, "congestion_control": None}, {**body, "src": None}):
            again = client.post(route, json=same, headers=keyed(key))
            assert again.headers.get("idempotent-replayed") == "true" and again.json() == first, (same, again.text)


def test_a_transfer_s_report_whose_answer_was_lost_is_sent_again_and_stored_once(tmp_path, service_factory,
                                                                                 monkeypatch):
    from advisor.commands import transfer

    monkeypatch.setattr(transfer, "OBSERVATION_RETRY_DELAYS_S", (0.1, 0.1))
    base, client, app = service_factory(start_worker=False)
    port = int(base.rsplit(":", 1)[1])
    observation = Observation.checked(3, rate(3), stream_bps=[rate(3) / 3] * 3)
    monkeypatch.delenv("TAME_TOKEN", raising=False)
    monkeypatch.delenv("TAME_READ_TOKEN", raising=False)
    with DroppingProxy(("127.0.0.1", port), b"POST /v1/observations") as proxy, \
            transfer.Reporter(proxy.url) as reporter:
        stored, error = reporter.link(None, parse_destination(DEST)).observe(observation)
    assert proxy.dropped == 1
    assert error is None and stored["accepted"] is True, error
    assert counts(app)["observations"] == 1


def test_a_report_is_not_sent_again_past_the_retry_window(tmp_path, service_factory, monkeypatch):
    from advisor.commands import transfer

    monkeypatch.setattr(transfer, "OBSERVATION_RETRY_DELAYS_S", (0.1, 0.1))
    monkeypatch.setattr(transfer, "OBSERVATION_RETRY_WITHIN_S", 0.05)
    monkeypatch.delenv("TAME_TOKEN", raising=False)
    monkeypatch.delenv("TAME_READ_TOKEN", raising=False)
    base, client, app = service_factory(start_worker=False)
    port = int(base.rsplit(":", 1)[1])
    with DroppingProxy(("127.0.0.1", port), b"POST /v1/observations", drops=3) as proxy, \
            transfer.Reporter(proxy.url) as reporter:
        stored, error = reporter.link(None, parse_destination(DEST)).observe(Observation.checked(3, rate(3)))
    assert stored is None and "cannot reach the advice service" in error and proxy.dropped == 1


def test_a_run_spooled_before_keys_were_kept_is_sent_under_one_key(tmp_path, service_factory):
    """A spool record from before keys (none in it) is sent under a key made from its file's name, the same at every
    delivery: its answer lost once, it is still stored once."""
    from advisor.commands.agent import SPOOL_FORM, _deliver_spooled
    from api.client import TameClient

    base, client, app = service_factory(start_worker=False)
    port = int(base.rsplit(":", 1)[1])
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "1-old.json").write_text(json.dumps({"form": SPOOL_FORM, "payload": RUN}))
    with DroppingProxy(("127.0.0.1", port), b"POST /v1/probe-runs") as proxy, TameClient(proxy.url) as remote:
        _deliver_spooled(remote, spool)
        assert proxy.dropped == 1 and [p.name for p in spool.glob("*.json")] == ["1-old.json"]
        _deliver_spooled(remote, spool)
    assert list(spool.glob("*.json")) == []
    assert counts(app)["probe_runs"] == 1
