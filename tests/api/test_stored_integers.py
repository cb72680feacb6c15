"""Counts a write stores in an INTEGER column are held to what both stores hold (advisor.limits.MAX_STORED_INT):
SQLite and PostgreSQL take or refuse the same body alike, the refused one with 422 and nothing stored."""

import pytest

from advisor import limits
from api import schemas

DEST = "127.0.0.1:5201"
PROBES = [{"streams": 1, "throughput_bps": 40e9, "retransmits": 1000, "rtt_mean_s": 0.02, "mss_bytes": 8948},
          {"streams": 10, "throughput_bps": 90e9, "retransmits": 1000, "rtt_mean_s": 0.03, "mss_bytes": 8948}]
# Every body a client may write: an integer field of one (not in a JSON array, kept as text) lands in an INTEGER column.
WRITE_SCHEMAS = (schemas.ProbeRunIn, schemas.ProbeResultIn, schemas.ObservationIn, schemas.ProbeRequest,
                 schemas.SiteIn, schemas.ClaimIn)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def client_and_store(request, service_factory):
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    _, client, app = service_factory(url=url, start_worker=False)
    return client, app.state.service.store


def stored(store):
    with store.db.transaction() as tx:
        return {table: tx.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("probe_runs", "probe_results", "fits", "observations")}


def test_retransmits_past_an_integer_column_are_refused_on_both_stores(client_and_store):
    # The hunt's body: 3e9 retransmits at 10 streams. SQLite stored it (201), PostgreSQL's int4 column failed (503).
    client, store = client_and_store
    too_many = [PROBES[0], {**PROBES[1], "retransmits": limits.MAX_STORED_INT + 1}]
    response = client.post("/v1/probe-runs", json={"dest": DEST, "probes": too_many, "congestion_control": "cubic"})
    assert response.status_code == 422, response.text
    assert "retransmits" in response.text
    assert stored(store) == {"probe_runs": 0, "probe_results": 0, "fits": 0, "observations": 0}
    # The most a column holds is stored on both, and read back as sent.
    most = [PROBES[0], {**PROBES[1], "retransmits": limits.MAX_STORED_INT}]
    response = client.post("/v1/probe-runs", json={"dest": DEST, "probes": most, "congestion_control": "cubic"})
    assert response.status_code == 201, response.text
    with store.db.transaction() as tx:
        assert tx.execute("SELECT max(retransmits) FROM probe_results").fetchone()[0] == limits.MAX_STORED_INT


def test_every_integer_a_write_stores_is_held_to_the_integer_columns():
    def integer_fields(schema):
        for name, field in schema.get("properties", {}).items():
            for option in field.get("anyOf", [field]):
                if "$ref" in option:
                    continue  # a nested body: checked as a schema of its own
                if option.get("type") == "integer":
                    yield name, option

    for model in WRITE_SCHEMAS:
        schema = model.model_json_schema()
        for name, field in integer_fields(schema):
            assert field.get("maximum", float("inf")) <= limits.MAX_STORED_INT, (model.__name__, name, field)
