"""Stored curves are what the service computes from each current fit, whichever program wrote them (advisor/curves.py):
the schedulers' view and the API give one stream count after an upgrade, on SQLite and PostgreSQL."""

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest

import advisor.db
from advisor.curves import curve_of, write_curve
from advisor.destinations import parse_destination
from advisor.fitcodec import fit_to_record
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from advisor.tame import CURVE_VERSION, DEFAULT_MARGIN, stored_curve
from models.auto import MODEL as AUTO, KneeFit
from models.fair_share import FairShareFit
from models.parallel import CONGESTED, UNCONGESTED, ProbePoint
from models.registry import fit
from probes.result import ProbeResult
from tests.api.conftest import Clock
from tests.sites import SITE

DEST = parse_destination("127.0.0.1:5201")
CONTROL = "cubic"
# The hunt's run (streams, bits/s, retransmits): a knee whose clean line reads an impact of 2.2e-16 from 2 streams on.
RUN = ((1, 10.64e6, 2), (10, 95.53e6, 20), (40, 95.62e6, 400))
BUDGETS = [float(b) for b in np.round(np.arange(0.0, 1.0001, 0.005), 3)] + [0.001, 0.019]
VIEW = ("SELECT coalesce(max(streams), 1) FROM current_advice WHERE src = ? AND dest = ? "
        "AND (congestion_control = ? OR congestion_control IS NULL) AND impact_bound <= ?")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path}/s.sqlite3"


def service_on(store):
    return AdviceService(store, Settings(model=AUTO, congestion_control=CONTROL), clock=store.clock,
                         resolver=lambda host: ["127.0.0.1"],
                         controls=lambda: [CONTROL])


def run_points():
    return [ProbePoint(streams=n, throughput_bps=b, rtt_s=0.02, retransmits=r, duration_s=10.0, mss_bytes=1448)
            for n, b, r in RUN]


def run_results():
    return [ProbeResult(dest=DEST.key, streams=n, throughput_bps=b, sender_bps=b, retransmits=r, rtt_mean_s=0.02,
                        duration_s=10.0, omit_s=0.0, mss_bytes=1448) for n, b, r in RUN]


def old_curve(record, n_max=64):
    """The curve as programs of schemas 6 to 8 stored it: the margin raised every impact above 0, rounding too."""
    def bound(impact):
        return min(1.0, impact * (1 + DEFAULT_MARGIN.relative) + DEFAULT_MARGIN.absolute) if impact > 0 else impact
    return [(replace(point, impact_bound=bound(point.impact)), advisable) for point, advisable in curve_of(record, n_max)]


def disagreements(store, service):
    """The budgets where the view's stream count is not the API's."""
    service.drop_cache()
    with store.db.transaction() as tx:
        view = {b: tx.execute(VIEW, (SITE, DEST.key, CONTROL, b)).fetchone()[0] for b in BUDGETS}
    return {b: (view[b], service.advice(DEST.key, b)["num_flows"]) for b in BUDGETS
            if view[b] != service.advice(DEST.key, b)["num_flows"]}


def curve_rows(store, fit_id):
    with store.db.transaction() as tx:
        return tx.execute("SELECT streams, throughput_bps, impact, impact_bound, advisable FROM curve_points "
                          "WHERE fit_id = ? ORDER BY streams", (fit_id,)).fetchall()


def as_rows(curve):
    return [(p.streams, p.throughput_bps, p.impact, p.impact_bound, int(advisable)) for p, advisable in curve]


def store_at_17(url, monkeypatch):
    """A store migrated up to 0017 holding the hunt's fit as programs of schemas 6 to 8 wrote it: its record, and a
    curve with the margin on rounding impacts (what 0009 left alone, since the fit had a record)."""
    everything = advisor.db.migrations()
    monkeypatch.setattr(advisor.db, "migrations", lambda: {v: m for v, m in everything.items() if v <= 17})
    db = advisor.db.Database(url)
    try:
        db.migrate()
        record = fit_to_record(fit(AUTO, run_points()))
        with db.transaction(write=True) as tx:
            did = tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, ?, 1.0) "
                             "RETURNING id", (SITE, DEST.key, DEST.host, DEST.port)).fetchone()[0]
            fit_id = tx.execute(
                "INSERT INTO fits (destination_id, model, params_json, regime, warnings_json, probe_streams_json, "
                "probes_json, observations_used, idle_rtt_s, n_max, fitted_at, probed_at, record_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0.02, 64, 3.0, 2.0, ?) RETURNING id",
                (did, record["model"], json.dumps(record["params"]), record["regime"], json.dumps(record["warnings"]),
                 json.dumps(record["probe_streams"]),
                 json.dumps([{"streams": float(n), "throughput_bps": b} for n, b, _ in RUN]),
                 json.dumps(record["fit"]))).fetchone()[0]
            write_curve(tx, fit_id, old_curve(record))
    finally:
        db.close()
    monkeypatch.setattr(advisor.db, "migrations", lambda: everything)
    return fit_id, record


