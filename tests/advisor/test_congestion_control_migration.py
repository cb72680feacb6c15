"""Migration 0011 on a store holding data written before it: nothing lost, every old row's control NULL,
and the old fit still answers the default control until a probe under it is stored (SQLite and PostgreSQL)."""

import json

import pytest

import advisor.db
from advisor.destinations import parse_destination
from advisor.fitcodec import fit_to_record
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store, write_curve
from advisor.tame import stored_curve
from models.parallel import ProbePoint
from models.registry import fit
from probes.result import ProbeResult
from tests.sites import SITE

DEST = parse_destination("127.0.0.1:5201")
TABLES = ("destinations", "probe_jobs", "probe_runs", "probe_results", "fits", "curve_points", "observations")


def rate(n, a=1e-16, b=4e-16):
    return n / (a * n * n + b) ** 0.5


def store_before_0011(url, monkeypatch):
    """A store migrated up to 0009 and filled as that schema was written (no congestion_control anywhere)."""
    everything = advisor.db.migrations()
    monkeypatch.setattr(advisor.db, "migrations", lambda: {v: m for v, m in everything.items() if v < 10})
    db = advisor.db.Database(url)
    db.migrate()
    fitted = fit("lu", [ProbePoint(1, rate(1)), ProbePoint(10, rate(10))])
    record = fit_to_record(fitted)
    with db.transaction(write=True) as tx:
        did = tx.execute("INSERT INTO destinations (dest, host, port, created_at) VALUES (?, ?, ?, 1.0) RETURNING id",
                         (DEST.key, DEST.host, DEST.port)).fetchone()[0]
        tx.execute("INSERT INTO probe_jobs (id, dest, status, levels_json, duration_s, requested_at) "
                   "VALUES ('old-done', ?, 'done', '[1, 10]', 1.0, 1.0)", (DEST.key,))
        tx.execute("INSERT INTO probe_jobs (id, dest, status, levels_json, duration_s, requested_at) "
                   "VALUES ('old-queued', ?, 'queued', '[1, 10]', 1.0, 2.0)", (DEST.key,))
        run = tx.execute("INSERT INTO probe_runs (destination_id, job_id, source, idle_rtt_s, started_at, finished_at) "
                         "VALUES (?, 'old-done', 'probe', 0.04, 1.0, 2.0) RETURNING id", (did,)).fetchone()[0]
        for n in (1, 10):
            tx.execute("INSERT INTO probe_results (probe_run_id, streams, throughput_bps, duration_s, omit_s, raw) "
                       "VALUES (?, ?, ?, 1.0, 0.0, '{}')", (run, n, rate(n)))
        fit_id = tx.execute(
            "INSERT INTO fits (destination_id, probe_run_id, model, params_json, regime, warnings_json, "
            "probe_streams_json, probes_json, observations_used, idle_rtt_s, n_max, fitted_at, probed_at, record_json) "
            "VALUES (?, ?, ?, ?, ?, '[]', ?, ?, 0, 0.04, 64, 3.0, 2.0, ?) RETURNING id",
            (did, run, record["model"], json.dumps(record["params"]), record["regime"],
             json.dumps(record["probe_streams"]),
             json.dumps([{"streams": float(n), "throughput_bps": rate(n)} for n in (1, 10)]),
             json.dumps(record["fit"]))).fetchone()[0]
        write_curve(tx, fit_id, stored_curve(fitted, 64))
        tx.execute("INSERT INTO observations (destination_id, streams, throughput_bps, observed_at) VALUES (?, 5, ?, 4.0)",
                   (did, rate(5)))
    db.close()
    monkeypatch.setattr(advisor.db, "migrations", lambda: everything)


def table_counts(store):
    with store.db.transaction() as tx:
        return {t: tx.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def check_migration(url, monkeypatch):
    store_before_0011(url, monkeypatch)
    store = Store(advisor.db.Database(url))
    try:
        before = table_counts(store)
        assert 11 in store.db.migrate()
        assert table_counts(store) == before
        with store.db.transaction() as tx:
            for table in ("probe_runs", "fits", "probe_jobs", "observations"):
                assert tx.execute(f"SELECT count(*) FROM {table} WHERE congestion_control IS NOT NULL").fetchone()[0] == 0
            rows = tx.execute("SELECT congestion_control, count(*) FROM current_advice GROUP BY congestion_control").fetchall()
        assert rows == [(None, 64)]
        service = AdviceService(store, Settings(model="lu", congestion_control="bbr"), resolver=lambda h: ["127.0.0.1"])
        # The old fit answers the default control, says why, and agrees with the view read for NULL.
        advice = service.advice(DEST.key, 0.3)
        assert advice["congestion_control"] == "bbr"
        assert any("did not record their congestion control" in w for w in advice["warnings"])
        with store.db.transaction() as tx:
            (view,) = tx.execute("SELECT coalesce(max(streams), 1) FROM current_advice WHERE dest = ? "
                                 "AND congestion_control IS NULL AND impact_bound <= 0.3", (DEST.key,)).fetchone()
        assert view == advice["num_flows"]
        # Not another control's.
        with pytest.raises(Exception, match="under cubic"):
            service.advice(DEST.key, 0.3, "cubic")
        # The job queued before is still the destination's active one (unrecorded), beside a new one under bbr.
        assert store.active_job(DEST.key, src=SITE).id == "old-queued"
        # The old advice is stale (probed at t = 2 s): reading it queued a re-probe under the control asked for.
        job = store.active_job(DEST.key, "bbr", src=SITE)
        assert job is not None and job.id != "old-queued" and job.congestion_control == "bbr"
        # A run under bbr takes over the default control's advice; the old fit stays in the view as NULL.
        results = [ProbeResult(dest=DEST.key, streams=n, duration_s=1.0, omit_s=0.0, throughput_bps=rate(n, a=4e-16),
                               sender_bps=None, congestion_control="bbr") for n in (1, 10)]
        service.ingest_run(DEST, 0.04, results, 5.0, source="probe", job_id=job.id, congestion_control="bbr")
        advice = service.advice(DEST.key, 0.3)
        assert not any("did not record" in w for w in advice["warnings"])
        assert abs(advice["params"]["a_prime"] - 4e-16) / 4e-16 < 1e-6
        assert sorted((r.congestion_control or "") for r in store.current_fits(DEST.key)) == ["", "bbr"]
    finally:
        store.close()


def test_migration_keeps_sqlite_data_with_no_control(tmp_path, monkeypatch):
    check_migration(f"sqlite:///{tmp_path / 'old.sqlite3'}", monkeypatch)


@pytest.mark.postgres
def test_migration_keeps_postgres_data_with_no_control(pg_url, monkeypatch):
    check_migration(pg_url, monkeypatch)
