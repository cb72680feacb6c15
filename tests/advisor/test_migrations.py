"""Two replicas of the service starting at once on one PostgreSQL store (two real processes, each opening the store
as `tame serve` does: advisor.store.Store.open): both come up, and each pending migration is applied once."""

import os
import subprocess
import sys
import time

import psycopg
import pytest

import advisor.db
from advisor.locks import MIGRATION_LOCK

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_UP = "import sys; from advisor.store import Store; Store.open(sys.argv[1]).close()"


def versions(url):
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()]


@pytest.mark.postgres
@pytest.mark.parametrize("at", [None, 21], ids=["fresh", "needing-migrations"])
def test_two_replicas_starting_at_once_both_come_up_and_each_migration_is_applied_once(pg_url, monkeypatch, at):
    """The test holds the migrations' lock while both processes start, until both wait for it, then lets them race:
    the first applies what is pending (on a fresh database, all of it), the other then finds it recorded."""
    everything = advisor.db.migrations()
    if at is not None:
        monkeypatch.setattr(advisor.db, "migrations", lambda: {v: m for v, m in everything.items() if v <= at})
        assert advisor.db.Database(pg_url).migrate() == list(range(1, at + 1))
    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        replicas = [subprocess.Popen([sys.executable, "-c", START_UP, pg_url], cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": ROOT}) for _ in range(2)]
        try:
            with psycopg.connect(pg_url, autocommit=True) as watcher:
                deadline = time.monotonic() + 60
                while watcher.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                      "AND objid = %s", (MIGRATION_LOCK,)).fetchone()[0] < 2:
                    assert time.monotonic() < deadline, [p.poll() for p in replicas]
                    time.sleep(0.05)
            holder.rollback()  # both wait for the lock: let them go
            outcomes = [replica.communicate(timeout=120) for replica in replicas]
        finally:
            for replica in replicas:
                if replica.poll() is None:
                    replica.kill()
                    replica.wait()
    assert [replica.returncode for replica in replicas] == [0, 0], outcomes
    assert versions(pg_url) == sorted(everything)
