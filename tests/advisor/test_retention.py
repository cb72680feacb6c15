"""Retention (advisor/retention.py) on a real SQLite file and on PostgreSQL: bounded counts, the
current advice untouched, and a SQLite file that stays flat under a steady load once pruned."""

import math
import os
import sqlite3
from dataclasses import replace

import pytest

from advisor.destinations import parse_destination
from advisor.jobs import process_owner
from advisor.retention import Retention, prune
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from probes.result import ProbeResult
from tests.sites import SITE

A, B = 1e-16, 4e-16  # a path that follows Lu's model: BW(n) = n / sqrt(A n^2 + B)
DESTS = ("127.0.0.1:5201", "127.0.0.2:5201")
RETENTION = Retention(keep_fits=5, keep_runs=3, run_max_age_s=0, keep_observations=200, batch=40, interval_s=0)
OBSERVATIONS_PER_RUN = 30


def rate(n):
    return n / math.sqrt(A * n * n + B)


class Clock:
    def __init__(self):
        self.now = 1_700_000_000.0

    def __call__(self):
        self.now += 1.0  # every reading is a second later: runs and observations are ordered in time
        return self.now


def probe_results(dest, cycle):
    # A raw summary of a few KB, as probes keep (probes/iperf_parse.py RAW_MAX_CHARS bounds it).
    return [ProbeResult(dest=dest, streams=n, duration_s=5, omit_s=1, throughput_bps=rate(n) * (1 + cycle % 3 / 100),
                        sender_bps=rate(n), raw="x" * 4000) for n in (1, 10)]


def run_cycle(service, cycle):
    """For each destination: a probe job run to completion, then observations (each refits)."""
    owner = process_owner()
    for dest in DESTS:
        job, _ = service.request_probe(dest)
        claimed = service.store.claim_job(owner, lambda j: 600.0, 10, src=SITE)
        assert claimed.id == job.id
        service.ingest_run(parse_destination(dest), 0.001, probe_results(dest, cycle), service.clock(), source="probe",
                           job_id=job.id, congestion_control=job.congestion_control)
        for i in range(OBSERVATIONS_PER_RUN):
            n = 2 + (i + cycle) % 7
            service.observe(dest, n, rate(n) * (1 + (i % 5) / 200))


def raw_kept(store):
    """{dest: the run whose results hold raw}; each run's results hold it all or not at all."""
    with store.db.transaction() as tx:
        rows = tx.execute("SELECT d.dest, r.id, count(*), count(p.raw) FROM probe_results p JOIN probe_runs r ON "
                          "r.id = p.probe_run_id JOIN destinations d ON d.id = r.destination_id "
                          "GROUP BY d.dest, r.id").fetchall()
    assert all(kept in (0, n) for _, _, n, kept in rows), rows
    kept = {}
    for dest, run, _, held in rows:
        if held:
            assert dest not in kept, rows  # one run per link
            kept[dest] = run
    return kept


def newest_run(store, dest):
    with store.db.transaction() as tx:
        return tx.execute("SELECT max(r.id) FROM probe_runs r JOIN destinations d ON d.id = r.destination_id "
                          "WHERE d.dest = ?", (dest,)).fetchone()[0]


def counts(store):
    out = {}
    with store.db.transaction() as tx:
        for table in ("fits", "curve_points", "probe_runs", "probe_results", "observations", "probe_jobs"):
            out[table] = tx.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return out


def current_view(store):
    with store.db.transaction() as tx:
        return tx.execute("SELECT dest, fit_id, model, regime, fitted_at, probed_at, streams, throughput_bps, impact, "
                          "impact_bound FROM current_advice ORDER BY dest, streams").fetchall()


def advice(service):
    return {dest: {k: v for k, v in service.advice(dest, 0.5).items() if k not in ("age_s", "stale")}
            for dest in DESTS}


def check_bounded_and_unchanged(service):
    store = service.store
    before_view, before_advice = current_view(store), advice(service)
    control = service.settings.congestion_control
    before_fits = {dest: store.current_fit(dest, control, src=SITE) for dest in DESTS}
    prune(store, RETENTION)
    service.drop_cache()
    assert current_view(store) == before_view
    assert advice(service) == before_advice
    assert {dest: store.current_fit(dest, control, src=SITE) for dest in DESTS} == before_fits
    n = len(DESTS)
    c = counts(store)
    assert c["fits"] <= n * RETENTION.keep_fits, c
    assert c["curve_points"] <= n * RETENTION.keep_fits * service.settings.n_max, c
    # The newest keep_runs runs, plus any an older kept fit rests on (none here: the newest fits are refits).
    assert c["probe_runs"] <= n * (RETENTION.keep_runs + RETENTION.keep_fits), c
    assert c["probe_results"] == 2 * c["probe_runs"], c
    assert raw_kept(store) == {dest: newest_run(store, dest) for dest in DESTS}
    assert c["observations"] <= n * RETENTION.keep_observations, c
    assert c["probe_jobs"] <= n * RETENTION.keep_runs, c
    # The next observation refits on the newest run and the observations since, as it would have unpruned.
    run = store.latest_run_points(DESTS[0], service.settings.congestion_control, src=SITE)
    assert [p["streams"] for p in run.points] == [1, 10]
    with store.db.transaction() as tx:
        (since,) = tx.execute("SELECT count(*) FROM observations o JOIN destinations d ON d.id = o.destination_id "
                              "WHERE d.dest = ? AND o.observed_at >= ?", (DESTS[0], run.finished_at)).fetchone()
    assert since == OBSERVATIONS_PER_RUN == before_fits[DESTS[0]].observations_used
    return c


