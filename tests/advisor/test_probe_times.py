"""A run's probes are dated by when they ran, not by when the run reached the store (probe_runs.probed_at): a refit on
a run an agent held back keeps the probes' age, on SQLite and PostgreSQL."""

import pytest

import advisor.db
from advisor.store import Store
from advisor.tame import CURVE_VERSION
from tests.advisor.test_curves import CONTROL, DEST, run_results, service_on
from tests.api.conftest import Clock
from tests.sites import SITE

HELD_BACK_S = 30 * 3600.0  # past TAME_PROBE_MAX_AGE_S (24 TTLs of 1 h)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path}/s.sqlite3"


def test_a_refit_on_a_held_back_run_keeps_its_probes_time(url):
    # The hunt (refit_probed_at.py): after one observation the advice's probed_at became now and the link, whose
    # probes were 30 h old, was no longer due for a probe.
    store = Store.open(url, clock=Clock())
    try:
        service = service_on(store)
        service.ingest_run(DEST, 0.02, run_results(), store.clock(), source="push", congestion_control=CONTROL,
                           measured_ago_s=HELD_BACK_S)
        probed_at = store.clock() - HELD_BACK_S
        (before,) = service.paths()
        assert before["probed_at"] == probed_at and before["reprobe_due"] == "stale"
        store.clock.advance(60)
        assert service.observe(DEST.key, 20, 90e6, congestion_control=CONTROL)["refit"] is True
        (after,) = service.paths()
        assert after["observations_used"] == 1
        assert after["probed_at"] == probed_at
        # The transfer is fresh evidence (not stale), but the probes are still past their maximum age.
        assert after["stale"] is False and after["reprobe_due"] == "probe_max_age"
        assert service.advice(DEST.key, 0.5)["probed_at"] == probed_at
        with store.db.transaction() as tx:
            assert tx.execute("SELECT DISTINCT probed_at FROM current_advice WHERE src = ?",
                              (SITE,)).fetchall() == [(probed_at,)]
    finally:
        store.close()


def test_runs_stored_before_take_their_fit_s_probe_time(url, monkeypatch):
    everything = advisor.db.migrations()
    monkeypatch.setattr(advisor.db, "migrations", lambda: {v: m for v, m in everything.items() if v <= 18})
    db = advisor.db.Database(url)
    try:
        db.migrate()
        with db.transaction(write=True) as tx:
            did = tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, ?, 1.0) "
                             "RETURNING id", (SITE, DEST.key, DEST.host, DEST.port)).fetchone()[0]
            runs = [tx.execute("INSERT INTO probe_runs (destination_id, source, started_at, finished_at) "
                               "VALUES (?, 'push', 1.0, ?) RETURNING id", (did, finished)).fetchone()[0]
                    for finished in (1000.0, 2000.0)]
            # The first run's fit was dated 600 s before the run reached the store (measured_ago_s); the second
            # run could not be fitted.
            # (Its curve, none here, is of this CURVE_VERSION: not the point of this test.)
            tx.execute("INSERT INTO fits (destination_id, probe_run_id, model, params_json, regime, warnings_json, "
                       "probe_streams_json, probes_json, n_max, fitted_at, probed_at, curve_version) "
                       "VALUES (?, ?, 'lu', '{}', 'congested', '[]', '[]', '[]', 64, 1000.0, 400.0, ?)",
                       (did, runs[0], CURVE_VERSION))
            # A transfer refitted on the first run, dated (as refits were) by when that run reached the store.
            refit = tx.execute(
                "INSERT INTO fits (destination_id, probe_run_id, model, params_json, regime, warnings_json, "
                "probe_streams_json, probes_json, n_max, fitted_at, probed_at, curve_version, observations_used) "
                "VALUES (?, NULL, 'lu', '{}', 'congested', '[]', '[]', '[]', 64, 1500.0, 1000.0, ?, 1) RETURNING id",
                (did, CURVE_VERSION)).fetchone()[0]
        monkeypatch.setattr(advisor.db, "migrations", lambda: everything)
        assert 19 in db.migrate()
        with db.transaction() as tx:
            assert tx.execute("SELECT id, probed_at FROM probe_runs ORDER BY id").fetchall() == [
                (runs[0], 400.0), (runs[1], 2000.0)]
            # The refit is dated by the probes it was made on, as refits are now: the next one (dated 400 s, stored
            # after it) becomes current, not kept as older than it (the review's refit_hidden_after_upgrade.py).
            assert tx.execute("SELECT probed_at FROM fits WHERE id = ?", (refit,)).fetchone() == (400.0,)
            assert tx.execute("SELECT id FROM current_fits").fetchall() == [(refit,)]
    finally:
        db.close()
