"""Views users build on the store's (a scheduler's `CREATE VIEW my_advice AS SELECT * FROM current_advice ...`)
across an upgrade, on SQLite and PostgreSQL, from a store at schema version 11: kept (saved, dropped, made again in
the upgrade's transaction), a view on a view too; a view the new schema cannot hold stops the whole upgrade with an
error naming it, its definition and what to do, and the store is left as it was."""

import re

import pytest

import advisor.db
from advisor.errors import StoreError
from advisor.userviews import STORE_VIEWS

from tests.advisor.test_congestion_control_migration import DEST, store_before_0011

# '%' and '?' as a user may write them: kept as written (no placeholders).
MY_ADVICE = ("CREATE VIEW my_advice AS SELECT * FROM current_advice "
             "WHERE impact_bound <= 0.5 AND dest LIKE '%:5201' AND '?' <> '%s'")
# A view on a view.
MY_FLOWS = "CREATE VIEW my_flows AS SELECT dest, coalesce(max(streams), 1) AS streams FROM my_advice GROUP BY dest"
MY_AGES = "CREATE VIEW my_ages AS SELECT dest, max(probed_at) AS probed_at FROM current_advice GROUP BY dest"


def store_at_11(url, monkeypatch, *views):
    """A store filled before 0011 and migrated to 11, with the user's ``views`` on it; its Database (open)."""
    store_before_0011(url, monkeypatch)
    everything = advisor.db.migrations()
    monkeypatch.setattr(advisor.db, "migrations", lambda: {v: m for v, m in everything.items() if v <= 11})
    db = advisor.db.Database(url)
    assert db.migrate() == [10, 11]
    monkeypatch.setattr(advisor.db, "migrations", lambda: everything)
    with db.transaction(write=True) as tx:
        for view in views:
            tx.execute_raw(view)
    return db


def version(db):
    with db.transaction() as tx:
        return tx.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]


def rows(db, sql):
    with db.transaction() as tx:
        return tx.execute(sql).fetchall()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    """An empty store's URL, on each dialect."""
    return f"sqlite:///{tmp_path}/old.sqlite3" if request.param == "sqlite" else request.getfixturevalue("pg_url")


def test_user_views_are_kept_across_the_upgrade(url, monkeypatch):
    db = store_at_11(url, monkeypatch, MY_ADVICE, MY_FLOWS)
    try:
        before = rows(db, "SELECT dest, streams FROM my_flows")
        advice_before = rows(db, "SELECT dest, streams, impact_bound FROM my_advice ORDER BY streams")
        assert before == [(DEST.key, advice_before[-1][1])] and advice_before
        assert db.migrate() == [v for v in sorted(advisor.db.migrations()) if v > 11]
        assert rows(db, "SELECT dest, streams FROM my_flows") == before
        assert rows(db, "SELECT dest, streams, impact_bound FROM my_advice ORDER BY streams") == advice_before
        # The store's own views are the new schema's (0012 gave current_advice its src).
        assert rows(db, "SELECT DISTINCT src FROM current_advice") == [("test-site",)]
        assert db.migrate() == []  # nothing pending: the views are left alone
        assert rows(db, "SELECT dest, streams FROM my_flows") == before
    finally:
        db.close()


def _with_a_migration_dropping_probed_at(monkeypatch):
    """A later migration (in memory, numbered after the newest file) whose current_advice has no probed_at."""
    everything = advisor.db.migrations()
    later = max(everything) + 1
    sql = """DROP VIEW current_advice;
CREATE VIEW current_advice AS
SELECT cf.src, cf.dest, cf.congestion_control, cf.id AS fit_id, cf.model, cf.regime, cf.fitted_at,
       c.streams, c.throughput_bps, c.impact, c.impact_bound
FROM current_fits cf JOIN curve_points c ON c.fit_id = cf.id WHERE c.advisable = 1;"""
    monkeypatch.setattr(advisor.db, "migrations", lambda: {**everything, later: ("no_probed_at", sql)})
    return later


def test_a_view_the_new_schema_cannot_hold_stops_the_upgrade(url, monkeypatch):
    if url.startswith("sqlite"):
        # SQLite keeps my_advice's "*" as written: it takes the new columns, and my_ages is the first that fails.
        failing, definition = "my_ages", "max(probed_at)"
    else:
        # PostgreSQL expanded my_advice's "*" into the columns current_advice had when it was made, probed_at too.
        failing, definition = "my_advice", "current_advice.probed_at"
    db = store_at_11(url, monkeypatch, MY_ADVICE, MY_AGES, "CREATE VIEW my_newest AS SELECT max(probed_at) AS at FROM my_ages")
    try:
        ages = rows(db, "SELECT dest, probed_at FROM my_ages")
        later = _with_a_migration_dropping_probed_at(monkeypatch)
        with pytest.raises(StoreError) as raised:
            db.migrate()
        message = str(raised.value)
        assert re.search(rf"your view \S*\b{failing}\b", message) and "probed_at" in message, message
        assert f"version {later}" in message and "version 11" in message, message
        assert "CREATE VIEW" in message and definition in message, message  # its saved definition
        assert "DROP VIEW" in message and "my_newest" in message, message  # what to do, and the views built on it
        # Rolled back: the store is at 11, the user's views answer as before, 0012 is not half applied.
        assert version(db) == 11
        assert rows(db, "SELECT dest, probed_at FROM my_ages") == ages
        assert rows(db, "SELECT count(*) FROM my_newest") == [(1,)]
        assert rows(db, "SELECT count(*) FROM my_advice")[0][0] > 0
        with pytest.raises(StoreError, match="src"):
            with db.transaction() as tx:
                tx.execute("SELECT src FROM current_advice")
        # Following the advice: drop what reads the column, upgrade, and make it again without it.
        reads_it = ("my_newest", "my_ages") + (("my_advice",) if failing == "my_advice" else ())
        with db.transaction(write=True) as tx:
            for view in reads_it:
                tx.execute(f"DROP VIEW {view}")
        assert later in db.migrate()
        if "my_advice" in reads_it:
            with db.transaction(write=True) as tx:
                tx.execute_raw(MY_ADVICE)
        assert rows(db, "SELECT count(*) FROM my_advice")[0][0] > 0
    finally:
        db.close()