def probe_again(service):
    """A pushed probe run for each of DESTS (a new fit each), as a site's agent sends."""
    for dest in DESTS:
        service.ingest_run(parse_destination(dest), 0.001, probe_results(dest, 1), service.clock(), source="push",
                           congestion_control=service.settings.congestion_control)


def make_service(url):
    store = Store.open(url, clock=Clock())
    settings = replace(Settings(), model="lu", retention=RETENTION)
    return AdviceService(store, settings, clock=store.clock)


def file_bytes(path):
    # Pages still in the WAL belong to the store too: fold them into the file before measuring.
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return os.path.getsize(path) + (os.path.getsize(f"{path}-wal") if os.path.exists(f"{path}-wal") else 0)


def test_sqlite_file_stays_flat_and_the_advice_unchanged(tmp_path):
    path = tmp_path / "tame.sqlite3"
    service = make_service(f"sqlite:///{path}")
    try:
        cycles = 12  # 12 runs and 360 observations (and refits) per destination each half: past every limit
        for cycle in range(cycles):  # warm-up
            run_cycle(service, cycle)
            prune(service.store, RETENTION)
        warm = check_bounded_and_unchanged(service)
        size_warm = file_bytes(path)
        for cycle in range(cycles, 2 * cycles):  # a second, equally long load
            run_cycle(service, cycle)
            prune(service.store, RETENTION)
        after = check_bounded_and_unchanged(service)
        size_after = file_bytes(path)
        assert after == warm
        # Freed pages are reused: the file may gain a few pages (page-level fragmentation), not a load's worth.
        assert size_after <= size_warm * 1.05 + 8 * 4096, (size_warm, size_after)
    finally:
        service.store.close()


def test_unpruned_store_grows(tmp_path):
    # The control for the test above: without pruning, the same second load grows the file.
    path = tmp_path / "tame.sqlite3"
    service = make_service(f"sqlite:///{path}")
    try:
        for cycle in range(4):
            run_cycle(service, cycle)
        size_warm = file_bytes(path)
        for cycle in range(4, 8):
            run_cycle(service, cycle)
        assert file_bytes(path) > size_warm * 1.5
    finally:
        service.store.close()


def test_old_runs_go_but_the_newest_and_what_fits_rest_on_stay(tmp_path):
    service = make_service(f"sqlite:///{tmp_path / 'tame.sqlite3'}")
    store = service.store
    try:
        for cycle in range(4):
            run_cycle(service, cycle)
        store.clock.now += 10 * 86400  # everything is ten days old
        for dest in DESTS:
            service.request_probe(dest)  # in use (a probe is queued): the links stay, only their history is pruned
        dest = DESTS[0]
        current = store.current_fit(dest, service.settings.congestion_control, src=SITE)
        prune(store, replace(RETENTION, run_max_age_s=86400, keep_runs=100, keep_fits=1000))
        with store.db.transaction() as tx:
            runs = tx.execute("SELECT r.id FROM probe_runs r JOIN destinations d ON d.id = r.destination_id "
                              "WHERE d.dest = ?", (dest,)).fetchall()
            resting = tx.execute("SELECT count(*) FROM fits f WHERE f.probe_run_id IS NOT NULL AND NOT EXISTS "
                                 "(SELECT 1 FROM probe_runs r WHERE r.id = f.probe_run_id)").fetchone()[0]
            jobs = tx.execute("SELECT count(*) FROM probe_jobs WHERE status <> 'queued'").fetchone()[0]
        # Four runs each with a fit resting on it (keep_fits=1000 keeps those fits), so all four stay.
        assert len(runs) == 4 and resting == 0
        assert jobs == 0  # finished jobs past the age go
        prune(store, replace(RETENTION, run_max_age_s=86400, keep_runs=100, keep_fits=1))
        with store.db.transaction() as tx:
            runs = tx.execute("SELECT r.id FROM probe_runs r JOIN destinations d ON d.id = r.destination_id "
                              "WHERE d.dest = ?", (dest,)).fetchall()
        assert len(runs) == 1  # the newest, which the next refit rests on
        assert store.current_fit(dest, service.settings.congestion_control, src=SITE) == current
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_counts_bounded_and_the_advice_unchanged(pg_url):
    service = make_service(pg_url)
    try:
        for cycle in range(8):
            run_cycle(service, cycle)
            prune(service.store, RETENTION)
        warm = check_bounded_and_unchanged(service)
        for cycle in range(8, 16):
            run_cycle(service, cycle)
            prune(service.store, RETENTION)
        assert check_bounded_and_unchanged(service) == warm
    finally:
        service.store.close()


def test_settings_validate_the_retention_variables():
    from advisor.errors import ConfigError

    got = Settings.from_env({"TAME_KEEP_FITS": "7", "TAME_KEEP_RUNS": "4", "TAME_RUN_MAX_AGE_S": "0",
                             "TAME_KEEP_OBSERVATIONS": "500", "TAME_PRUNE_INTERVAL_S": "0",
                             "TAME_PRUNE_BATCH": "10"}).retention
    assert got == Retention(keep_fits=7, keep_runs=4, run_max_age_s=0, keep_observations=500, interval_s=0, batch=10)
    for name, bad in (("TAME_KEEP_FITS", "0"), ("TAME_KEEP_OBSERVATIONS", "199"), ("TAME_PRUNE_BATCH", "x")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: bad})
    # Links with nothing newer than the age go, fits and all: under two TTLs it would take links in use.
    with pytest.raises(ConfigError, match=r"TAME_RUN_MAX_AGE_S='7199' must be 0 \(no age limit\) or at least twice "
                                          r"TAME_TTL_S \(7200 s\)"):
        Settings.from_env({"TAME_RUN_MAX_AGE_S": "7199"})
    assert Settings.from_env({"TAME_RUN_MAX_AGE_S": "7200"}).retention.run_max_age_s == 7200
    assert Settings.from_env({}).retention.run_max_age_s == 30 * 86400
    assert Settings.from_env({"TAME_TTL_S": str(20 * 86400)}).retention.run_max_age_s == 40 * 86400  # the default grows


