"""How long releasing links' congestion controls (advisor.retention, its controls step) holds the store.

    python -m benchmarks.prune_controls                                # 2,000 links x 8 controls, 1,000,000 observations
    python -m benchmarks.prune_controls --links 200 --observations 100000

Fills a fresh SQLite store with --links links of one site, each holding results under --controls congestion controls:
per (link, control) a probe run with its two results, its fit and curve (copied in SQL from one that
AdviceService.ingest_run stored) and an equal share of --observations observations, all --age-days (40) old. Then
times two pruning passes with the default retention (TAME_RUN_MAX_AGE_S 30 days; TAME_PRUNE_BATCH 500 rows of
link_controls a batch):

- idle: each link's first control's observations are from today (the link is in use under it), and each other
  control has one from today too, so the step goes through every row and releases none;
- releasing: only each link's first control has any, so the step releases the others with all they hold.

Prints, per case, the controls step's batches: how many, the median and longest time each held the write lock (on
SQLite that is the whole store's: how long any other writer waits), the controls released and the rows left after the
pass. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import contextmanager

DAY_S = 86400.0
ROW_TABLES = ("link_controls", "fits", "curve_points", "probe_runs", "probe_results", "observations")


def copy_rows(tx, table: str, source: str, where: str, overrides: dict[str, str], params=()) -> None:
    """INSERT into ``table`` one row per row of ``source`` (SQL with the alias t for a template row of ``table``)
    matching ``where``, each column copied from t unless ``overrides`` gives its SQL (None leaves it to its default)."""
    columns = [row[1] for row in tx.execute(f"PRAGMA table_info({table})").fetchall()]
    kept = [c for c in columns if overrides.get(c, "") is not None]
    tx.execute(f"INSERT INTO {table} ({', '.join(kept)}) SELECT {', '.join(overrides.get(c) or f't.{c}' for c in kept)} "
               f"FROM {source} WHERE {where}", params)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=int, default=2000)
    parser.add_argument("--controls", type=int, default=8)
    parser.add_argument("--observations", type=int, default=1_000_000)
    parser.add_argument("--age-days", type=float, default=40.0)
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
    with tempfile.TemporaryDirectory() as folder:
        store = Store.open(f"sqlite:///{folder}/controls.sqlite3")
        service = AdviceService(store, Settings(congestion_control=controls[0]), resolver=lambda host: [host],
                                controls=lambda: controls)
        template = parse_destination("10.255.255.1:5201")
        results = [ProbeResult(dest=template.key, streams=n, throughput_bps=1e9 * n / (n + 4), duration_s=10.0,
                               omit_s=0.0, sender_bps=None) for n in (1, 10)]
        run, _ = service.ingest_run(template, 0.04, results, now, source="benchmark", congestion_control=controls[0])
        began = time.perf_counter()
        per_pair = max(1, args.observations // (args.links * args.controls))
        with store.db.transaction(write=True) as tx:
            tx.execute("CREATE TEMP TABLE pairs (k INTEGER PRIMARY KEY, did INTEGER, control TEXT)")
            tx.execute("CREATE TEMP TABLE names (control TEXT)")
            for control in controls:
                tx.execute("INSERT INTO names (control) VALUES (?)", (control,))
            dests = [f"10.{k // 62500}.{k // 250 % 250}.{k % 250 + 1}:5201" for k in range(args.links)]
            for dest in dests:
                tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES (?, ?, ?, 5201, ?)",
                           (service.settings.site, dest, dest.rsplit(":", 1)[0], old))
            tx.execute("INSERT INTO pairs (did, control) SELECT d.id, n.control FROM destinations d, names n "
                       "WHERE d.dest <> ? ORDER BY d.id, n.control", (template.key,))
            tx.execute("INSERT INTO link_controls (destination_id, congestion_control) SELECT did, control FROM pairs")
            (run_base,) = tx.execute("SELECT max(id) FROM probe_runs").fetchone()
            (fit_base,) = tx.execute("SELECT max(id) FROM fits").fetchone()
            copy_rows(tx, "probe_runs", "pairs p, probe_runs t", "t.id = ?",
                      {"id": "p.k + ?", "destination_id": "p.did", "congestion_control": "p.control", "job_id": None,
                       "started_at": "?", "finished_at": "?", "probed_at": "?"}, (run_base, old, old, old, run.id))
            copy_rows(tx, "probe_results", "pairs p, probe_results t", "t.probe_run_id = ?",
                      {"id": None, "probe_run_id": "p.k + ?", "raw": "NULL"}, (run_base, run.id))
            copy_rows(tx, "fits", "pairs p, fits t", "t.probe_run_id = ?",
                      {"id": "p.k + ?", "destination_id": "p.did", "probe_run_id": "p.k + ?",
                       "congestion_control": "p.control", "fitted_at": "?", "probed_at": "?"},
                      (fit_base, run_base, old, old, run.id))
            copy_rows(tx, "curve_points", "pairs p, curve_points t", "t.fit_id = (SELECT id FROM fits WHERE "
                      "probe_run_id = ?)", {"fit_id": "p.k + ?"}, (fit_base, run.id))
            # Each link is in use under its first control: that one's observations are from today.
            tx.execute("WITH RECURSIVE seq(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM seq WHERE j + 1 < ?) "
                       "INSERT INTO observations (destination_id, streams, throughput_bps, observed_at, "
                       "congestion_control, tame_streams) SELECT p.did, 2 + seq.j % 7, 1e8, "
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
              f"({per_pair} a pair, one more under each but the first) stored in {time.perf_counter() - began:.1f} s",
              flush=True)

        held: list[float] = []
        in_step = False
        transaction, controls_after = store.db.transaction, retention._controls_after

        def marked(*a, **k):
            nonlocal in_step
            in_step = True  # this transaction is one of the controls step's batches
            return controls_after(*a, **k)

        @contextmanager
        def timed(*a, **k):
            nonlocal in_step
            in_step = False
            with transaction(*a, **k) as tx:
                started = time.perf_counter()  # BEGIN IMMEDIATE has taken SQLite's write lock
                yield tx
            if in_step:
                held.append(time.perf_counter() - started)

        store.db.transaction, retention._controls_after = timed, marked
        table = [f"| case | batches | median, ms | longest, ms | controls released | rows left: {' / '.join(ROW_TABLES)} |",
                 "|---|---|---|---|---|---|"]
        try:
            for case in ("idle", "releasing"):
                if case == "releasing":
                    with transaction(write=True) as tx:
                        tx.execute("DELETE FROM observations WHERE observed_at >= ? AND congestion_control <> ?",
                                   (now, controls[0]))
                held.clear()
                counts = retention.prune(store, retention.Retention())
                with transaction() as tx:
                    left = [tx.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ROW_TABLES]
                table.append(f"| {case} | {len(held)} | {1e3 * statistics.median(held):.1f} | "
                             f"{1e3 * max(held):.1f} | {counts.deleted.get('link_controls', 0)} | "
                             f"{' / '.join(map(str, left))} |")
        finally:
            store.db.transaction, retention._controls_after = transaction, controls_after
            store.close()
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
