import threading

import httpx

from tests.api.conftest import probe_and_wait, rate


def test_readers_never_see_database_is_locked_while_a_writer_writes(service_factory):
    # cache_max_age_s=0 and writes that invalidate the cache make every read go to SQLite.
    base, client, app = service_factory(cache_max_age_s=0.0)
    probe_and_wait(client)
    failures = []
    stop = threading.Event()

    def reader():
        with httpx.Client(base_url=base, timeout=60) as http:
            for _ in range(150):
                if stop.is_set():
                    break
                for path, params in (("/v1/advice", {"dest": "127.0.0.1", "max_impact": 0.3}),
                                     ("/v1/paths", None), ("/v1/paths/127.0.0.1:5201/curve", None)):
                    response = http.get(path, params=params)
                    if response.status_code != 200:
                        failures.append((path, response.status_code, response.text))

    def writer():
        with httpx.Client(base_url=base, timeout=60) as http:
            for i in range(60):
                for response in (
                    http.post("/v1/observations", json={"dest": "127.0.0.1", "streams": 1 + i % 8,
                                                        "throughput_bps": rate(1 + i % 8)}),
                    http.post("/v1/probe-runs", json={"dest": "127.0.0.1", "probes": [
                        {"streams": 1, "throughput_bps": rate(1)}, {"streams": 10, "throughput_bps": rate(10)}]}),
                ):
                    if response.status_code >= 300:
                        failures.append(("write", response.status_code, response.text))
        stop.set()

    threads = [threading.Thread(target=reader) for _ in range(4)] + [threading.Thread(target=writer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert failures == []
    assert not any("locked" in text for *_, text in failures)
    runs = app.state.service.store.db
    with runs.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM probe_runs").fetchone()[0] == 61
