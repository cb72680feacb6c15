"""Retention (advisor/retention.py) run by two replicas of the service at once on one store, each with its own Store
(its own connections) in a thread of its own: PostgreSQL (the fixture's real server), and a SQLite file."""

import threading
import time
from dataclasses import replace

import psycopg
import pytest

import advisor.retention as retention
from advisor.retention import Pruner, Retention, prune
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import REFIT_OBSERVATIONS, Store
from tests.sites import SITE

DAY = 86400.0
NOW = 1_800_000_000.0
RETENTION = Retention(keep_fits=5, keep_runs=3, run_max_age_s=10 * DAY, keep_observations=REFIT_OBSERVATIONS,
                      batch=100, interval_s=0)
TABLES = ("destinations", "link_controls", "observations")
IN_USE, IDLE, EXTRA, CONTROLS, PER_IDLE_CONTROL = 100, 50, 50, 4, 5
FIRST_LINK = "127.9.0.1:5201"  # loopback: a destination the default settings allow


class Fixed:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def fill(store, in_use=IN_USE, idle=IDLE, extra=EXTRA, controls=CONTROLS):
    """``in_use`` links observed today under c0 (after REFIT_OBSERVATIONS - 1 + ``extra`` observations 40 days old,
    ``extra`` of them past those kept) and not since 40 days under c1..: those controls go; ``idle`` links with
    nothing newer than 40 days under any control: they go. Each idle control holds PER_IDLE_CONTROL observations."""
    old = NOW - 40 * DAY
    with store.db.transaction(write=True) as tx:
        tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) SELECT ?, '127.9.' || (g / 250) || "
                   "'.' || (mod(g, 250) + 1) || ':5201', '127.9.' || (g / 250) || '.' || (mod(g, 250) + 1), 5201, ? "
                   "FROM generate_series(0, ?) g ORDER BY g", (SITE, old, in_use + idle - 1))
        (first,) = tx.execute("SELECT min(id) FROM destinations").fetchone()
        tx.execute("INSERT INTO link_controls (destination_id, congestion_control) SELECT d.id, 'c' || c "
                   "FROM destinations d, generate_series(0, ?) c", (controls - 1,))
        # Ids in time order, the newest (today's) last: the observations kept are the newest ids.
        tx.execute("INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                   "congestion_control, tame_streams) SELECT d.id, 2 + mod(j, 7), 1e8, "
                   "CASE WHEN j = 0 THEN ? ELSE ? - j END, 'c0', 0 FROM destinations d, generate_series(0, ?) j "
                   "WHERE d.id < ? ORDER BY d.id, j DESC", (NOW, old, REFIT_OBSERVATIONS + extra - 1, first + in_use))
        tx.execute("INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                   "congestion_control, tame_streams) SELECT lc.destination_id, 2, 1e8, ? - j, lc.congestion_control, 0 "
                   "FROM link_controls lc, generate_series(1, ?) j WHERE lc.congestion_control <> 'c0' OR "
                   "lc.destination_id >= ?", (old, PER_IDLE_CONTROL, first + in_use))


def rows(store):
    with store.db.transaction() as tx:
        return {table: tx.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TABLES}


def replicas(url, n=2):
    return [Store.open(url, clock=Fixed(NOW)) for _ in range(n)]


def at_once(*work):
    """Run each callable in a thread of its own, all started together; their results, or what each raised."""
    start = threading.Barrier(len(work))
    out = [None] * len(work)

    def run(i):
        start.wait()
        try:
            out[i] = work[i]()
        except Exception as exc:  # a deadlock or any store error: reported by the test, not lost in the thread
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads)
    return out


@pytest.mark.postgres
def test_two_replicas_pruning_at_once_delete_each_row_once_without_a_deadlock(pg_url):
    """Two replicas prune at once, each pass after pass until one deletes nothing: neither
    fails (PostgreSQL aborts one of two deadlocked transactions: a StoreError here), the store ends as one replica
    alone leaves it, and the rows the two count deleted, per table, are the rows gone: no row done twice."""
    stores = replicas(pg_url)
    try:
        fill(stores[0])
        before = rows(stores[0])

        def passes(store):
            pruner = Pruner(store, RETENTION, pause_s=0.001)
            done = [pruner.run_pass()]
            while any(done[-1].deleted.values()) and len(done) < 1000:
                done.append(pruner.run_pass())
            return done

        results = at_once(*(lambda s=s: passes(s) for s in stores))
        assert not [r for r in results if isinstance(r, Exception)], results
        after = rows(stores[0])
        assert after == {"destinations": IN_USE, "link_controls": IN_USE, "observations": IN_USE * REFIT_OBSERVATIONS}
        counted = {table: sum(p.deleted.get(table, 0) for done in results for p in done) for table in TABLES}
        # Observations the observations step deleted (past those kept); those of a link or control released are
        # counted with it.
        assert counted == {"destinations": IDLE, "link_controls": before["link_controls"] - after["link_controls"],
                           "observations": IN_USE * EXTRA}, (before, after, counted)
        assert before["link_controls"] - after["link_controls"] == IN_USE * (CONTROLS - 1) + IDLE * CONTROLS
        assert not any(prune(stores[1], RETENTION).deleted.values())  # nothing was left for a later pass
    finally:
        for store in stores:
            store.close()


