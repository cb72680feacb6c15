"""A database URL's password never reaches a message: redact_url, and the errors of opening a store (real psycopg)."""

import pytest

from advisor.db import Database, check_database_url, redact_url
from advisor.errors import StoreError
from advisor.store import Store


@pytest.mark.parametrize("url, shown", [
    ("postgresql://tame:s3cretPW@db:5432/tame", "postgresql://tame:***@db:5432/tame"),
    ("postgres://tame:s3cretPW@db/tame", "postgres://tame:***@db/tame"),
    # libpq takes a password as a parameter too, in a URL or in its key=value form.
    ("postgresql://tame@db/tame?sslmode=require&password=s3cretPW",
     "postgresql://tame@db/tame?sslmode=require&password=***"),
    ("postgresql://tame:s3cretPW@db/tame?PASSWORD=other", "postgresql://tame:***@db/tame?PASSWORD=***"),
    ("host=db password='s3cret PW' user=tame", "host=db password=*** user=tame"),
    # A password holding @ or / (not percent-encoded) is hidden whole, up to the last @ before the query.
    ("postgresql://tame:s3cr@t/PW@db:5432/tame", "postgresql://tame:***@db:5432/tame"),
    ("postgresql://u:p?ssWORDX@db/tame", "postgresql://u:***@db/tame"),
    ("postgresql://u:p:ss?x=1&y@db/tame?sslmode=require", "postgresql://u:***@db/tame?sslmode=require"),
    # libpq percent-decodes a parameter's name, and sslpassword unlocks a client key.
    ("postgresql://tame@db/tame?pass%77ord=s3cretPW", "postgresql://tame@db/tame?pass%77ord=***"),
    ("postgresql://tame@db/tame?sslmode=verify-full&sslpassword=s3cretPW",
     "postgresql://tame@db/tame?sslmode=verify-full&sslpassword=***"),
    ("mysql://tame:s3cretPW@db/tame", "mysql://tame:***@db/tame"),
    # Nothing to hide: no password, a port after the host, an empty password, a SQLite path with : and @.
    ("postgresql://tame@db:5432/tame", "postgresql://tame@db:5432/tame"),
    ("postgresql://db:5432/tame", "postgresql://db:5432/tame"),
    ("sqlite:////data/a:b@c.sqlite3", "sqlite:////data/a:b@c.sqlite3"),
])
def test_redact_url_shows_every_password_as_stars(url, shown):
    assert redact_url(url) == shown


# Hostile and broken PostgreSQL URLs, each with the password pieces that must not be printed. Port 1 on loopback
# refuses at once; libpq repeats a password it cannot percent-decode, and reads the part of a password after an @
# as the host.
UNREACHABLE = [
    ("postgresql://tame:s3cretPW@127.0.0.1:1/tame", ["s3cretPW"], "Connection refused"),
    ("postgresql://tame:s3cr%zzetPW@127.0.0.1:1/tame", ["s3cr", "zzetPW"], "invalid percent-encoded token"),
    ("postgresql://tame:s3cr@tPWxx@127.0.0.1:1/tame", ["s3cr", "tPWxx"], "failed to resolve host"),
    ("postgresql://tame@127.0.0.1:1/tame?password=s3cretPW&x=1", ["s3cretPW"], "invalid URI query parameter"),
    ("postgres://tame:s3cretPW@127.0.0.1:notaport/tame", ["s3cretPW"], "notaport"),
    ("postgresql://u:p?ssWORDX@127.0.0.1:1/tame", ["p?ssWORDX", "ssWORDX"], ""),
]


@pytest.mark.parametrize("url, secrets, says", UNREACHABLE)
def test_a_store_that_cannot_be_opened_is_reported_without_its_password(url, secrets, says):
    with pytest.raises(StoreError) as raised:
        Store.open(url)
    message = str(raised.value)
    assert message.startswith(f"cannot open the advice store {redact_url(url)}: ") and says in message, message
    # Nor is it in a chained exception (cause or context), which a logged traceback would print.
    for error in (raised.value, raised.value.__cause__, raised.value.__context__):
        for secret in secrets:
            assert secret not in str(error or ""), (secret, message)


