"""One Database holds a bounded set of connections, however many threads come and go (advisor/pool.py): on a real
SQLite file (its open descriptors counted in /proc) and on real PostgreSQL (pg_stat_activity)."""

import os
import threading
import time

import psycopg
import pytest

from advisor.db import Database
from advisor.errors import StoreError
from advisor.pool import ConnectionPool

SIZE = 4
WAVES = 5
THREADS_PER_WAVE = 12  # three times SIZE: most threads of a wave wait for a connection


def run_wave(db: Database, threads: int = THREADS_PER_WAVE) -> None:
    """``threads`` new threads, started together, each writing one row and reading it back; they all end."""
    start = threading.Barrier(threads)
    errors = []

    def work(n: int) -> None:
        try:
            start.wait()
            with db.transaction(write=True) as tx:
                tx.execute("INSERT INTO hits (thread) VALUES (?)", (n,))
            with db.transaction() as tx:
                assert tx.execute("SELECT count(*) FROM hits WHERE thread = ?", (n,)).fetchone()[0] >= 1
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert not worker.is_alive(), "a transaction hung"
    assert errors == []


def sqlite_descriptors(path) -> int:
    """This process's open file descriptors on the SQLite file ``path`` (one per connection; -wal and -shm apart)."""
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:  # closed since listed
            pass
    return count


def make_hits(db: Database) -> None:
    with db.transaction(write=True) as tx:
        tx.execute(f"CREATE TABLE hits (id {'INTEGER PRIMARY KEY' if db.dialect == 'sqlite' else 'SERIAL'}, "
                   "thread INTEGER NOT NULL)")


def hold_connections(db: Database, n: int):
    """``n`` threads each inside a transaction until the returned event is set: (event, threads)."""
    inside, leave = threading.Barrier(n + 1), threading.Event()

    def hold() -> None:
        with db.transaction():
            inside.wait()
            leave.wait(60)

    threads = [threading.Thread(target=hold) for _ in range(n)]
    for thread in threads:
        thread.start()
    inside.wait(60)
    return leave, threads


def test_waves_of_threads_keep_the_sqlite_descriptors_bounded(tmp_path):
    path = tmp_path / "s.sqlite3"
    db = Database(f"sqlite:///{path}", pool_size=SIZE)
    make_hits(db)
    # Each wave's threads are new ones, as anyio's workers are after 10 s idle; a connection per thread ever seen
    # would leave 1 + 12, 1 + 24, ... descriptors open.
    for _ in range(WAVES):
        run_wave(db)
        assert db.open_connections <= SIZE
        assert 1 <= sqlite_descriptors(path) <= SIZE
    with db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM hits").fetchone()[0] == WAVES * THREADS_PER_WAVE
    db.close()
    assert db.open_connections == 0 and sqlite_descriptors(path) == 0