@pytest.mark.postgres
def test_while_a_replica_holds_a_batch_the_other_prunes_nothing_and_a_write_waits_for_that_batch_only(pg_url,
                                                                                                     monkeypatch):
    """A's batch releasing controls holds its links; meanwhile B's pass ends at once having deleted nothing and
    holding nothing, so a write to one of those links waits for A's batch alone (the only lock not granted is the
    write's, and A's backend is all it waits for), then records its control again."""
    a, b, writer = replicas(pg_url, 3)
    paused, go_on = threading.Event(), threading.Event()
    delete_held = retention._delete_held

    def held_back(tx, ids, control=None):
        delete_held(tx, ids, control)
        if threading.current_thread().name == "replica-a" and not paused.is_set():
            paused.set()
            assert go_on.wait(60)

    monkeypatch.setattr(retention, "_delete_held", held_back)
    service = AdviceService(writer, replace(Settings(), retention=RETENTION), clock=writer.clock)
    try:
        fill(a)
        passed_a, written = [], []
        pruning = threading.Thread(target=lambda: passed_a.append(prune(a, RETENTION)), name="replica-a")
        pruning.start()
        assert paused.wait(60)
        b_pass = prune(b, RETENTION)
        assert not any(b_pass.deleted.values()), b_pass.deleted
        assert b_pass.yielded
        writing = threading.Thread(target=lambda: written.append(
            service.observe(FIRST_LINK, 2, 1e8, congestion_control="c1")))
        writing.start()
        with psycopg.connect(pg_url, autocommit=True) as watcher:
            (a_pid,) = watcher.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND "
                                       "state LIKE 'idle in transaction%' AND backend_xid IS NOT NULL").fetchone()
            deadline = time.monotonic() + 30
            while not (waiting := watcher.execute(
                    "SELECT pid, pg_blocking_pids(pid) FROM pg_locks WHERE NOT granted").fetchall()):
                assert time.monotonic() < deadline, "the write did not wait for A's batch"
                time.sleep(0.05)
            assert [blockers for _, blockers in waiting] == [[a_pid]], (waiting, a_pid)
        go_on.set()
        pruning.join(60)
        writing.join(60)
        assert passed_a and not passed_a[0].yielded and passed_a[0].deleted["link_controls"] > 0
        assert written and written[0]["accepted"]
        with a.db.transaction() as tx:
            assert tx.execute("SELECT count(*) FROM link_controls lc JOIN destinations d ON d.id = lc.destination_id "
                              "WHERE d.dest = ?", (FIRST_LINK,)).fetchone()[0] == 2  # c0, and c1 again
    finally:
        go_on.set()
        for store in (a, b, writer):
            store.close()


def controls(store):
    with store.db.transaction() as tx:
        return [r[0] for r in tx.execute("SELECT congestion_control FROM link_controls ORDER BY 1").fetchall()]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_replica_goes_on_releasing_controls_where_the_other_stopped(tmp_path, request, backend):
    """One (link, control) a batch and one batch a pass: passes taken in turn by two replicas go through
    link_controls in key order as one replica's would (c0 kept, in use; then c1, c2, c3 released, one a pass)."""
    url = f"sqlite:///{tmp_path}/tame.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    stores = replicas(url)
    try:
        if backend == "sqlite":
            fill_sqlite(stores[0])
        else:
            fill(stores[0], in_use=1, idle=0, extra=0)
        pruners = [Pruner(store, replace(RETENTION, batch=1), pause_s=0, max_batches=1) for store in stores]
        released = []
        for turn in range(4):
            released.append(pruners[turn % 2].run_pass().deleted.get("link_controls"))
            assert controls(stores[0]) == ["c0", *[f"c{k}" for k in range(turn + 1, CONTROLS)]]
        assert released == [0, 1, 1, 1]
    finally:
        for store in stores:
            store.close()


def fill_sqlite(store):
    """fill(in_use=1, idle=0, extra=0) without generate_series: one link, observed today under c0 only."""
    old = NOW - 40 * DAY
    with store.db.transaction(write=True) as tx:
        (link,) = tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, 5201, ?) "
                             "RETURNING id", (SITE, FIRST_LINK, FIRST_LINK.split(":")[0], old)).fetchone()
        for k in range(CONTROLS):
            tx.execute("INSERT INTO link_controls (destination_id, congestion_control) VALUES (?, ?)", (link, f"c{k}"))
            tx.execute("INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                       "congestion_control, tame_streams) VALUES (?, 2, 1e8, ?, ?, 0)",
                       (link, NOW if k == 0 else old, f"c{k}"))
