"""How long a program with a newer curve version takes to write a store's curves again when it opens it, and how
long its longest transaction holds other writers back.

    python -m benchmarks.curve_rebuild                    # 3,000 links on a throwaway PostgreSQL cluster
    python -m benchmarks.curve_rebuild --database-url sqlite:////tmp/c.sqlite3

Fills a fresh store with one fit per link (the same probe run fitted for every link, through the service), marks
every curve outdated (curve_version NULL, as migration 0018 leaves a store), then times
advisor.curves.rebuild_outdated_curves in its batches and in one transaction (--batch equal to the links). The
longest transaction is the time another writer of those rows (a new fit, a prune) can wait.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fill(url: str, links: int) -> None:
    from advisor.destinations import parse_destination
    from advisor.service import AdviceService
    from advisor.settings import Settings
    from advisor.store import Store
    from probes.result import ProbeResult

    store = Store.open(url)
    try:
        service = AdviceService(store, Settings(congestion_control="cubic", max_site_links=max(links, 1)), resolver=lambda host: [host],
                                controls=lambda: ["cubic"])
        for i in range(links):
            dest = parse_destination(f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}:5201")
            results = [ProbeResult(dest=dest.key, streams=n, throughput_bps=b, sender_bps=b, retransmits=r,
                                   rtt_mean_s=0.02, duration_s=10.0, omit_s=0.0, mss_bytes=1448)
                       for n, b, r in ((1, 10.6e6, 2), (10, 90.5e6, 20), (40, 95.6e6, 400))]
            service.ingest_run(dest, 0.02, results, time.time(), source="push", congestion_control="cubic")
    finally:
        store.close()


def outdated_rebuild(url: str, batch: int) -> tuple[int, float, float]:
    """(curves written, seconds in all, longest transaction in seconds) of one rebuild of every current curve."""
    import advisor.curves as curves
    from advisor.db import Database

    db = Database(url)
    try:
        with db.transaction(write=True) as tx:
            tx.execute("UPDATE fits SET curve_version = NULL")
        longest = 0.0
        rebuild = curves.rebuild_curves

        def timed(tx, limit=None):
            nonlocal longest
            began = time.perf_counter()
            try:
                return rebuild(tx, limit)
            finally:
                longest = max(longest, time.perf_counter() - began)

        curves.rebuild_curves = timed
        try:
            began = time.perf_counter()
            written = curves.rebuild_outdated_curves(db, batch)
            return written, time.perf_counter() - began, longest
        finally:
            curves.rebuild_curves = rebuild
    finally:
        db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=int, default=3000)
    parser.add_argument("--database-url", help="default: a throwaway PostgreSQL cluster (tests.conftest)")
    args = parser.parse_args()
    from advisor.curves import REBUILD_BATCH

    with ExitStack() as stack:
        url = args.database_url
        if url is None:
            sys.path.insert(0, str(ROOT))
            from tests.conftest import throwaway_cluster

            url = stack.enter_context(throwaway_cluster())
        began = time.perf_counter()
        fill(url, args.links)
        print(f"{args.links} links fitted in {time.perf_counter() - began:.1f} s", flush=True)
        print("| batch (fits a transaction) | curves written | seconds in all | longest transaction, s |")
        print("|---|---|---|---|")
        for batch in (REBUILD_BATCH, args.links):
            written, total_s, longest_s = outdated_rebuild(url, batch)
            print(f"| {batch} | {written} | {total_s:.2f} | {longest_s:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