def test_a_store_written_at_schema_8_gives_the_api_answer_after_the_upgrade(url, monkeypatch):
    # The hunt (migrated_schema8.py): budget 0.01 gave 8 streams from the API and `tame advise`, 1 from the view.
    fit_id, record = store_at_17(url, monkeypatch)
    # The store as schema 17 left it, read at the fit's time: fresh advice, so nothing asks for a probe (a write this
    # program makes to tables of later migrations).
    store = Store(advisor.db.Database(url), clock=lambda: 10.0)
    try:
        service = service_on(store)
        assert disagreements(store, service).get(0.01) == (1, 8)  # before: the old curve splits them
    finally:
        store.close()
    store = Store.open(url)  # migrates, then writes the outdated curves again
    try:
        service = service_on(store)
        with store.db.transaction() as tx:
            assert tx.execute("SELECT count(*) FROM schema_migrations WHERE version >= 18").fetchone()[0] >= 2
        assert disagreements(store, service) == {}
        assert curve_rows(store, fit_id) == as_rows(curve_of(record, 64))
        with store.db.transaction() as tx:
            assert tx.execute("SELECT curve_version FROM fits WHERE id = ?", (fit_id,)).fetchone()[0] == CURVE_VERSION
    finally:
        store.close()


def test_curves_of_an_older_curve_version_are_written_again_when_the_store_is_opened(url):
    store = Store.open(url, clock=Clock())
    try:
        service = service_on(store)
        service.ingest_run(DEST, 0.02, run_results(), store.clock(), source="push", congestion_control=CONTROL)
        (row,) = store.current_fits(src=SITE)
        # As a program of an older CURVE_VERSION wrote it (here: the margin on rounding impacts, as before 0018).
        with store.db.transaction(write=True) as tx:
            tx.execute("DELETE FROM curve_points WHERE fit_id = ?", (row.id,))
            write_curve(tx, row.id, old_curve(fit_to_record_of(row), row.n_max))
            tx.execute("UPDATE fits SET curve_version = ? WHERE id = ?", (CURVE_VERSION - 1, row.id))
        assert disagreements(store, service).get(0.01) == (1, 8)
    finally:
        store.close()
    store = Store.open(url, clock=Clock())
    try:
        assert disagreements(store, service_on(store)) == {}
        assert curve_rows(store, row.id) == as_rows(curve_of(fit_to_record_of(row), row.n_max))
        # A newer program's curve is left as it is: an older replica opening the store must not write it back.
        with store.db.transaction(write=True) as tx:
            tx.execute("UPDATE fits SET curve_version = ? WHERE id = ?", (CURVE_VERSION + 1, row.id))
            tx.execute("UPDATE curve_points SET impact_bound = 0.5 WHERE fit_id = ? AND streams = 2", (row.id,))
    finally:
        store.close()
    store = Store.open(url, clock=Clock())
    try:
        with store.db.transaction() as tx:
            assert tx.execute("SELECT impact_bound FROM curve_points WHERE fit_id = ? AND streams = 2",
                              (row.id,)).fetchone()[0] == 0.5
    finally:
        store.close()


def test_outdated_curves_are_written_again_a_batch_a_transaction(url, monkeypatch):
    """Seven links' outdated curves, three fits a transaction: three transactions, each writing whole curves, and
    every curve is the service's after them; a failure in the third leaves the first two batches written and the
    rest outdated for the next start."""
    import advisor.curves as curves

    store = Store.open(url, clock=Clock())
    try:
        service = service_on(store)
        dests = [parse_destination(f"127.0.0.{i}:5201") for i in range(1, 8)]
        for dest in dests:
            service.ingest_run(dest, 0.02, run_results(), store.clock(), source="push", congestion_control=CONTROL)
        fits = {row.id: row for row in store.current_fits(src=SITE)}
        assert len(fits) == 7

        def outdate():
            with store.db.transaction(write=True) as tx:
                for row in fits.values():
                    tx.execute("DELETE FROM curve_points WHERE fit_id = ?", (row.id,))
                    write_curve(tx, row.id, old_curve(fit_to_record_of(row), row.n_max))
                tx.execute("UPDATE fits SET curve_version = NULL")

        def versions():
            with store.db.transaction() as tx:
                return [v for (v,) in tx.execute("SELECT curve_version FROM fits ORDER BY id").fetchall()]

        outdate()
        rebuild, batches = curves.rebuild_curves, []
        monkeypatch.setattr(curves, "rebuild_curves", lambda tx, limit=None: batches.append(rebuild(tx, limit))
                            or batches[-1])
        assert curves.rebuild_outdated_curves(store.db, batch=3) == 7
        assert batches == [3, 3, 1]
        assert versions() == [CURVE_VERSION] * 7
        for row in fits.values():
            assert curve_rows(store, row.id) == as_rows(curve_of(fit_to_record_of(row), row.n_max))

        outdate()
        batches.clear()

        def third_fails(tx, limit=None):
            if len(batches) == 2:
                raise RuntimeError("the process died")
            batches.append(rebuild(tx, limit))
            return batches[-1]

        monkeypatch.setattr(curves, "rebuild_curves", third_fails)
        with pytest.raises(RuntimeError):
            curves.rebuild_outdated_curves(store.db, batch=3)
        assert sorted(versions(), key=lambda v: v is None) == [CURVE_VERSION] * 6 + [None]
        monkeypatch.setattr(curves, "rebuild_curves", rebuild)
        assert curves.rebuild_outdated_curves(store.db, batch=3) == 1
        assert versions() == [CURVE_VERSION] * 7
    finally:
        store.close()


