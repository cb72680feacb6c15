"""An observation refits the link on the newest probe run, read before its write transaction: a run pushed in between
must not be hidden behind a refit on the older one (a real SQLite store; the push lands in that window)."""

from advisor.store import Store
from tests.advisor.test_advice_cache import DEST, Clock, ingest, service_on


def test_a_run_pushed_while_an_observation_refits_is_not_hidden_behind_older_probes(tmp_path):
    clock = Clock()
    service = service_on(tmp_path / "s.sqlite3", clock)
    ingest(service)  # run 1
    control = service.settings.congestion_control
    store: Store = service.store
    real = store.latest_run_points

    def then_a_run_arrives(*args, **kwargs):
        read = real(*args, **kwargs)  # the refit's base: run 1
        clock.now += 1
        ingest(service, throughput_scale=3.0)  # run 2, with its own fit, committed before the observation's write
        return read

    store.latest_run_points = then_a_run_arrives
    pushed_fit = None
    try:
        got = service.observe(DEST, 4, 1e8)
        store.latest_run_points = real
        pushed_fit = store.current_fit(DEST, control, or_unrecorded=True, src=service.settings.site)
        # The observation is kept; it did not refit on run 1 over run 2's newer fit.
        assert got["accepted"] is True and got["refit"] is False
        assert pushed_fit.observations_used == 0
        # The next observation refits on run 2.
        again = service.observe(DEST, 4, 1e8)
        assert again["refit"] is True
        refit = store.current_fit(DEST, control, or_unrecorded=True, src=service.settings.site)
        assert refit.probed_at == pushed_fit.probed_at and refit.observations_used >= 1
    finally:
        store.latest_run_points = real
        store.close()
