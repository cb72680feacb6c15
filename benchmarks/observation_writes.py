"""How long a reported transfer holds the store's write lock, and how many a second the store takes.

    python -m benchmarks.observation_writes                     # SQLite, 4 links, 4 writer threads
    python -m benchmarks.observation_writes --database-url postgresql://...

Fills a fresh SQLite store (or --database-url) with one probe run on each of --links links, then has --writers
threads report --per-writer transfers each (POST /v1/observations' path, AdviceService.observe, with per-stream
rates and retransmissions of --streams streams), each thread on its own links in turn. Every transfer refits its
link on the run plus the transfers since (up to 200, the refit window). Prints the write transactions' hold times
(median, 99th percentile, longest): on SQLite the write lock is the whole store's, so that is how long any other
writer waits; and the transfers stored a second.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=int, default=4)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--per-writer", type=int, default=150)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--database-url")
    args = parser.parse_args()

    from advisor.destinations import parse_destination
    from advisor.service import AdviceService
    from advisor.settings import Settings
    from advisor.store import Store
    from probes.result import ProbeResult

    def rate(n: int) -> float:
        return 1e9 * n / (n + 4)

    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or f"sqlite:///{folder}/observations.sqlite3"
        store = Store.open(url)
        service = AdviceService(store, Settings(congestion_control="cubic"), resolver=lambda host: ["127.0.0.1"])
        links = [f"127.0.{k // 250}.{k % 250 + 1}:5201" for k in range(args.links)]
        for dest in links:
            results = [ProbeResult(dest=dest, streams=n, throughput_bps=rate(n), duration_s=10.0, omit_s=0.0,
                                   sender_bps=None, congestion_control="cubic") for n in (1, 8, 32)]
            service.ingest_run(parse_destination(dest), 0.04, results, service.clock(), source="benchmark",
                               congestion_control="cubic")

        held: list[float] = []
        transaction = store.db.transaction

        @contextmanager
        def timed(*a, **k):
            with transaction(*a, **k) as tx:
                started = time.perf_counter()  # BEGIN IMMEDIATE has taken SQLite's write lock
                yield tx
            if k.get("write"):
                held.append(time.perf_counter() - started)

        store.db.transaction = timed
        refits = 0
        lock = threading.Lock()

        def writer(w: int) -> None:
            nonlocal refits
            mine = links[w::args.writers] or links
            for i in range(args.per_writer):
                n = args.streams
                rates = [rate(n) / n * (0.9 + 0.2 * ((i + s) % 7) / 6) for s in range(n)]
                answer = service.observe(mine[i % len(mine)], n, sum(rates), congestion_control="cubic",
                                         stream_bps=rates, stream_retransmits=[3 + (i + s) % 5 for s in range(n)],
                                         duration_s=30.0)
                with lock:
                    refits += answer["refit"]

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(args.writers)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - began
        store.db.transaction = transaction
        store.close()
    total = args.writers * args.per_writer
    ordered = sorted(held)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(f"{total} transfers of {args.streams} streams over {args.links} links by {args.writers} writers; "
          f"{refits} refits")
    print("| transfers/s | write tx median, ms | p99, ms | longest, ms |\n|---|---|---|---|\n"
          f"| {total / took:.0f} | {1e3 * statistics.median(ordered):.1f} | {1e3 * p99:.1f} | {1e3 * ordered[-1]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