@pytest.mark.postgres
def test_on_postgres_a_kept_view_keeps_its_schema_options_owner_grants_comments_defaults_triggers_and_rules(
        pg_url, monkeypatch):
    import psycopg

    role = "tame_test_reader"
    db = store_at_11(pg_url, monkeypatch, "CREATE SCHEMA sched", MY_ADVICE,
                     "CREATE VIEW sched.flows WITH (security_barrier = true) AS "
                     "SELECT dest, max(streams) AS streams FROM my_advice GROUP BY dest",
                     f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN "
                     f"CREATE ROLE {role}; END IF; END $$",
                     f"GRANT USAGE ON SCHEMA sched TO {role}",
                     f"GRANT SELECT ON sched.flows TO {role}",
                     f"GRANT SELECT ON my_advice TO {role}",  # sched.flows reads it as its owner, the role
                     "GRANT SELECT (dest, streams) ON my_advice TO PUBLIC",
                     "COMMENT ON VIEW sched.flows IS 'streams per destination, budget 0.5'",
                     "COMMENT ON COLUMN sched.flows.streams IS 'at most'",
                     "ALTER VIEW sched.flows ALTER COLUMN streams SET DEFAULT 1",
                     "CREATE RULE flows_no_delete AS ON DELETE TO sched.flows DO INSTEAD NOTHING",
                     "CREATE FUNCTION sched.ignore() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
                     "CREATE TRIGGER flows_ignore INSTEAD OF INSERT ON sched.flows FOR EACH ROW "
                     "EXECUTE FUNCTION sched.ignore()",
                     f"ALTER VIEW sched.flows OWNER TO {role}")
    try:
        assert 12 in db.migrate()
        with db.transaction() as tx:
            kept = tx.execute("SELECT has_table_privilege(?, 'sched.flows', 'SELECT'), "
                              "has_table_privilege(?, 'public.my_advice', 'SELECT'), "
                              "(SELECT attacl::text FROM pg_attribute WHERE attrelid = 'my_advice'::regclass "
                              " AND attname = 'streams'), "
                              "obj_description('sched.flows'::regclass, 'pg_class'), "
                              "col_description('sched.flows'::regclass, 2), "
                              "(SELECT reloptions FROM pg_class WHERE oid = 'sched.flows'::regclass), "
                              "pg_get_userbyid((SELECT relowner FROM pg_class WHERE oid = 'sched.flows'::regclass)), "
                              "(SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = 'sched.flows'::regclass), "
                              "(SELECT count(*) FROM pg_trigger WHERE tgrelid = 'sched.flows'::regclass), "
                              "(SELECT count(*) FROM pg_rules WHERE rulename = 'flows_no_delete')",
                              (role, role)).fetchone()
            # PUBLIC ("" before "=") may read the column; the grantor is whoever ran the GRANT.
            assert kept[2].startswith("{=r/"), kept
            assert kept[:2] + kept[3:] == (True, True, "streams per destination, budget 0.5", "at most",
                                           ["security_barrier=true"], role, "1", 1, 1)
            assert tx.execute("SELECT count(*) FROM sched.flows").fetchone()[0] == 1
    finally:
        db.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


@pytest.mark.postgres
@pytest.mark.parametrize("made, says, still", [
    # A materialized view holds data and indexes of its own: the user's to drop and make again.
    ("CREATE MATERIALIZED VIEW my_snapshot AS SELECT * FROM current_advice",
     ("my_snapshot", "DROP MATERIALIZED VIEW"), "SELECT count(*) FROM my_snapshot"),
    # Only views are kept: a function whose SQL body reads current_advice makes 0012's DROP VIEW fail, and the
    # error says so, with PostgreSQL's own detail naming the function.
    ("CREATE FUNCTION advised() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM current_advice; END",
     ("advised()", "only views are kept"), "SELECT advised()"),
], ids=["materialized-view", "function"])
def test_on_postgres_what_cannot_be_kept_stops_the_upgrade_naming_it(pg_url, monkeypatch, made, says, still):
    db = store_at_11(pg_url, monkeypatch, made)
    try:
        with pytest.raises(StoreError) as raised:
            db.migrate()
        message = str(raised.value)
        assert all(words in message for words in says) and "version 11" in message, message
        assert version(db) == 11
        assert rows(db, still)[0][0] > 0
    finally:
        db.close()


def test_the_store_s_own_views_are_the_ones_a_new_store_has(tmp_path):
    """userviews.STORE_VIEWS names every view the migrations make: any other view is a user's, kept across upgrades."""
    db = advisor.db.Database(f"sqlite:///{tmp_path}/new.sqlite3")
    try:
        db.migrate()
        assert {name for (name,) in rows(db, "SELECT name FROM sqlite_master WHERE type = 'view'")} == set(STORE_VIEWS)
    finally:
        db.close()
