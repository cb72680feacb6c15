"""How long releasing links' congestion controls (advisor.retention, its controls step) holds the store.

    python -m benchmarks.prune_controls                                # 2,000 links x 8 controls, 1,000,000 observations
    python -m benchmarks.prune_controls --links 200 --observations 100000
    python -m benchmarks.prune_controls --postgres                     # a throwaway PostgreSQL cluster
    python -m benchmarks.prune_controls --database-url postgresql://USER@HOST/EMPTY_DB

Fills a fresh store (a SQLite file in a temporary folder; with --postgres a throwaway PostgreSQL cluster,
tests.conftest.throwaway_cluster, run from the repository root; or the empty database --database-url names, which
the benchmark then fills and prunes) with --links links of one site, each holding results under --controls
congestion controls: per (link, control) a probe run with its two results, its fit and curve (copied in SQL from one that
AdviceService.ingest_run stored) and an equal share of --observations observations, all --age-days (40) old. Then
times two pruning passes with the default retention (TAME_RUN_MAX_AGE_S 30 days; TAME_PRUNE_BATCH 500 rows of
link_controls a batch):

- idle: each link's first control's observations are from today (the link is in use under it), and each other
  control has one from today too, so the step goes through every row and releases none;
- releasing: only each link's first control has any, so the step releases the others with all they hold.

Prints, per case, the controls step's batches: how many, the median and longest time each held its transaction open,
the longest time a batch held rows of links locked, the controls released and the rows left after the pass. On SQLite
a batch's transaction holds the whole store's write lock (how long any other writer waits) and there are no row locks.
On PostgreSQL it holds advisor.locks.PRUNE_LOCK (another replica's pass meanwhile ends) and, from locking the links
whose controls it releases (FOR UPDATE SKIP LOCKED) to its commit, those links' rows: how long a write to one of
those links waits; writes to other links do not wait. Before the passes it prints how
long the first batch of the fits step and of the observations step takes to read what it deletes. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import ExitStack, contextmanager

DAY_S = 86400.0
ROW_TABLES = ("link_controls", "fits", "curve_points", "probe_runs", "probe_results", "observations")


def table_columns(tx, table: str) -> list[str]:
    """The names of ``table``'s columns, in their order, on either dialect."""
    if tx.dialect == "postgresql":
        return [row[0] for row in tx.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ? ORDER BY ordinal_position", (table,)).fetchall()]
    return [row[1] for row in tx.execute(f"PRAGMA table_info({table})").fetchall()]


def copy_rows(tx, table: str, source: str, where: str, overrides: dict[str, tuple | None], params=()) -> None:
    """INSERT into ``table`` one row per row of ``source`` (SQL with the alias t for a template row of ``table``)
    matching ``where`` (its parameters ``params``), each column copied from t unless ``overrides`` gives it as
    (SQL, its parameters...) (None leaves it to its default). Each column brings its own parameters: the dialects
    order a table's columns differently where migrations added them."""
    kept = [c for c in table_columns(tx, table) if overrides.get(c, ()) is not None]
    values = [overrides.get(c) or (f"t.{c}",) for c in kept]
    tx.execute(f"INSERT INTO {table} ({', '.join(kept)}) SELECT {', '.join(v[0] for v in values)} "
               f"FROM {source} WHERE {where}", [p for v in values for p in v[1:]] + list(params))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=int, default=2000)
    parser.add_argument("--controls", type=int, default=8)
    parser.add_argument("--observations", type=int, default=1_000_000)
    parser.add_argument("--age-days", type=float, default=40.0)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--postgres", action="store_true", help="on a throwaway PostgreSQL cluster")
    where.add_argument("--database-url", help="on this empty store (postgresql://... or sqlite:///...): filled and "
                                              "pruned, so it must hold no link")
    args = parser.parse_args()

    import advisor.retention as retention
    from advisor.destinations import parse_destination
    from advisor.service import AdviceService
    from advisor.settings import Settings
    from advisor.store import Store
    from probes.result import ProbeResult

    now = time.time()
    old = now - args.age_days * DAY_S
    controls = [f"c{k}" for k in range(args.controls)]
    with ExitStack() as stack:
        url = args.database_url
        if args.postgres:
            from tests.conftest import throwaway_cluster  # run from the repository root (python -m)

            url = stack.enter_context(throwaway_cluster())
        elif url is None:
            url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/controls.sqlite3"
        store = Store.open(url)
        stack.callback(store.close)
        with store.db.transaction() as tx:
            if tx.execute("SELECT count(*) FROM destinations").fetchone()[0]:
                parser.error("--database-url: the store holds links; give an empty database (it is filled and pruned)")
        service = AdviceService(store, Settings(congestion_control=controls[0]), resolver=lambda host: [host],
                                controls=lambda: controls)
        template = parse_destination("10.255.255.1:5201")
        results = [ProbeResult(dest=template.key, streams=n, throughput_bps=1e9 * n / (n + 4), duration_s=10.0,
                               omit_s=0.0, sender_bps=None) for n in (1, 10)]
        run, _ = service.ingest_run(template, 0.04, results, now, source="benchmark", congestion_control=controls[0])
        began = time.perf_counter()
        per_pair = max(1, args.observations // (args.links * args.controls))
        with store.db.transaction(write=True) as tx:
            tx.execute("CREATE TEMP TABLE pairs (k BIGINT PRIMARY KEY, did BIGINT, control TEXT)")
            tx.execute("CREATE TEMP TABLE names (control TEXT)")
            for control in controls:
                tx.execute("INSERT INTO names (control) VALUES (?)", (control,))
            dests = [f"10.{k // 62500}.{k // 250 % 250}.{k % 250 + 1}:5201" for k in range(args.links)]
            for dest in dests:
                tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, 5201, ?)",
                           (service.settings.site, dest, dest.rsplit(":", 1)[0], old))
            tx.execute("INSERT INTO pairs (k, did, control) SELECT row_number() OVER (ORDER BY d.id, n.control), "
                       "d.id, n.control FROM destinations d, names n WHERE d.dest <> ?", (template.key,))
            tx.execute("INSERT INTO link_controls (destination_id, congestion_control) SELECT did, control FROM pairs")
            (run_base,) = tx.execute("SELECT max(id) FROM probe_runs").fetchone()
            (fit_base,) = tx.execute("SELECT max(id) FROM fits").fetchone()
            copy_rows(tx, "probe_runs", "pairs p, probe_runs t", "t.id = ?",
                      {"id": ("p.k + ?", run_base), "destination_id": ("p.did",), "congestion_control": ("p.control",),
                       "job_id": None, "started_at": ("?", old), "finished_at": ("?", old), "probed_at": ("?", old)},
                      (run.id,))
            copy_rows(tx, "probe_results", "pairs p, probe_results t", "t.probe_run_id = ?",
                      {"id": None, "probe_run_id": ("p.k + ?", run_base), "raw": ("NULL",)}, (run.id,))
            copy_rows(tx, "fits", "pairs p, fits t", "t.probe_run_id = ?",
                      {"id": ("p.k + ?", fit_base), "destination_id": ("p.did",), "probe_run_id": ("p.k + ?", run_base),
                       "congestion_control": ("p.control",), "fitted_at": ("?", old), "probed_at": ("?", old)},
                      (run.id,))
            copy_rows(tx, "curve_points", "pairs p, curve_points t", "t.fit_id = (SELECT id FROM fits WHERE "
                      "probe_run_id = ?)", {"fit_id": ("p.k + ?", fit_base)}, (run.id,))
            if tx.dialect == "postgresql":
                # The ids given above do not move the identity sequences: later inserts would collide with them.
                for table in ("probe_runs", "fits"):
                    tx.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
            # Each link is in use under its first control: that one's observations are from today. Streams 2-8
            # (j mod 7 written with integer division: psycopg reads % as a placeholder).
            tx.execute("WITH RECURSIVE seq(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM seq WHERE j + 1 < ?) "
                       "INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                       "congestion_control, tame_streams) SELECT p.did, 2 + seq.j - 7 * (seq.j / 7), 1e8, "
                       "CASE WHEN p.control = ? THEN ? ELSE ? END + seq.j, p.control, 0 FROM pairs p, seq "
                       "ORDER BY p.k, seq.j", (per_pair, controls[0], now - per_pair, old))
            # Today's observation under each of the others: the idle case.
            tx.execute("INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                       "congestion_control, tame_streams) SELECT did, 2, 1e8, ?, control, 0 FROM pairs "
                       "WHERE control <> ?", (now, controls[0]))
            (pairs,) = tx.execute("SELECT count(*) FROM pairs").fetchone()
        with store.db.transaction() as tx:
            (observations,) = tx.execute("SELECT count(*) FROM observations").fetchone()
        print(f"{args.links} links x {args.controls} controls ({pairs} pairs), {observations} observations "
              f"({per_pair} a pair, one more under each but the first) stored in {time.perf_counter() - began:.1f} s "
              f"({store.db.dialect})",
              flush=True)

        if store.db.dialect == "postgresql":
            with store.db.transaction(write=True) as tx:
                tx.execute("ANALYZE")  # as autovacuum would have by now on a store that grew to this size

        # The first batch of the fits and observations steps reads which links are past the count kept and, of up to
        # LINKS_A_BATCH of them, what is past it but for what the link keeps (its current fits, its refit windows):
        # time those reads.
        for table, keep in (("fits", retention.Retention().keep_fits),
                            ("observations", retention.Retention().keep_observations)):
            with store.db.transaction(write=True) as tx:
                started = time.perf_counter()
                found, after, more = retention.past_count_batch(tx, table, keep, 0, 500)
                print(f"{table} step: one batch's read {1000 * (time.perf_counter() - started):.1f} ms "
                      f"({len(found)} {table} to delete; "
                      f"{f'the next batch goes on after link {after}' if more else 'no link left'})", flush=True)

        held: list[float] = []
        locked: list[float] = []
        in_step = False
        rows_locked_at: float | None = None
        transaction, controls_after = store.db.transaction, retention._controls_after
        lock_unheld = retention._lock_unheld

        def marked(*a, **k):
            nonlocal in_step
            in_step = True  # this transaction is one of the controls step's batches
            return controls_after(*a, **k)

        def locking(*a, **k):
            nonlocal rows_locked_at
            if rows_locked_at is None:
                rows_locked_at = time.perf_counter()  # the links' rows are locked from here to the commit
            return lock_unheld(*a, **k)

        @contextmanager
        def timed(*a, **k):
            nonlocal in_step, rows_locked_at
            in_step, rows_locked_at = False, None
            with transaction(*a, **k) as tx:
                # SQLite: BEGIN IMMEDIATE has taken the write lock; PostgreSQL: the batch takes PRUNE_LOCK first.
                started = time.perf_counter()
                yield tx
            if in_step:
                held.append(time.perf_counter() - started)
                if rows_locked_at is not None:
                    locked.append(time.perf_counter() - rows_locked_at)

        store.db.transaction, retention._controls_after, retention._lock_unheld = timed, marked, locking
        table = [f"| case | batches | median, ms | longest, ms | rows locked, longest, ms | controls released | "
                 f"rows left: {' / '.join(ROW_TABLES)} |", "|---|---|---|---|---|---|---|"]
        try:
            for case in ("idle", "releasing"):
                if case == "releasing":
                    with transaction(write=True) as tx:
                        tx.execute("DELETE FROM observations WHERE observed_at >= ? AND congestion_control <> ?",
                                   (now, controls[0]))
                held.clear()
                locked.clear()
                counts = retention.prune(store, retention.Retention())
                with transaction() as tx:
                    left = [tx.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ROW_TABLES]
                table.append(f"| {case} | {len(held)} | {1e3 * statistics.median(held):.1f} | "
                             f"{1e3 * max(held):.1f} | {f'{1e3 * max(locked):.1f}' if locked else '-'} | "
                             f"{counts.deleted.get('link_controls', 0)} | {' / '.join(map(str, left))} |")
        finally:
            store.db.transaction, retention._controls_after, retention._lock_unheld = (transaction, controls_after,
                                                                                        lock_unheld)
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
