"""How long one pruning pass holds the store when a link holds many large observations.

    python -m benchmarks.prune_observations                      # 1,200 observations of 1,024 streams, 1 control
    python -m benchmarks.prune_observations --controls 8 --per-control 190

Fills a fresh SQLite store (or --database-url) with observations of one link, each with per-stream rates and
retransmissions for --streams streams (about 37 KiB at 1,024), under --controls congestion controls, then times
one advisor.retention.prune pass with the default retention (TAME_KEEP_OBSERVATIONS 1,000, each control's newest 200
standard observations kept for refits). On SQLite each batch of the pass holds the write lock: its longest batch is
how long another writer can wait.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--controls", type=int, default=1)
    parser.add_argument("--per-control", type=int, default=1200)
    parser.add_argument("--streams", type=int, default=1024)
    parser.add_argument("--database-url")
    args = parser.parse_args()

    import advisor.retention as retention
    from advisor.service import AdviceService
    from advisor.settings import Settings
    from advisor.store import Store

    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or f"sqlite:///{folder}/prune.sqlite3"
        store = Store.open(url)
        controls = [f"c{k}" for k in range(args.controls)]
        service = AdviceService(store, Settings(congestion_control=controls[0]), resolver=lambda host: [host],
                                controls=lambda: controls)
        rng = random.Random(2)
        rates = [rng.uniform(1e5, 1e6) for _ in range(args.streams)]
        began = time.perf_counter()
        for control in controls:
            for _ in range(args.per_control):
                service.observe("127.0.0.1:5201", args.streams, sum(rates), congestion_control=control,
                                stream_bps=rates, stream_retransmits=[123456] * args.streams)
        print(f"{args.controls * args.per_control} observations of {args.streams} streams under {args.controls} "
              f"control(s) stored in {time.perf_counter() - began:.1f} s", flush=True)

        longest = 0.0
        transaction = store.db.transaction

        def timed(*a, **k):
            from contextlib import contextmanager

            @contextmanager
            def wrapped():
                nonlocal longest
                started = time.perf_counter()
                with transaction(*a, **k) as tx:
                    yield tx
                longest = max(longest, time.perf_counter() - started)
            return wrapped()

        store.db.transaction = timed
        began = time.perf_counter()
        counts = retention.prune(store, retention.Retention())
        took = time.perf_counter() - began
        store.db.transaction = transaction
        store.close()
    print(f"| pass, s | longest transaction, s | batches | observations deleted |\n|---|---|---|---|\n"
          f"| {took:.2f} | {longest:.3f} | {counts.batches} | {counts.deleted.get('observations', 0)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
