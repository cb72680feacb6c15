"""Many clients writing to a destination the store has never seen, at the same moment (issue 31, defect 6).

Each write creates the destination's row if it is missing; concurrent first writes must all
succeed and leave exactly one row, on PostgreSQL (where they run truly in parallel) and SQLite.
"""


import httpx
import pytest

from advisor.db import Database
from tests.together import run_together
from tests.api.conftest import rate

WRITERS = 20
NEW_DESTINATIONS = 3


def _observation(dest):
    return "/v1/observations", {"dest": dest, "streams": 4, "throughput_bps": rate(4)}


def _probe_run(dest):
    return "/v1/probe-runs", {"dest": dest, "idle_rtt_s": 0.01, "probes": [
        {"streams": 1, "throughput_bps": rate(1)}, {"streams": 10, "throughput_bps": rate(10)}]}


def _all_at_once(base, path, body):
    """WRITERS threads, each with its own connection, POST the same body as close together as a barrier allows."""
    def connect(i):
        client = httpx.Client(base_url=base, timeout=60)
        client.get("/healthz")  # connected before the barrier, so the POSTs leave together
        return client

    def write(i, client):
        try:
            return client.post(path, json=body).status_code
        finally:
            client.close()

    return run_together(write, WRITERS, setup=connect)


def _counts(url, table):
    db = Database(url)
    try:
        with db.transaction() as tx:
            dests = dict(tx.execute("SELECT dest, count(*) FROM destinations GROUP BY dest").fetchall())
            rows = dict(tx.execute(f"SELECT d.dest, count(*) FROM {table} t JOIN destinations d "
                                   "ON d.id = t.destination_id GROUP BY d.dest").fetchall())
    finally:
        db.close()
    return dests, rows


@pytest.mark.parametrize("write, table", [(_observation, "observations"), (_probe_run, "probe_runs")],
                         ids=["observations", "probe-runs"])
@pytest.mark.parametrize("database", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def test_concurrent_first_writes_to_a_new_destination_all_succeed(database, write, table, request, tmp_path,
                                                                  service_factory):
    url = request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path}/first.sqlite3"
    base, client, app = service_factory(driver=None, url=url)
    dests = [f"127.0.0.1:{6000 + i}" for i in range(NEW_DESTINATIONS)]
    for dest in dests:
        statuses = _all_at_once(base, *write(dest))
        assert all(s is not None and 200 <= s < 300 for s in statuses), f"{dest}: {statuses}"
    destinations, rows = _counts(url, table)
    assert destinations == {dest: 1 for dest in dests}
    assert rows == {dest: WRITERS for dest in dests}