def test_tame_transfers_do_not_push_out_the_observations_a_fit_rests_on(tmp_path):
    service = make_service(f"sqlite:///{tmp_path}/tame.sqlite3")
    dest = DESTS[0]
    try:
        run_cycle(service, 0)  # a probe run and OBSERVATIONS_PER_RUN standard observations on each destination
        control = service.settings.congestion_control
        used = service.store.current_fit(dest, control, src=SITE).observations_used
        assert used == OBSERVATIONS_PER_RUN
        tame = RETENTION.keep_observations + 50  # more than are kept, all newer than the standard ones
        for _ in range(tame):
            assert service.observe(dest, 4, 1e6, stream_congestion_controls=["tame"] * 4,
                                   fractional_multiplier=16.0)["feeds_fit"] is False
        prune(service.store, RETENTION)
        with service.store.db.transaction() as tx:
            standard, tame_kept = tx.execute(
                "SELECT sum(CASE WHEN tame_streams = 0 THEN 1 ELSE 0 END), sum(CASE WHEN tame_streams > 0 THEN 1 "
                "ELSE 0 END) FROM observations o JOIN destinations d ON d.id = o.destination_id WHERE d.dest = ?",
                (dest,)).fetchone()
        # Every standard observation stays (the refit window); tame ones beyond the count kept go.
        assert standard == OBSERVATIONS_PER_RUN
        assert standard + tame_kept <= RETENTION.keep_observations + OBSERVATIONS_PER_RUN
        assert tame_kept < tame
        # The next standard transfer refits on all of them, as it would have unpruned.
        assert service.observe(dest, 3, rate(3))["refit"] is True
        assert service.store.current_fit(dest, control, src=SITE).observations_used == OBSERVATIONS_PER_RUN + 1
    finally:
        service.store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_spent_attempts_go_once_older_than_the_budget_window(tmp_path, request, backend):
    """The probe-seconds of lapsed attempts are counted over the last hour (advisor.sites): older ones are pruned,
    newer ones kept, whatever the other retention settings."""
    from advisor.sites import BUDGET_WINDOW_S, SiteBudget, claim_job, register_site, site_use
    from tests.api.conftest import Clock as SteppedClock

    url = f"sqlite:///{tmp_path}/tame.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    store = Store.open(url, clock=SteppedClock())
    try:
        dest = parse_destination(DESTS[0])
        register_site(store, "dtn2", SiteBudget(probe_seconds_per_hour=3600), [dest])
        store.enqueue_job(dest, [1, 10], 5.0, src="dtn2")
        for _ in range(2):  # two attempts lapse, 2,000 s apart
            claim_job(store, "dtn2", "agent-gone", max_streams=64, adaptive=False, worst_case_s=lambda job: 100.0)
            store.clock.advance(2000)
            assert store.recover_jobs(10, owner_is_dead=lambda owner: False) == 1
        assert site_use(store, "dtn2").seconds == pytest.approx(115)  # the first started 4,000 s ago
        counts = prune(store, replace(RETENTION, keep_runs=1, run_max_age_s=1))
        assert counts.deleted["spent_attempts"] == 1
        with store.db.transaction() as tx:
            kept = tx.execute("SELECT started_at FROM spent_attempts").fetchall()
        assert [started for (started,) in kept] == [pytest.approx(store.clock() - 2000)]
        assert site_use(store, "dtn2").seconds == pytest.approx(115)
        store.clock.advance(BUDGET_WINDOW_S)
        assert prune(store, RETENTION).deleted["spent_attempts"] == 1
    finally:
        store.close()