def fit_to_record_of(row):
    """A stored fit's record, as the store reads it back."""
    return {"model": row.model, "params": row.params, "regime": row.regime, "probe_streams": row.probe_streams,
            "warnings": row.warnings, "fit": row.record}


def test_every_curve_the_service_stores_is_its_fit_s_curve_of_this_version(url):
    # A probe run's fit and an observation's refit: each fit's rows are curve_of(its record), marked CURVE_VERSION.
    # A change to the curve's computation that is not also made here (or marked) fails this or the pin below.
    store = Store.open(url, clock=Clock())
    try:
        service = service_on(store)
        service.ingest_run(DEST, 0.02, run_results(), store.clock(), source="push", congestion_control=CONTROL)
        store.clock.advance(60)
        assert service.observe(DEST.key, 20, 90e6, congestion_control=CONTROL)["refit"] is True
        with store.db.transaction() as tx:
            fits = tx.execute("SELECT id, model, params_json, regime, probe_streams_json, warnings_json, record_json, "
                              "n_max, curve_version FROM fits ORDER BY id").fetchall()
        assert len(fits) == 2
        for fit_id, model, params, regime, streams, warnings, record, n_max, version in fits:
            record = {"model": model, "params": json.loads(params), "regime": regime,
                      "probe_streams": json.loads(streams), "warnings": json.loads(warnings), "fit": json.loads(record)}
            assert version == CURVE_VERSION
            assert curve_rows(store, fit_id) == as_rows(curve_of(record, n_max))
    finally:
        store.close()


# stored_curve's output for reference fits (below), per CURVE_VERSION: a change to it is a new version (stores then
# write their curves again), so this fails until CURVE_VERSION is bumped and the new digest added here.
CURVE_DIGESTS = {
    1: "a464209c69e4832eef40a4e89fb526dc792261b459dc4436c97bd0763947019e",
}


def reference_fits():
    shared = FairShareFit(model=AUTO, params={"capacity_bps": 1.77e10, "competing_flows": 0.05}, regime=CONGESTED,
                          probe_streams=(1.0, 10.0, 40.0), link_capacity_bps=1.77e10, competing_flows=0.05)
    yield KneeFit(model=AUTO, params={}, regime=CONGESTED, probe_streams=(1.0, 10.0, 40.0), per_stream_bps=2.43e10,
                  linear_until_streams=1.0, plateau_until_streams=10.0, congested=shared)
    yield fit(AUTO, run_points())
    yield FairShareFit(model=AUTO, params={"capacity_bps": 1e9, "competing_flows": 2.0}, regime=CONGESTED,
                       probe_streams=(1.0, 10.0), link_capacity_bps=1e9, competing_flows=2.0)
    yield FairShareFit(model=AUTO, params={"per_stream_bps": 3e8}, regime=UNCONGESTED, probe_streams=(1.0, 10.0),
                       per_stream_bps=3e8, flat_beyond_streams=10.0)
    yield fit("lu", [ProbePoint(n, n / (1e-16 * n * n + 4e-16) ** 0.5) for n in (1, 10)])


def curve_digest():
    text = "\n".join(f"{p.streams} {p.throughput_bps:.9g} {p.impact:.9g} {p.impact_bound:.9g} {int(a)}"
                     for fitted in reference_fits() for p, a in stored_curve(fitted, 64))
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_curve_version_names_stored_curve_s_output():
    digest = curve_digest()
    if CURVE_VERSION not in CURVE_DIGESTS:
        pytest.fail(f"add {CURVE_VERSION}: {digest!r} to CURVE_DIGESTS (the output of CURVE_VERSION {CURVE_VERSION})")
    assert CURVE_DIGESTS[CURVE_VERSION] == digest, (
        f"stored_curve's output changed but CURVE_VERSION did not: bump advisor.tame.CURVE_VERSION to "
        f"{CURVE_VERSION + 1} (stores write their current curves again when opened) and add {CURVE_VERSION + 1}: "
        f"{digest!r} to CURVE_DIGESTS")
