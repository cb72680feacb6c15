"""A site's spent attempts (advisor.jobs.charge_attempt_in) on a real PostgreSQL store with a pruning pass beside the
charge: an attempt's seconds count in the site's hour whatever the pass deletes meanwhile."""

import threading
from dataclasses import replace

import pytest

from advisor.jobs import charge_attempt_in
from advisor.limits import BUDGET_WINDOW_S, SPENT_ATTEMPTS_BUCKET_S
from advisor.retention import Retention, prune
from advisor.sites import site_use
from advisor.store import Store


class _PrunedAfterLookup:
    """``tx`` with a pruning pass, in its own transaction, run once as soon as the charge has found its bucket's row
    (READ COMMITTED: the charge's next statement sees what the pass committed)."""

    def __init__(self, tx, run_pass):
        self._tx, self._run_pass, self.passes = tx, run_pass, 0

    def execute(self, sql, params=()):
        cursor = self._tx.execute(sql, params)
        if sql.startswith("SELECT id FROM spent_attempts") and not self.passes:
            self.passes += 1
            self._run_pass()
        return cursor

    def __getattr__(self, name):
        return getattr(self._tx, name)


def in_another_thread(work):
    """``work`` run to its end in a thread of its own (a thread holds one transaction of a store at a time)."""
    failed = []

    def run():
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the test's thread)
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if failed:
        raise failed[0]


@pytest.mark.postgres
def test_an_attempt_charged_to_a_bucket_row_a_pass_deletes_meanwhile_still_counts(pg_url):
    now = [0.0]
    store = Store.open(pg_url, clock=lambda: now[0])
    try:
        bucket = 1000 * SPENT_ATTEMPTS_BUCKET_S
        # An attempt that started 10 s into the bucket: its row is dated then.
        with store.db.transaction(write=True) as tx:
            charge_attempt_in(tx, "dtn2", "job-1", bucket + 10, 5.0)
        # An hour and 20 s after the bucket began, that row has left the hour (a pass deletes it), but an attempt
        # that started 50 s into the bucket is inside it for 30 s more: its 7 s count.
        now[0] = bucket + BUDGET_WINDOW_S + 20
        retention = replace(Retention(), run_max_age_s=0)
        with store.db.transaction(write=True) as tx:
            interleaved = _PrunedAfterLookup(tx, lambda: in_another_thread(lambda: prune(store, retention)))
            charge_attempt_in(interleaved, "dtn2", "job-2", bucket + 50, 7.0)
        assert interleaved.passes == 1
        with store.db.transaction() as tx:
            rows = tx.execute("SELECT started_at, seconds FROM spent_attempts WHERE src = 'dtn2'").fetchall()
        # Main's charge_attempt_in found the old row, the pass deleted it, and its UPDATE then matched no row: the
        # 7 s were dropped, and the site could spend them again within the hour.
        assert rows == [(bucket + 50, 7.0)]
        assert site_use(store, "dtn2").seconds == pytest.approx(7.0)
    finally:
        store.close()