def links(store):
    with store.db.transaction() as tx:
        return sorted(r[0] for r in tx.execute("SELECT dest FROM destinations").fetchall())


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_links_that_hold_nothing_newer_than_the_age_kept_go_fits_and_all_and_the_others_stay(tmp_path, request,
                                                                                           backend):
    """A link goes with all it holds (fits and curves too) once no probe of it is queued or running and nothing of it
    is newer than run_max_age_s; a link with a queued probe or anything recent stays, and its advice is unchanged."""
    from advisor.sites import SiteBudget, register_site

    url = f"sqlite:///{tmp_path}/tame.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    service = make_service(url)
    store = service.store
    day = 86400.0
    aged = replace(RETENTION, run_max_age_s=10 * day)
    observed, unfitted, registered, queued, recent = (f"127.0.0.{i}:5201" for i in range(11, 16))
    fitted_long_ago = "127.0.0.16:5201"
    try:
        run_cycle(service, 0)  # DESTS: a probe run, its fit and refits
        service.ingest_run(parse_destination(fitted_long_ago), 0.001, probe_results(fitted_long_ago, 0),
                           service.clock(), source="push",
                           congestion_control=service.settings.congestion_control)  # fitted, never probed again
        for dest in (observed, recent):
            service.observe(dest, 2, rate(2))  # no run: stored without a fit
        # A run that cannot be fitted (one level): stored, with its results, and no fit.
        service.ingest_run(parse_destination(unfitted), 0.001, probe_results(unfitted, 0)[:1], service.clock(),
                           source="push")
        register_site(store, "dtn2", SiteBudget(), [parse_destination(registered)])
        service.request_probe(queued)  # a queued job, and no link row until its run
        service.observe(queued, 2, rate(2))
        assert len(links(store)) == 8
        assert prune(store, aged).deleted["destinations"] == 0  # nothing is ten days old yet

        store.clock.now += 11 * day
        service.observe(recent, 3, rate(3))  # written to today
        probe_again(service)  # DESTS in use: probed again today
        before_view, before_advice = current_view(store), advice(service)
        assert prune(store, replace(aged, run_max_age_s=0)).deleted.get("destinations") is None  # no age limit
        pruned = prune(store, aged)
        assert pruned.deleted["destinations"] == 4
        assert links(store) == sorted([*DESTS, queued, recent])
        service.drop_cache()
        assert current_view(store) == [row for row in before_view if row[0] != fitted_long_ago]
        assert advice(service) == before_advice
        with store.db.transaction() as tx:
            # Nothing of the removed links is left behind, the fitted one's fits and curve included.
            orphans = [tx.execute(sql).fetchone()[0] for sql in (
                "SELECT count(*) FROM probe_runs r WHERE NOT EXISTS (SELECT 1 FROM destinations d WHERE d.id = "
                "r.destination_id)",
                "SELECT count(*) FROM observations o WHERE NOT EXISTS (SELECT 1 FROM destinations d WHERE d.id = "
                "o.destination_id)",
                "SELECT count(*) FROM probe_results p WHERE NOT EXISTS (SELECT 1 FROM probe_runs r WHERE r.id = "
                "p.probe_run_id)",
                "SELECT count(*) FROM fits f WHERE NOT EXISTS (SELECT 1 FROM destinations d WHERE d.id = "
                "f.destination_id)",
                "SELECT count(*) FROM curve_points c WHERE NOT EXISTS (SELECT 1 FROM fits f WHERE f.id = c.fit_id)")]
        assert orphans == [0, 0, 0, 0, 0]
        assert fitted_long_ago not in {row[0] for row in current_view(store)}
        # The link whose probe is queued goes once that probe has finished and aged too; the fitted links in use
        # stay as long as they are probed.
        with store.db.transaction(write=True) as tx:
            tx.execute("UPDATE probe_jobs SET status = 'failed', finished_at = ? WHERE dest = ?",
                       (store.clock(), queued))
        assert queued in links(store)
        store.clock.now += 11 * day
        probe_again(service)
        prune(store, aged)
        assert links(store) == sorted(DESTS)
        # Once nobody probes them, they go as well.
        store.clock.now += 11 * day
        prune(store, aged)
        assert links(store) == [] and current_view(store) == [] and set(counts(store).values()) == {0}
    finally:
        store.close()


@pytest.mark.postgres
def test_pruning_skips_an_empty_link_a_write_holds_instead_of_waiting_for_it(pg_url):
    """A registration holds each of its site's links (FOR KEY SHARE) in its agent's order; pruning locking them in
    its own order would deadlock with it, so it skips a link a write holds, and removes it on a later pass."""
    import threading

    import psycopg

    service = make_service(pg_url)
    store = service.store
    held, free = "127.0.0.21:5201", "127.0.0.22:5201"
    try:
        for dest in (held, free):
            service.observe(dest, 2, rate(2))  # no run: links with no fit
        store.clock.now += 11 * 86400.0
        aged = replace(RETENTION, run_max_age_s=10 * 86400.0)
        with psycopg.connect(pg_url) as writer:
            writer.execute("SELECT id FROM destinations WHERE dest = %s FOR KEY SHARE", (held,))
            passed = []
            pruning = threading.Thread(target=lambda: passed.append(prune(store, aged)))
            pruning.start()
            pruning.join(30)
            assert not pruning.is_alive() and passed, "the prune pass waited for the write's lock"
            assert links(store) == [held]
        prune(store, aged)  # the write ended: the link is free to go
        assert links(store) == []
    finally:
        store.close()


def results_but_raw(store):
    with store.db.transaction() as tx:
        return tx.execute("SELECT id, probe_run_id, streams, throughput_bps, sender_bps, retransmits, rtt_mean_s, "
                          "duration_s, omit_s, throughput_stderr_bps, started_at, mss_bytes, stream_bps, "
                          "stream_retransmits FROM probe_results ORDER BY id").fetchall()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_only_each_links_newest_run_keeps_its_raw_record(tmp_path, request, backend):
    """Older runs that stay keep their numbers, fits and advice; their raw record is cleared, a few results per
    transaction, and nothing is deleted."""
    url = f"sqlite:///{tmp_path}/tame.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    service = make_service(url)
    store = service.store
    control = service.settings.congestion_control
    other = "reno" if control != "reno" else "cubic"
    try:
        for cycle in range(3):
            run_cycle(service, cycle)
        # A pushed run under another control on the first link: newer, so the first control's runs lose raw too.
        dest = DESTS[0]
        service.ingest_run(parse_destination(dest), 0.001, probe_results(dest, 9), service.clock(), source="push",
                           congestion_control=other)
        with store.db.transaction() as tx:
            newest_raw = dict(tx.execute("SELECT id, raw FROM probe_results WHERE raw IS NOT NULL").fetchall())
        before = (counts(store), results_but_raw(store), current_view(store), advice(service),
                  {(d, c): store.current_fit(d, c, src=SITE) for d in DESTS for c in (control, other)},
                  [store.latest_run_points(d, c, src=SITE) for d in DESTS for c in (control, other)])

        got = prune(store, replace(RETENTION, keep_runs=100, keep_fits=1000, batch=3))
        # 3 runs on the second link, 4 on the first, 2 results each: all but each link's newest run cleared.
        assert got.deleted["probe_results.raw"] == 2 * (2 + 3)
        assert got.batches >= 4  # 10 results, 3 per batch
        assert not any(n for table, n in got.deleted.items() if table != "probe_results.raw"), got.deleted
        service.drop_cache()
        after = (counts(store), results_but_raw(store), current_view(store), advice(service),
                 {(d, c): store.current_fit(d, c, src=SITE) for d in DESTS for c in (control, other)},
                 [store.latest_run_points(d, c, src=SITE) for d in DESTS for c in (control, other)])
        assert after == before
        assert raw_kept(store) == {d: newest_run(store, d) for d in DESTS}
        with store.db.transaction() as tx:
            kept = dict(tx.execute("SELECT id, raw FROM probe_results WHERE raw IS NOT NULL").fetchall())
        assert kept and all(newest_raw[i] == text for i, text in kept.items())
        assert prune(store, replace(RETENTION, keep_runs=100, keep_fits=1000)).deleted["probe_results.raw"] == 0

        # The next run takes the raw record over: the one before it is cleared on the next pass.
        run_cycle(service, 3)
        prune(store, replace(RETENTION, keep_runs=100, keep_fits=1000))
        assert raw_kept(store) == {d: newest_run(store, d) for d in DESTS}

        # A run delivered late (its probes an hour older than the current fit's) is kept as history: it is stored
        # last but the current run keeps the raw record, and the late run's is cleared.
        current = newest_run(store, DESTS[1])
        late, _ = service.ingest_run(parse_destination(DESTS[1]), 0.001, probe_results(DESTS[1], 4), service.clock(),
                                     source="push", congestion_control=control, measured_ago_s=3600.0)
        assert late.id > current
        prune(store, replace(RETENTION, keep_runs=100, keep_fits=1000))
        assert raw_kept(store)[DESTS[1]] == current
    finally:
        store.close()