def test_an_unsupported_url_is_refused_without_its_password():
    with pytest.raises(StoreError) as raised:
        Database("mysql://tame:s3cretPW@db/tame")
    assert "'mysql://tame:***@db/tame'" in str(raised.value) and "s3cretPW" not in str(raised.value)


def test_sqlite_commits_are_synced_so_an_acknowledged_write_survives_a_host_crash(tmp_path):
    # WAL with synchronous NORMAL may lose committed transactions on power loss; FULL (2) syncs at every commit.
    db = Database(f"sqlite:///{tmp_path / 'tame.sqlite3'}")
    try:
        with db.transaction() as tx:
            assert tx.execute("PRAGMA synchronous").fetchone()[0] == 2
            assert tx.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


# URLs that name no one store: SQLite's in-memory or empty path (a private empty database per pooled connection:
# "no such table: current_fits" 503s), a '?' that became part of the file's name, and PostgreSQL URLs that leave the
# host or the database to libpq's defaults (this machine's server through its socket, as the OS user).
NO_ONE_STORE = [
    ("sqlite:///", "names no file"),
    ("sqlite:///:memory:", "names no file"),
    ("sqlite:///{tmp}/a.db?mode=ro", "holds '?'"),
    ("postgres://", "names no host and no database"),
    ("postgresql://", "names no host and no database"),
    ("postgresql://tame:s3cretPW@/tame", "names no host"),
    ("postgresql://tame:s3cretPW@:5432/tame", "names no host"),
    ("postgresql://tame:s3cretPW@db:5432", "names no database"),
    ("postgresql://tame:s3cretPW@db:5432/", "names no database"),
]


@pytest.fixture
def no_connection(monkeypatch):
    """Any connection to PostgreSQL fails the test: these URLs would reach this machine's server."""
    import psycopg

    monkeypatch.setattr(psycopg, "connect", lambda *args, **kwargs: pytest.fail(f"{args} was connected to"))


@pytest.mark.parametrize("url, says", NO_ONE_STORE)
def test_a_url_that_names_no_one_store_is_refused_before_anything_is_opened(tmp_path, no_connection, url, says):
    url = url.format(tmp=tmp_path)
    with pytest.raises(StoreError) as raised:
        check_database_url(url, "TAME_DATABASE_URL")
    assert str(raised.value).startswith(f"TAME_DATABASE_URL={redact_url(url)!r} {says}"), raised.value
    assert "s3cretPW" not in str(raised.value) and "use sqlite:///PATH or postgresql://" in str(raised.value)
    with pytest.raises(StoreError, match=says):
        Database(url)
    assert list(tmp_path.iterdir()) == []  # no file named a.db?mode=ro


@pytest.mark.parametrize("url", ["sqlite:///tame.sqlite3", "postgresql://tame:s3cretPW@db:5432/tame", "postgres://db/t",
                                 "postgresql://[::1]:5432/tame", "postgresql:///tame?host=/run/pg",
                                 "postgresql://db?dbname=tame", "postgresql://u:p?ssWORDX@db/tame"])
def test_a_url_that_names_one_store_is_taken(url):
    assert check_database_url(url) == url


def test_a_store_in_a_folder_this_user_may_not_search_is_reported_not_raised_as_a_traceback(tmp_path, monkeypatch):
    # `tame paths` (which makes no store) run by an operator on the store of the service's own user, kept in a folder
    # only that user may search: Python before 3.14 raised PermissionError from the check that the file is there (a
    # traceback where opening it said "unable to open database file"). Neither is a folder that cannot be made.
    import os

    locked = tmp_path / "locked"
    Store.open(f"sqlite:///{locked}/s.sqlite3").close()
    real_stat, real_mkdir = os.stat, os.mkdir

    def refused(real):
        def call(path, *args, **kwargs):
            if str(path).startswith(f"{locked}/"):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "stat", refused(real_stat))
    monkeypatch.setattr(os, "mkdir", refused(real_mkdir))
    with pytest.raises(StoreError, match=f"Permission denied .{locked}/s.sqlite3"):
        Database(f"sqlite:///{locked}/s.sqlite3", create=False)
    with pytest.raises(StoreError, match=f"Permission denied .{locked}/new"):
        Database(f"sqlite:///{locked}/new/s.sqlite3")