def test_a_burst_larger_than_the_pool_waits_for_a_connection(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/s.sqlite3", pool_size=2)
    make_hits(db)
    leave, holders = hold_connections(db, 2)
    done = threading.Event()

    def late() -> None:
        with db.transaction(write=True) as tx:
            tx.execute("INSERT INTO hits (thread) VALUES (99)")
        done.set()

    waiter = threading.Thread(target=late)
    waiter.start()
    # Both connections are in use: the third transaction cannot have begun.
    assert not done.wait(0.3) and db.open_connections == 2
    leave.set()
    for thread in (*holders, waiter):
        thread.join(60)
    assert done.is_set() and db.open_connections == 2
    db.close()


def test_a_transaction_that_waits_too_long_gets_a_store_error(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/s.sqlite3", pool_size=1, pool_wait_s=0.2)
    leave, holders = hold_connections(db, 1)
    try:
        with pytest.raises(StoreError, match=r"advice store unavailable: all 1 of its connections stayed in use "
                                             r"for 0.2 s \(TAME_DB_POOL_SIZE\)"):
            with db.transaction():
                pass
    finally:
        leave.set()
        holders[0].join(60)
    with db.transaction() as tx:  # the connection came back
        assert tx.execute("SELECT 1").fetchone() == (1,)
    db.close()


def test_a_transaction_opened_inside_another_of_the_same_thread_is_refused(tmp_path):
    # With one connection, the inner transaction would wait for the outer one's connection for ever (here, until
    # pool_wait_s, with the pool's message): it is refused at once, saying why, and the outer one rolls back.
    db = Database(f"sqlite:///{tmp_path}/s.sqlite3", pool_size=1, pool_wait_s=0.2)
    make_hits(db)
    nested = r"a transaction was opened while this thread already holds one of the same advice store"
    with pytest.raises(StoreError, match=nested):
        with db.transaction(write=True) as tx:
            tx.execute("INSERT INTO hits (thread) VALUES (1)")
            with db.transaction():
                pass
    with pytest.raises(StoreError, match=nested):
        with db.transaction():
            db.migrate()
    # The thread holds nothing after either: its transactions open as before, and the first wrote nothing.
    with db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM hits").fetchone()[0] == 0
    assert db.open_connections == 1
    db.close()


def test_threads_each_in_a_transaction_at_once_are_not_taken_for_nested_ones(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/s.sqlite3", pool_size=2)
    leave, holders = hold_connections(db, 1)
    try:
        with db.transaction() as tx:
            assert tx.execute("SELECT 1").fetchone() == (1,)
    finally:
        leave.set()
        holders[0].join(60)
    db.close()


def test_close_closes_idle_connections_at_once_and_busy_ones_when_they_end(tmp_path):
    path = tmp_path / "s.sqlite3"
    db = Database(f"sqlite:///{path}", pool_size=SIZE)
    make_hits(db)
    run_wave(db, SIZE)  # SIZE threads at once: up to SIZE connections, all idle now
    leave, holders = hold_connections(db, 1)
    db.close()  # does not wait for the transaction
    leave.set()
    holders[0].join(60)
    # Only now: SQLite keeps a closed connection's descriptor while another of the process holds a lock on the file
    # (closing it would drop the process's POSIX locks), and the one in a transaction is closed as it ends.
    assert sqlite_descriptors(path) == 0
    with db.transaction() as tx:  # a closed store opens connections again when used, as it always has
        assert tx.execute("SELECT count(*) FROM hits").fetchone()[0] == SIZE
    db.close()
    assert sqlite_descriptors(path) == 0


def test_a_connection_that_cannot_be_opened_gives_its_place_back():
    # Port 1 refuses at once. Were the failed attempt's place kept, the second transaction would wait for the pool
    # instead of trying again.
    db = Database("postgresql://tame:s3cretPW@127.0.0.1:1/tame", pool_size=1, pool_wait_s=5)
    for _ in range(2):
        with pytest.raises(StoreError, match="^cannot open the advice store postgresql://tame:\\*\\*\\*@"):
            with db.transaction():
                pass
    assert db.open_connections == 0


def test_the_pool_never_opens_more_than_its_size():
    opened, closed = [], []

    def connect():
        opened.append(object())
        return opened[-1]

    pool = ConnectionPool(connect, closed.append, size=2, wait_s=0.05)
    a, b = pool.acquire(), pool.acquire()
    with pytest.raises(StoreError):
        pool.acquire()
    pool.release(a)
    assert pool.acquire() is a  # reused, not a third
    pool.release(b, broken=True)  # closed, and its place freed for a new one
    assert closed == [b] and pool.open_count == 1
    c = pool.acquire()
    assert c is opened[2] and pool.open_count == 2
    pool.close()
    assert closed == [b] and pool.open_count == 2  # both in use: closed when released
    pool.release(a)
    pool.release(c)
    assert closed == [b, a, c] and pool.open_count == 0
    with pytest.raises(StoreError, match="closed"):
        pool.acquire()



def test_an_idle_connection_no_longer_alive_is_closed_at_checkout_and_another_given():
    opened, closed, dead = [], [], set()

    def connect():
        opened.append(object())
        return opened[-1]

    pool = ConnectionPool(connect, closed.append, size=2, wait_s=0.05, alive=lambda conn: conn not in dead)
    a, b = pool.acquire(), pool.acquire()
    pool.release(a)
    pool.release(b)
    dead.update((a, b))  # the server ended both while they were idle
    c = pool.acquire()
    assert c is opened[2] and sorted(map(id, closed)) == sorted(map(id, (a, b))) and pool.open_count == 1
    pool.release(c)
    assert pool.acquire() is c  # alive: reused


# -- PostgreSQL ----------------------------------------------------------------------------------------------------


def server_connections(url: str, monitor: psycopg.Connection) -> int:
    """The server's client connections to the test database, the monitor's own apart."""
    return monitor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchone()[0]


@pytest.mark.postgres
def test_waves_of_threads_keep_the_postgresql_connections_bounded(pg_url):
    db = Database(pg_url, pool_size=SIZE)
    make_hits(db)
    with psycopg.connect(pg_url, autocommit=True) as monitor:
        for _ in range(WAVES):
            run_wave(db)
            assert 1 <= server_connections(pg_url, monitor) <= SIZE
            assert db.open_connections == server_connections(pg_url, monitor)
        db.close()
        # A backend leaves pg_stat_activity a moment after its client has gone.
        deadline = time.monotonic() + 10
        while server_connections(pg_url, monitor) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server_connections(pg_url, monitor) == 0


@pytest.mark.postgres
def test_an_idle_connection_its_server_ended_is_replaced_before_a_transaction_uses_it(pg_url):
    db = Database(pg_url, pool_size=1)
    with db.transaction() as tx:
        pid = tx.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10  # the backend has gone, its goodbye sent
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    # The goodbye is on the idle connection's socket: it is closed at checkout, not handed to the transaction, which
    # runs on a new one (as after a server restart: no transaction fails for it).
    with db.transaction() as tx:
        assert tx.execute("SELECT pg_backend_pid()").fetchone()[0] != pid
    assert db.open_connections == 1
    db.close()