def test_a_server_without_a_worker_requeues_a_claim_whose_lease_ran_out(tmp_path):
    """`tame serve --no-worker` re-queues, in its pruning passes, a job an agent claimed and never finished (it died):
    with no probe worker nothing else did until another agent of that site claimed again."""
    import time

    from advisor.retention import Pruner
    from advisor.sites import SiteBudget

    service = make_service(f"sqlite:///{tmp_path}/tame.sqlite3")
    store = service.store
    try:
        assert service.register_site("dtn2", SiteBudget(), [DESTS[0]])["queued"] == 1
        claimed = service.claim("dtn2", "agent-1", 64)["job"]
        assert claimed is not None
        status = lambda: store.job(claimed["id"]).status  # noqa: E731
        assert status() == "running"
        with store.db.transaction(write=True) as tx:  # the agent died; its lease runs out
            tx.execute("UPDATE probe_jobs SET lease_until = ? WHERE id = ?", (store.clock() - 1, claimed["id"]))
        pruner = Pruner(store, replace(RETENTION, interval_s=0.05), recover=lambda: store.recover_jobs(
            service.settings.max_probe_attempts, local_src=service.settings.site))
        pruner.start()
        try:
            deadline = time.monotonic() + 10
            while status() != "queued":
                assert time.monotonic() < deadline, "the claim whose lease ran out was not re-queued"
                time.sleep(0.05)
        finally:
            pruner.stop()
    finally:
        store.close()


# Controls a link holds results under (link_controls, advisor.limits.MAX_LINK_CONTROLS): released by pruning once
# nothing under one is newer than run_max_age_s and no probe under it is queued or running.
DAY = 86400.0
AGED = replace(RETENTION, keep_fits=1000, keep_runs=1000, run_max_age_s=10 * DAY)


def controls_of(store, dest=DESTS[0]):
    with store.db.transaction() as tx:
        return [r[0] for r in tx.execute("SELECT lc.congestion_control FROM link_controls lc JOIN destinations d "
                                         "ON d.id = lc.destination_id WHERE d.dest = ? ORDER BY 1", (dest,)).fetchall()]


def write_under(service, control, dest=DESTS[0]):
    """A pushed run under ``control`` (its fit), then an observation under it (a refit), kept with its key."""
    from advisor.idempotency import OBSERVATION, KeyedRequest

    service.ingest_run(parse_destination(dest), 0.001, probe_results(dest, 0), service.clock(), source="push",
                       congestion_control=control)
    service.observe(dest, 2, rate(2), congestion_control=control,
                    request=KeyedRequest(SITE, OBSERVATION, f"{dest}-{control}-{service.clock()}", "digest"))


def written_then_in_use(service, old, in_use):
    """Results on the first link under each of ``old`` and ``in_use``, then, eleven days on, under ``in_use`` only."""
    for name in (*old, in_use):
        write_under(service, name)
    service.store.clock.now += 11 * DAY
    write_under(service, in_use)


def held_under(store, control, dest=DESTS[0]):
    """Every row link ``dest`` holds under ``control``, per table (request_keys: those naming its observations;
    probe_results: their ids and numbers)."""
    link = "(SELECT id FROM destinations WHERE dest = ?)"
    with store.db.transaction() as tx:
        return {table: tx.execute(sql, (dest, control)).fetchall() for table, sql in {
            "fits": f"SELECT * FROM fits WHERE destination_id = {link} AND congestion_control = ? ORDER BY id",
            "curve_points": "SELECT c.* FROM curve_points c JOIN fits f ON f.id = c.fit_id WHERE f.destination_id = "
                            f"{link} AND f.congestion_control = ? ORDER BY c.fit_id, c.streams",
            "probe_runs": f"SELECT * FROM probe_runs WHERE destination_id = {link} AND congestion_control = ? "
                          "ORDER BY id",
            # Not raw: pruning clears it in all but the link's newest run with results, whatever its control.
            "probe_results": "SELECT p.id, p.probe_run_id, p.streams, p.throughput_bps FROM probe_results p JOIN "
                             "probe_runs r ON r.id = p.probe_run_id WHERE "
                             f"r.destination_id = {link} AND r.congestion_control = ? ORDER BY p.id",
            "observations": f"SELECT * FROM observations WHERE destination_id = {link} AND congestion_control = ? "
                            "ORDER BY id",
            "request_keys": "SELECT k.* FROM request_keys k JOIN observations o ON o.id = k.record_id WHERE "
                            f"k.kind = 'observation' AND o.destination_id = {link} AND o.congestion_control = ? "
                            "ORDER BY k.id"}.items()}


