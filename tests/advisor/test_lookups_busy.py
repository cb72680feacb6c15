"""A name the service's busy lookups never started (advisor.errors.LookupsBusy) where nothing asked for the lookup
but the service itself: the advice still answers, as it does when the re-probe's name is refused or the queue is full."""

from advisor.destinations import parse_destination
from advisor.errors import LookupsBusy
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from probes.result import ProbeResult
from tests.api.conftest import Clock, rate

DEST = "lookups.example:5201"

def test_stale_advice_whose_re_probe_finds_the_lookups_busy_is_still_served(tmp_path):
    # The re-probe of stale advice resolves the name (request_probe's allow-list check). A busy refusal was a
    # LookupTimedOut (an InvalidRequest, which _reprobe logs and serves the advice around); LookupsBusy is not one,
    # so the advice read failed with the re-probe's 503 instead of the advice it had.
    busy = False

    def resolver(host):
        if busy:
            raise LookupsBusy(f"dest host {host!r} was not looked up: busy", retry_after_s=5.0)
        return ["127.0.0.5"]

    clock = Clock()
    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3", clock=clock)
    service = AdviceService(store, Settings(model="lu"), clock=clock, resolver=resolver,
                            controls=lambda: ["cubic", "reno", "bbr"])
    try:
        results = [ProbeResult(dest=DEST, streams=n, throughput_bps=rate(n), duration_s=10.0, omit_s=0.0,
                               sender_bps=None) for n in (1, 10)]
        service.ingest_run(parse_destination(DEST), 0.04, results, clock(), source="test")
        assert not service.advice(DEST, 0.5)["stale"]
        clock.now += 2 * service.settings.ttl_s  # stale: its read queues a re-probe, which resolves the name
        busy = True
        advice = service.advice(DEST, 0.5)
        assert advice["stale"] and advice["num_flows"] >= 1, advice
        # A batch holding it answers it too (its re-probe is asked for again later, not on every read).
        service._refresh_requested.clear()
        [item] = service.batch([(DEST, 0.5, None, None)])
        assert b'"error":null' in item and b'"advice":{' in item, item
        assert store.job_counts().get("queued", 0) == 0  # no probe queued: its name was not checked
    finally:
        store.close()
