"""Views users build on the store (a scheduler's ``CREATE VIEW my_advice AS SELECT * FROM current_advice ...``), kept
across an upgrade by :meth:`advisor.db.Database.migrate`.

A migration may drop and make again the store's views and tables (0012 does both); a user's view on them would
stop it (PostgreSQL refuses to drop what a view depends on; SQLite's ALTER TABLE ... RENAME fails on any view
whose table is gone). So, in the upgrade's transaction, the user's views are saved (PostgreSQL: every view that
depends, through pg_depend and pg_rewrite, on a relation of the store's schema, with its options, owner, grants,
comments, column defaults, triggers and rules; SQLite: every view but the store's, with its triggers, from sqlite_master), dropped, the
migrations applied, and the views made again. A view the new schema cannot hold (it read a column that went away)
rolls the whole upgrade back with a StoreError naming it, why, its definition and what to do.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING

from advisor.errors import StoreError

if TYPE_CHECKING:  # advisor.db imports this module
    from advisor.db import Tx

# The views the migrations make; any other view is a user's. A migration that adds a view names it here
# (tests/advisor/test_user_views_migration.py checks a new store has exactly these).
STORE_VIEWS = ("current_fits", "current_advice")


@dataclass(frozen=True)
class SavedView:
    """A user's view as saved before an upgrade: its name, its CREATE VIEW and the statements that restore the rest
    of it (owner, grants, comments, column defaults, triggers, rules)."""

    name: str
    create: str
    extras: tuple[str, ...] = ()


def save(tx: Tx, version: int) -> list[SavedView]:
    """The user's views on the store at schema ``version``, in an order they can be made again in (a view after
    those it reads)."""
    return _save_postgresql(tx, version) if tx.dialect == "postgresql" else _save_sqlite(tx)


def drop(tx: Tx, views: list[SavedView], version: int) -> None:
    """Drop ``views`` (saved by :func:`save`), the ones built on others first."""
    if tx.dialect == "sqlite":
        for view in reversed(views):
            tx.execute_raw(f"DROP VIEW {view.name}")
        return
    from psycopg import errors

    for view in reversed(views):
        try:
            tx.execute_raw(f"DROP VIEW {view.name}")
        except (errors.DependentObjectsStillExist, errors.InsufficientPrivilege) as exc:
            raise StoreError(f"{_unchanged(version)}: your view {view.name}, built on the store's tables or views, must "
                             f"be dropped for the upgrade and made again after it, and PostgreSQL refused to drop it: "
                             f"{_first_line(exc)}. Save its definition ({_statement(view.create)}), drop it and whatever "
                             f"depends on it (as its owner), run the upgrade (start tame again), then create them "
                             f"again") from exc


def restore(tx: Tx, views: list[SavedView], version: int, target: int) -> None:
    """Make ``views`` again on the migrated schema; StoreError (the caller rolls the upgrade back) naming the first
    one the new schema cannot hold."""
    for index, view in enumerate(views):
        try:
            tx.execute_raw(view.create)
            if tx.dialect == "sqlite":
                # SQLite checks a view's columns when it is read, not when it is made.
                tx.execute_raw(f"SELECT * FROM {view.name} LIMIT 0")
            for statement in view.extras:
                tx.execute_raw(statement)
        except _schema_errors(tx.dialect) as exc:
            if not _fits_no_longer(exc):
                raise  # busy, I/O, a lost connection, ...: not the view's doing
            later = ", ".join(v.name for v in views[index + 1:])
            raise StoreError(
                f"{_unchanged(version, target)}: your view {view.name}, built on the store's views, cannot be made "
                f"again on the new schema: {_first_line(exc)}. Its definition: {_statement(view.create)}. To upgrade: save that "
                f"definition, DROP VIEW {view.name} (and any view of yours built on it"
                f"{'; kept with it: ' + later if later else ''}), run the upgrade (start tame again), then create it "
                f"again, changed to read what the new schema has (docs/advice-service.md#the-store)") from exc


def _schema_errors(dialect: str) -> tuple[type[Exception], ...]:
    """The exception classes holding the errors a view's definition meets on a schema it does not fit (a column or
    table gone, a type changed); :func:`_fits_no_longer` picks those errors out of them."""
    if dialect == "sqlite":
        return (sqlite3.OperationalError,)
    import psycopg

    return (psycopg.ProgrammingError,)


def _fits_no_longer(exc: Exception) -> bool:
    """SQLite's plain SQL error (SQLITE_ERROR: no such column, table or function), PostgreSQL's class 42 (undefined
    column, table or function, datatype mismatch, ...)."""
    if isinstance(exc, sqlite3.Error):
        return exc.sqlite_errorcode == sqlite3.SQLITE_ERROR
    return (getattr(exc, "sqlstate", None) or "").startswith("42")


def blocking_errors(dialect: str) -> tuple[type[Exception], ...]:
    """The errors a migration meets when something of the user's that :func:`save` does not keep depends on what it
    drops (PostgreSQL: a function whose SQL body reads a store view); none on SQLite, which does not check."""
    if dialect == "sqlite":
        return ()
    from psycopg import errors

    return (errors.DependentObjectsStillExist,)


def blocked(exc: Exception, version: int, target: int) -> StoreError:
    """The StoreError for a migration stopped by one of :func:`blocking_errors`."""
    detail = getattr(getattr(exc, "diag", None), "message_detail", None) or ""
    return StoreError(f"{_unchanged(version, target)}: {_first_line(exc)}"
                      f"{' (' + '; '.join(detail.splitlines()) + ')' if detail else ''}. Objects of yours other than "
                      f"views depend on the store's, and only views are kept across an upgrade: save their "
                      f"definitions, drop them, run the upgrade (start tame again), then create them again")


def _unchanged(version: int, target: int | None = None) -> str:
    """How an upgrade error begins: what became of the upgrade (to ``target``, when it had begun), and of the store."""
    what = "the upgrade stopped before it began" if target is None else f"the upgrade to schema version {target} was rolled back"
    return f"{what}, nothing changed (the store is still at schema version {version})"


def _statement(sql: str) -> str:
    """A saved statement as a message quotes it (pg_get_viewdef ends it with ';', the message goes on)."""
    return sql.strip().rstrip(";")


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _save_sqlite(tx: Tx) -> list[SavedView]:
    views = tx.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'view' AND name NOT IN (?, ?) ORDER BY rowid", STORE_VIEWS
    ).fetchall()
    triggers = tx.execute("SELECT tbl_name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY rowid").fetchall()
    # SQLite makes a view without reading what it reads (restore checks it after), so the order is not needed; the
    # order they were made in is kept anyway.
    return [SavedView(_quote(name), sql, tuple(t_sql for table, t_sql in triggers if table == name))
            for name, sql in views]


# Every relation that depends, through a view's rewrite rule, on a table or view of the store's schema (the one
# schema_migrations is in), at its longest distance from one; its CREATE VIEW and what restores the rest of it: owner,
# comments, grants (the view's and its columns'), column defaults, triggers and rules.
_POSTGRESQL_DEPENDENTS = """
WITH RECURSIVE store AS (
    SELECT relnamespace AS ns FROM pg_class WHERE oid = 'schema_migrations'::regclass
), dependent (oid, depth) AS (
    SELECT r.ev_class, 1
    FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class base ON base.oid = d.refobjid
    WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
      AND base.relnamespace = (SELECT ns FROM store) AND base.relkind IN ('r', 'p', 'v') AND r.ev_class <> d.refobjid
  UNION
    SELECT r.ev_class, dependent.depth + 1
    FROM dependent JOIN pg_depend d ON d.refobjid = dependent.oid AND d.refclassid = 'pg_class'::regclass
         AND d.classid = 'pg_rewrite'::regclass
    JOIN pg_rewrite r ON r.oid = d.objid
    WHERE r.ev_class <> d.refobjid AND dependent.depth < 100
), named AS (
    SELECT c.oid, c.relkind, max(dependent.depth) AS depth,
           quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name
    FROM dependent JOIN pg_class c ON c.oid = dependent.oid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE NOT (c.relnamespace = (SELECT ns FROM store) AND c.relname = ANY(?))
    GROUP BY c.oid, c.relkind, n.nspname, c.relname
)
SELECT named.name, named.relkind,
       'CREATE ' || CASE WHEN named.relkind = 'm' THEN 'MATERIALIZED ' ELSE '' END || 'VIEW ' || named.name
           || coalesce(' WITH (' || array_to_string(c.reloptions, ', ') || ')', '') || ' AS ' || pg_get_viewdef(c.oid),
       array_remove(ARRAY[
           'ALTER VIEW ' || named.name || ' OWNER TO ' || quote_ident(pg_get_userbyid(c.relowner)),
           'COMMENT ON VIEW ' || named.name || ' IS ' || quote_literal(obj_description(c.oid, 'pg_class'))]
         || ARRAY(SELECT 'GRANT ' || a.privilege_type || ' ON ' || named.name || ' TO '
                         || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                         || CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
                  FROM aclexplode(c.relacl) a)
         || ARRAY(SELECT 'GRANT ' || a.privilege_type || ' (' || quote_ident(att.attname) || ') ON ' || named.name
                         || ' TO ' || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                         || CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
                  FROM pg_attribute att, aclexplode(att.attacl) a
                  WHERE att.attrelid = c.oid AND att.attnum > 0 AND att.attacl IS NOT NULL)
         || ARRAY(SELECT 'ALTER VIEW ' || named.name || ' ALTER COLUMN ' || quote_ident(att.attname) || ' SET DEFAULT '
                         || pg_get_expr(ad.adbin, ad.adrelid)
                  FROM pg_attrdef ad JOIN pg_attribute att ON att.attrelid = ad.adrelid AND att.attnum = ad.adnum
                  WHERE ad.adrelid = c.oid)
         || ARRAY(SELECT 'COMMENT ON COLUMN ' || named.name || '.' || quote_ident(att.attname) || ' IS '
                         || quote_literal(ds.description)
                  FROM pg_description ds JOIN pg_attribute att ON att.attrelid = ds.objoid AND att.attnum = ds.objsubid
                  WHERE ds.objoid = c.oid AND ds.classoid = 'pg_class'::regclass AND ds.objsubid > 0)
         || ARRAY(SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal)
         || ARRAY(SELECT pg_get_ruledef(r.oid) FROM pg_rewrite r WHERE r.ev_class = c.oid AND r.rulename <> '_RETURN'),
         NULL)
FROM named JOIN pg_class c ON c.oid = named.oid
ORDER BY named.depth, c.oid
"""


def _save_postgresql(tx: Tx, version: int) -> list[SavedView]:
    rows = tx.execute(_POSTGRESQL_DEPENDENTS, (list(STORE_VIEWS),)).fetchall()
    others = [(name, create) for name, kind, create, _ in rows if kind != "v"]
    if others:
        # A materialized view holds data and indexes of its own: it is the user's to drop and make again.
        name, create = others[0]
        raise StoreError(f"{_unchanged(version)}: your materialized view {name} is built on the store's tables or "
                         f"views, which the upgrade may drop and make again, and it cannot be kept across that. Save its definition ({_statement(create)}) and its indexes, DROP "
                         f"MATERIALIZED VIEW {name}, run the upgrade (start tame again), then create it again"
                         + (f"; the same for {', '.join(n for n, _ in others[1:])}" if others[1:] else ""))
    return [SavedView(name, create, tuple(extras)) for name, kind, create, extras in rows]