def url_of(backend, tmp_path, request):
    return f"sqlite:///{tmp_path}/tame.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_link_at_its_control_cap_takes_a_new_control_once_pruning_released_the_old_ones(tmp_path, request,
                                                                                         backend):
    """A link probed under MAX_LINK_CONTROLS controls long ago, and in use under one of them since, takes a new
    control once a pass finds nothing under the others newer than run_max_age_s; before then it is refused."""
    from advisor.errors import TooManyControls
    from advisor.limits import MAX_LINK_CONTROLS

    service = make_service(url_of(backend, tmp_path, request))
    store = service.store
    old = [f"old{k}" for k in range(MAX_LINK_CONTROLS)]
    try:
        for control in old:
            write_under(service, control)
        prune(store, AGED)  # nothing is ten days old yet
        with pytest.raises(TooManyControls) as refused:
            service.observe(DESTS[0], 2, rate(2), congestion_control="new")

        store.clock.now += 11 * DAY
        service.observe(DESTS[0], 2, rate(2), congestion_control=old[0])  # the link is in use under one of them
        prune(store, replace(AGED, run_max_age_s=0))  # no age limit
        assert controls_of(store) == old
        pruned = prune(store, AGED)
        assert controls_of(store) == [old[0]]
        assert service.observe(DESTS[0], 2, rate(2), congestion_control="new")["accepted"]
        assert controls_of(store) == ["new", old[0]]
        assert pruned.deleted["link_controls"] == MAX_LINK_CONTROLS - 1
        # The refusal says when a control is released.
        assert "released once nothing under it is newer than TAME_RUN_MAX_AGE_S" in str(refused.value)
        assert "never while TAME_RUN_MAX_AGE_S is 0" in str(refused.value)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_control_with_anything_recent_or_a_probe_queued_or_running_is_not_released(tmp_path, request, backend):
    """Under each kept control the link holds something newer than run_max_age_s (an observation, a run, a job asked
    for or finished) or a probe queued or running since long ago; only the control with none of them goes."""
    service = make_service(url_of(backend, tmp_path, request))
    store = service.store
    dest = parse_destination(DESTS[0])
    kept = ["finished", "observed", "queued", "ran", "requested", "running"]
    try:
        for control in ["old", *kept]:
            write_under(service, control)
        for control in ("queued", "running"):  # asked for long ago, never finished
            store.enqueue_job(dest, [1, 10], 5.0, src=SITE, congestion_control=control)
        store.clock.now += 11 * DAY
        with store.db.transaction(write=True) as tx:
            tx.execute("UPDATE probe_jobs SET status = 'running', started_at = ? WHERE congestion_control = 'running'",
                       (store.clock(),))
        service.observe(DESTS[0], 2, rate(2), congestion_control="observed")
        service.ingest_run(dest, 0.001, probe_results(DESTS[0], 0), service.clock(), source="push",
                           congestion_control="ran")
        store.enqueue_job(dest, [1, 10], 5.0, src=SITE, congestion_control="requested")
        job, _ = store.enqueue_job(dest, [1, 10], 5.0, src=SITE, congestion_control="finished")
        with store.db.transaction(write=True) as tx:
            tx.execute("UPDATE probe_jobs SET status = 'failed', finished_at = ? WHERE id = ?", (store.clock(), job.id))
        before = {control: held_under(store, control) for control in kept}

        pruned = prune(store, AGED)
        assert controls_of(store) == kept
        assert {control: held_under(store, control) for control in kept} == before
        assert pruned.deleted["link_controls"] == 1
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_released_control_goes_with_its_fits_runs_observations_and_keys_and_the_others_stay(tmp_path, request,
                                                                                              backend):
    """Releasing a control deletes what its link held under it (fits and curves, runs and results, observations and
    their Idempotency-Keys), nothing under the link's other controls or another link's same control, and the
    advice under the controls that stay is unchanged."""
    service = make_service(url_of(backend, tmp_path, request))
    store = service.store
    control = service.settings.congestion_control
    gone, stays = "gone", "stays"
    try:
        for dest in DESTS:
            for name in (gone, stays):
                write_under(service, name, dest)
        store.clock.now += 11 * DAY
        for dest, name in ((DESTS[0], stays), (DESTS[1], stays), (DESTS[1], gone)):  # in use: all but one
            write_under(service, name, dest)
        assert all(held_under(store, gone)[table] for table in ("fits", "curve_points", "probe_runs",
                                                                 "probe_results", "observations", "request_keys"))
        before = {(dest, name): held_under(store, name, dest) for dest in DESTS for name in (gone, stays)
                  if (dest, name) != (DESTS[0], gone)}
        before_advice = {name: store.current_fit(DESTS[0], name, src=SITE) for name in (stays, control)}

        pruned = prune(store, AGED)
        assert not any(held_under(store, gone).values())
        assert controls_of(store) == [stays] and controls_of(store, DESTS[1]) == [gone, stays]
        assert pruned.deleted["link_controls"] == 1 and pruned.deleted["request_keys"] == 1, pruned.deleted
        assert {(dest, name): held_under(store, name, dest) for dest, name in before} == before
        assert store.current_fit(DESTS[0], gone, src=SITE) is None
        assert {name: store.current_fit(DESTS[0], name, src=SITE) for name in (stays, control)} == before_advice
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_each_pass_goes_on_releasing_controls_where_the_one_before_stopped(tmp_path, request, backend):
    """With one (link, control) a batch and one batch a pass, successive passes of the Pruner go through
    link_controls in key order, releasing the next pair each time, and start again from the first at its end."""
    from advisor.retention import Pruner

    service = make_service(url_of(backend, tmp_path, request))
    store = service.store
    try:
        written_then_in_use(service, ["a1", "a2", "a3"], "keep")
        pruner = Pruner(store, replace(AGED, batch=1), pause_s=0, max_batches=1)
        released = []
        for expected in (["a2", "a3", "keep"], ["a3", "keep"], ["keep"], ["keep"], ["keep"]):
            released.append(pruner.run_pass().deleted.get("link_controls"))
            assert controls_of(store) == expected
        assert released == [1, 1, 1, 0, 0]  # a1, a2, a3, keep (not idle), the end (none left: from the first next)
        with store.db.transaction(write=True) as tx:  # a pass (of any replica) stopped after a3
            did = tx.execute("SELECT id FROM destinations WHERE dest = ?", (DESTS[0],)).fetchone()[0]
            tx.execute("INSERT INTO prune_positions (step, destination_id, congestion_control) VALUES "
                       "('link_controls', ?, 'a3')", (did,))
        assert prune(store, replace(AGED, batch=1), max_batches=1).resume == (did, "keep")
    finally:
        store.close()


