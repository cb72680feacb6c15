"""Migration 0012 (advice per link) on a store holding data written before it, on SQLite and PostgreSQL:
every row carried over to the local site (TAME_SITE), nothing lost, the old advice answered for that site,
and a second site's link to the same destination stored beside it."""

import pytest

import advisor.db
from advisor.errors import UnknownDestination
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from probes.result import ProbeResult

from tests.advisor.test_congestion_control_migration import DEST, TABLES, rate, store_before_0011, table_counts


def check_links_migration(url, monkeypatch):
    store_before_0011(url, monkeypatch)
    monkeypatch.setenv("TAME_SITE", "Site-A.example")
    store = Store(advisor.db.Database(url))
    try:
        before = table_counts(store)
        assert 12 in store.db.migrate()
        assert table_counts(store) == before
        with store.db.transaction() as tx:
            assert tx.execute("SELECT DISTINCT src FROM destinations").fetchall() == [("site-a.example",)]
            assert tx.execute("SELECT DISTINCT src FROM probe_jobs").fetchall() == [("site-a.example",)]
            view = tx.execute("SELECT src, dest, count(*) FROM current_advice GROUP BY src, dest").fetchall()
        assert view == [("site-a.example", DEST.key, 64)]
        settings = Settings(model="lu", congestion_control="bbr", site="site-a.example")
        service = AdviceService(store, settings, resolver=lambda h: ["127.0.0.1"], controls=lambda: ["bbr", "cubic"])
        old = service.advice(DEST.key, 0.1)
        assert old["src"] == "site-a.example" and old["num_flows"] >= 1
        with pytest.raises(UnknownDestination, match="site-b"):
            service.advice(DEST.key, 0.1, src="site-b")
        # The same destination from another site is a link of its own, with its own advice.
        results = [ProbeResult(dest=DEST.key, streams=n, throughput_bps=rate(n, b=9e-16), duration_s=1.0, omit_s=0.0,
                               sender_bps=None)
                   for n in (1, 10)]
        service.ingest_run(DEST, 0.04, results, 10.0, source="push", congestion_control="bbr", src="site-b")
        other = service.advice(DEST.key, 0.1, src="site-b")
        assert other["src"] == "site-b" and other["fitted_at"] != old["fitted_at"]
        assert service.advice(DEST.key, 0.1)["fitted_at"] == old["fitted_at"]
        assert {(link["src"], link["dest"]) for link in service.links()} == {("site-a.example", DEST.key),
                                                                             ("site-b", DEST.key)}
        # A probe of the old site's link and one of the new site's coexist; a second of either is the same job.
        job_a, created_a = service.request_probe(DEST.key, congestion_control="bbr")
        job_b, created_b = service.request_probe(DEST.key, congestion_control="bbr", src="site-b")
        assert job_a.id != job_b.id and (job_a.src, job_b.src) == ("site-a.example", "site-b")
        assert service.request_probe(DEST.key, congestion_control="bbr", src="site-b")[0].id == job_b.id
    finally:
        store.close()


def test_links_migration_on_sqlite(tmp_path, monkeypatch):
    check_links_migration(f"sqlite:///{tmp_path}/old.sqlite3", monkeypatch)


@pytest.mark.postgres
def test_links_migration_on_postgres(pg_url, monkeypatch):
    check_links_migration(pg_url, monkeypatch)


def test_a_bad_site_name_stops_the_migration(tmp_path, monkeypatch):
    """TAME_SITE that is no site's name: the migration refuses (ConfigError naming it) and leaves the store at 11."""
    from advisor.errors import ConfigError

    url = f"sqlite:///{tmp_path}/old.sqlite3"
    store_before_0011(url, monkeypatch)
    monkeypatch.setenv("TAME_SITE", "a site; DROP TABLE fits")
    db = advisor.db.Database(url)
    try:
        with pytest.raises(ConfigError, match="TAME_SITE"):
            db.migrate()
        with db.transaction() as tx:
            assert tx.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == 9
            assert tx.execute("SELECT count(*) FROM fits").fetchone()[0] == 1
    finally:
        db.close()
