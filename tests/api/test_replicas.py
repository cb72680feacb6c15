"""Two `tame serve` processes on one PostgreSQL database: replicas that keep no state but their advice cache.

A write through one replica is answered by the other at most cache_max_age_s (1 s) after it committed,
while the other's cache is kept warm by a reader (so its entries are re-read in the background, not
missed); when the store is slow right after the write (the other's re-read hangs past the bound), the
older advice is served marked stale: true meanwhile, without making the reader wait for the store.
Both answer the same bytes, apart from age_s, for the same query.
"""

import re
import threading
import time

import httpx
import psycopg
import pytest

from advisor.settings import Settings
from tests.api.conftest import rate
from tests.api.procs import start_serve, stop

pytestmark = pytest.mark.postgres

DEST = "127.0.0.1:5201"
QUERY = {"dest": DEST, "max_impact": 0.3}
BOUND_S = Settings().cache_max_age_s
_AGE = re.compile(rb',"age_s":[-+.0-9eE]+')


def probes(scale):
    return [{"streams": n, "throughput_bps": rate(n) * scale} for n in (1, 10)]


def without_age(body: bytes) -> bytes:
    assert body.count(b'"age_s":') == 1, body
    return _AGE.sub(b"", body)


def read_until(base, stop_reading, seen):
    """GET the advice in a loop (keep-alive) until told to stop: (sent at, advice, stale, seconds taken) of each
    answer."""
    with httpx.Client(base_url=base, timeout=30) as http:
        while not stop_reading.is_set():
            sent = time.time()
            answer = http.get("/v1/advice", params=QUERY)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            seen.append((sent, body["max_nondisruptive_throughput_bps"], body["stale"], time.time() - sent))


def write(http, writer, kind):
    """A write through ``writer`` that refits 127.0.0.1:5201; returns once it committed."""
    if kind == "probe-run":
        answer = http.post(f"{writer}/v1/probe-runs", json={"dest": DEST, "probes": probes(3.0)})
        assert answer.status_code == 201 and answer.json()["fitted"], answer.text
    else:
        # A transfer that got far less than predicted at 4 streams: the refit lowers the advice.
        answer = http.post(f"{writer}/v1/observations",
                           json={"dest": DEST, "streams": 4, "throughput_bps": rate(4) * 0.2})
        assert answer.status_code == 202 and answer.json()["refit"], answer.text


def hold_fits_table(pg_url, seconds):
    """Make the store slow for everyone: lock the fits table against reads for ``seconds``."""
    with psycopg.connect(pg_url) as conn:
        conn.execute("LOCK TABLE fits IN ACCESS EXCLUSIVE MODE")
        time.sleep(seconds)


def check_bound(http, writer, reader, kind, slow_store=None):
    """Write through ``writer`` while a client reads ``reader`` in a loop: every answer to a request sent
    more than the bound after the write committed is the new advice or says stale. With ``slow_store`` (a
    callable), the store is made slow right after the write, so the reader's background re-read hangs past the
    bound. Returns the answers: (sent at, advice, stale, seconds taken) each."""
    seen: list[tuple[float, float, bool, float]] = []
    stop_reading = threading.Event()
    thread = threading.Thread(target=read_until, args=(reader, stop_reading, seen))
    thread.start()
    try:
        time.sleep(2 * BOUND_S)  # the reader's cache is warm and has been re-read in the background
        old = seen[-1][1]
        write(http, writer, kind)
        committed = time.time()  # the write committed before its answer came back
        if slow_store is not None:
            slow_store()
        time.sleep(BOUND_S + 1.0)
    finally:
        stop_reading.set()
        thread.join(60)
    new = http.get(f"{writer}/v1/advice", params=QUERY).json()["max_nondisruptive_throughput_bps"]
    assert new != old
    late = [(value, stale) for sent, value, stale, _ in seen if sent >= committed + BOUND_S]
    assert late, "the reader made no request after the bound"
    assert {value for value, stale in late if not stale} == {new}, \
        f"{reader} answered older advice more than {BOUND_S} s after the write without saying stale"
    assert set(value for _, value, _, _ in seen) <= {old, new}
    return seen


@pytest.fixture
def replicas(tmp_path, pg_url):
    """Two `tame serve --no-worker` on one fresh PostgreSQL database, seeded through the first: their URLs."""
    env = {"TAME_DATABASE_URL": pg_url, "TAME_MODEL": "lu"}
    procs = []
    try:
        for _ in range(2):
            procs.append(start_serve(tmp_path, None, env=env, args=("--no-worker",)))
        a, b = (base for _, base in procs)
        assert httpx.post(f"{a}/v1/probe-runs", json={"dest": DEST, "probes": probes(1.0)},
                          timeout=30).status_code == 201
        yield a, b
    finally:
        for proc, _ in procs:
            stop(proc)


def test_a_write_through_one_replica_is_answered_by_the_other_within_the_bound(replicas):
    a, b = replicas
    with httpx.Client(timeout=30) as http:
        check_bound(http, a, b, "probe-run")
        check_bound(http, b, a, "observation")
        # The same bytes from both replicas, apart from age_s, for each query asked.
        for budget in (0.05, 0.3, 1.0):
            bodies = {base: http.get(f"{base}/v1/advice", params={"dest": DEST, "max_impact": budget}).content
                      for base in (a, b)}
            assert without_age(bodies[a]) == without_age(bodies[b])


def test_a_slow_store_makes_a_replica_say_stale_past_the_bound_rather_than_hold_its_readers(replicas, pg_url):
    # The store stays locked for twice the bound after the write: the reader's re-read hangs, and its
    # requests past the bound get the entry from before the write marked stale, without waiting for the store.
    a, b = replicas
    with httpx.Client(timeout=30) as http:
        seen = check_bound(http, a, b, "probe-run", slow_store=lambda: hold_fits_table(pg_url, 2 * BOUND_S))
    slowest = max(taken for _, _, _, taken in seen)
    assert slowest < BOUND_S, f"a reader was held {slowest:.2f} s by the locked store"