@pytest.mark.postgres
def test_a_write_under_a_control_being_released_waits_and_records_it_again(pg_url, monkeypatch):
    """A write under a control that a pass is releasing waits for the pass's lock on the link, then finds the control
    gone from link_controls and records it again with its observation: never a result under an uncounted control."""
    import threading
    import time

    import psycopg

    import advisor.retention as retention

    service = make_service(pg_url)
    store = service.store
    try:
        written_then_in_use(service, ["old"], "keep")
        releasing, go_on = threading.Event(), threading.Event()
        delete_held = retention._delete_held

        def held_back(tx, ids, control=None):
            delete_held(tx, ids, control)
            releasing.set()
            assert go_on.wait(30)

        monkeypatch.setattr(retention, "_delete_held", held_back)
        passed, written = [], []
        pruning = threading.Thread(target=lambda: passed.append(prune(store, AGED)))
        pruning.start()
        assert releasing.wait(30)
        writing = threading.Thread(target=lambda: written.append(
            service.observe(DESTS[0], 2, rate(2), congestion_control="old")))
        writing.start()
        with psycopg.connect(pg_url) as watcher:
            deadline = time.monotonic() + 30
            while not watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]:
                assert time.monotonic() < deadline, "the write did not wait for the pass's lock on its link"
                time.sleep(0.05)
        go_on.set()
        pruning.join(30)
        writing.join(30)
        assert passed and passed[0].deleted["link_controls"] == 1
        assert written and written[0]["accepted"]
        assert controls_of(store) == ["keep", "old"]
        with store.db.transaction() as tx:
            assert tx.execute("SELECT count(*) FROM observations WHERE congestion_control = 'old'").fetchone()[0] == 1
    finally:
        store.close()


@pytest.mark.postgres
def test_a_control_whose_link_a_write_holds_is_skipped_not_waited_for(pg_url):
    """A write holding its link (Store.link_id: FOR KEY SHARE) wins: the pass skips the link's idle control without
    waiting, and releases it on a later pass once the write has ended."""
    import threading

    import psycopg

    service = make_service(pg_url)
    store = service.store
    try:
        written_then_in_use(service, ["old"], "keep")
        with psycopg.connect(pg_url) as writer:
            writer.execute("SELECT id FROM destinations WHERE dest = %s FOR KEY SHARE", (DESTS[0],))
            passed = []
            pruning = threading.Thread(target=lambda: passed.append(prune(store, AGED)))
            pruning.start()
            pruning.join(30)
            assert not pruning.is_alive() and passed, "the prune pass waited for the write's lock"
            assert controls_of(store) == ["keep", "old"]
        prune(store, AGED)
        assert controls_of(store) == ["keep"]
    finally:
        store.close()


def new_link(tx):
    """A link of SITE to a destination no link has yet, made in SQL; its id."""
    k = tx.execute("SELECT count(*) FROM destinations").fetchone()[0]
    dest = f"10.{k // 250}.{k % 250}.1:5201"
    return tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, 5201, 0) "
                      "RETURNING id", (SITE, dest, dest[:-5])).fetchone()[0]


def fill_links(store, links, standard, tame):
    """``links`` links, each with ``standard`` standard observations under cubic and then ``tame`` newer tame ones
    (written in SQL: thousands of transfers); their ids in id order."""
    ids = []
    with store.db.transaction(write=True) as tx:
        for _ in range(links):
            ids.append(new_link(tx))
            for i in range(standard + tame):
                tx.execute("INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                           "congestion_control, tame_streams) VALUES (?, 2, 1e8, ?, 'cubic', ?)",
                           (ids[-1], float(i), 0 if i < standard else 2))
    return ids


def observation_counts(store, ids):
    with store.db.transaction() as tx:
        return [tx.execute("SELECT count(*) FROM observations WHERE destination_id = ?", (i,)).fetchone()[0]
                for i in ids]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_observations_past_the_count_go_on_every_link_also_behind_links_whose_rows_all_stay(tmp_path, request,
                                                                                            backend):
    # A batch goes through LINKS_A_BATCH links past the count at most (its read is bounded by them). The
    # first links here are past the count with rows that all stay: 150 standard observations, all in the refit window
    # (the 200 newest standard ones), behind 200 newer tame transfers. More of them than a batch takes come first,
    # and the links after them are still trimmed to the count kept, in one pass and in passes of one batch each.
    from advisor.retention import LINKS_A_BATCH

    store = Store.open(url_of(backend, tmp_path, request))
    try:
        staying = fill_links(store, LINKS_A_BATCH + 10, standard=150, tame=200)
        trimmed = fill_links(store, LINKS_A_BATCH + 10, standard=250, tame=0)
        one_batch = prune(store, RETENTION, max_batches=1)
        assert one_batch.deleted.get("observations", 0) == 0  # the first batch's links are all staying ones
        passes = 1
        while observation_counts(store, trimmed) != [RETENTION.keep_observations] * len(trimmed):
            assert passes < 200, observation_counts(store, trimmed)
            prune(store, RETENTION, max_batches=1)
            passes += 1
        assert observation_counts(store, staying) == [350] * len(staying)
        # Each pass of one batch went on where the last stopped: 2 batches for the staying links, then 40 rows a
        # batch of the trimmed links' 60 x 50 = 3,000 (the last link's rows end one batch and the next finds none).
        assert passes <= 2 + 3000 // RETENTION.batch + 1
        more = fill_links(store, 3, standard=260, tame=0)
        prune(store, RETENTION)
        assert observation_counts(store, more + trimmed) == [RETENTION.keep_observations] * (3 + len(trimmed))
        with store.db.transaction() as tx:
            assert tx.execute("SELECT count(*) FROM prune_positions WHERE step = 'observations'").fetchone()[0] == 0
    finally:
        store.close()


def fill_fits(store, links, fits):
    """``links`` links, each with ``fits`` fits, given oldest first as (congestion control, probed_at), each with one
    curve point and its place in ``fits`` as its fitted_at (written in SQL); the links' ids in id order."""
    ids = []
    with store.db.transaction(write=True) as tx:
        for _ in range(links):
            ids.append(new_link(tx))
            for place, (control, probed_at) in enumerate(fits):
                fit = tx.execute("INSERT INTO fits (destination_id, model, params_json, regime, warnings_json, "
                                 "probe_streams_json, probes_json, n_max, fitted_at, probed_at, congestion_control) "
                                 "VALUES (?, 'lu', '{}', 'congested', '[]', '[]', '[]', 8, ?, ?, ?) RETURNING id",
                                 (ids[-1], float(place), probed_at, control)).fetchone()[0]
                tx.execute("INSERT INTO curve_points (fit_id, streams, throughput_bps, impact, advisable) "
                           "VALUES (?, 1, 1e8, 0, 1)", (fit,))
    return ids


def fits_of(store, ids):
    """Per link of ``ids``, its fits' places in the fits fill_fits wrote (their fitted_at), in id order."""
    with store.db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM curve_points c WHERE NOT EXISTS "
                          "(SELECT 1 FROM fits f WHERE f.id = c.fit_id)").fetchone()[0] == 0  # curves go with fits
        return [[int(r[0]) for r in tx.execute("SELECT fitted_at FROM fits WHERE destination_id = ? ORDER BY id",
                                               (i,)).fetchall()] for i in ids]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_fits_past_the_count_go_on_every_link_also_behind_links_whose_fits_all_stay(tmp_path, request, backend):
    # A batch of the fits step goes through LINKS_A_BATCH links past the count at most (its read is bounded by them).
    # The first links here are past the count (5) with fits that all stay: 8, each the current one of its own control.
    # More of them than a batch takes come first, and the links after them are still trimmed, in one pass and in
    # passes of one batch each. A trimmed link keeps its 5 newest fits (10-14) and the current fit of each control
    # however old: bbr's only one (0), and cubic's on the newest probes (1: stored first, probed last).
    from advisor.retention import LINKS_A_BATCH

    store = Store.open(url_of(backend, tmp_path, request))
    try:
        staying = fill_fits(store, LINKS_A_BATCH + 10, [(f"c{k}", float(k)) for k in range(8)])
        trimmed_fits = [("bbr", 0.0), ("cubic", 1000.0)] + [("cubic", float(i)) for i in range(2, 15)]
        trimmed = fill_fits(store, LINKS_A_BATCH + 10, trimmed_fits)
        one_batch = prune(store, RETENTION, max_batches=1)
        assert one_batch.deleted.get("fits", 0) == 0  # the first batch's links are all staying ones
        kept = [0, 1, 10, 11, 12, 13, 14]
        passes = 1
        while fits_of(store, trimmed) != [kept] * len(trimmed):
            assert passes < 200, fits_of(store, trimmed)
            prune(store, RETENTION, max_batches=1)
            passes += 1
        assert fits_of(store, staying) == [list(range(8))] * len(staying)
        # Each pass of one batch went on where the last stopped: 2 batches for the staying links, then 40 fits a
        # batch of the trimmed links' 60 x 8 = 480 (the last link's fits end one batch and the next finds none).
        assert passes <= 2 + 480 // RETENTION.batch + 1
        more = fill_fits(store, 3, trimmed_fits)
        prune(store, RETENTION)
        assert fits_of(store, more + trimmed) == [kept] * (3 + len(trimmed))
        with store.db.transaction() as tx:
            assert tx.execute("SELECT count(*) FROM prune_positions WHERE step = 'fits'").fetchone()[0] == 0
    finally:
        store.close()
