import math

import pytest
from numpy.testing import assert_allclose

from advisor.db import Database, migrations
from advisor.destinations import parse_destination
from advisor.errors import InvalidRequest
from advisor.fitcodec import fit_from_legacy_record, fit_from_stored, fit_to_record
from advisor.store import Store
from advisor.tame import advise
from models.parallel import ProbePoint
from models.registry import fit
from tests.api.conftest import Clock
from tests.sites import SITE

A, B = 1e-16, 4e-16


def lu_rate(n):
    return n / math.sqrt(A * n * n + B)


CASES = {
    "lu congested": ("lu", [ProbePoint(1, lu_rate(1)), ProbePoint(10, lu_rate(10))]),
    "lu uncongested": ("lu", [ProbePoint(1, 1e6), ProbePoint(8, 9e6)]),
    "lu saturated": ("lu", [ProbePoint(1, 9e7), ProbePoint(10, 8.9e7)]),
    "linear": ("linear", [ProbePoint(1, 4e7), ProbePoint(10, 9e7)]),
    "full2": ("full2", [ProbePoint(1, lu_rate(1)), ProbePoint(4, lu_rate(4) * 1.01), ProbePoint(10, lu_rate(10))]),
    "fair_share congested": ("fair_share", [ProbePoint(1, 12e6), ProbePoint(10, 55e6)]),
    "fair_share uncongested": ("fair_share", [ProbePoint(1, 1e6), ProbePoint(8, 9e6)]),
    "fair_share saturated": ("fair_share", [ProbePoint(1, 9e7), ProbePoint(10, 8.9e7)]),
    "auto shared": ("auto", [ProbePoint(1, 12e6), ProbePoint(10, 55e6)]),
    # Three probes one fair-share curve misses: the throughput goes through each.
    "auto shared through probes": ("auto", [ProbePoint(1, 12e6), ProbePoint(10, 55e6), ProbePoint(31, 120e6)]),
    # 2 Mbit/s per stream with no losses over 30 s at 50 ms (3 cycles of 0.3 s are far less): clean at 1
    # and 10 streams; 31 streams lose 200 segments: the knee form.
    "auto knee": ("auto", [ProbePoint(1, 2e6, rtt_s=0.05, retransmits=0, duration_s=30, mss_bytes=1000),
                           ProbePoint(10, 20e6, rtt_s=0.05, retransmits=0, duration_s=30, mss_bytes=1000),
                           ProbePoint(31, 40e6, rtt_s=0.05, retransmits=200, duration_s=30, mss_bytes=1000)]),
    "auto uncongested": ("auto", [ProbePoint(1, 2e6, rtt_s=0.05, retransmits=0, duration_s=30, mss_bytes=1000),
                                  ProbePoint(10, 20e6, rtt_s=0.05, retransmits=0, duration_s=30, mss_bytes=1000)]),
    # Losses of 4 % at one stream (a Reno window of 6 segments): the timeout regime.
    "auto timeout regime": ("auto", [ProbePoint(1, 0.25e6, rtt_s=0.2, retransmits=12.5, duration_s=10, mss_bytes=1000),
                                     ProbePoint(10, 0.7e6, rtt_s=0.2, retransmits=140, duration_s=10, mss_bytes=1000),
                                     ProbePoint(31, 0.75e6, rtt_s=0.2, retransmits=337.5, duration_s=10,
                                                mss_bytes=1000)]),
    # Held-out s9 with 15 cross flows behind a RED queue (benchmarks/results/holdout-red/): the one-stream
    # probe counted 22 losses, the others hundreds, so the weighted fair share leans on those.
    "auto_weighted": ("auto_weighted", [
        ProbePoint(1, 12.22e6, rtt_s=0.0389, retransmits=22, duration_s=30, mss_bytes=1000),
        ProbePoint(10, 61.0e6, rtt_s=0.0389, retransmits=833, duration_s=60, mss_bytes=1000),
        ProbePoint(31, 111.0e6, rtt_s=0.0389, retransmits=1951, duration_s=30, mss_bytes=1000)]),
    "yildirim": ("yildirim", [ProbePoint(1, 12e6), ProbePoint(5, 40e6), ProbePoint(10, 55e6)]),
    "yildirim falls back": ("yildirim", [ProbePoint(1, 1e6), ProbePoint(4, 4.5e6), ProbePoint(8, 9e6)]),
}


def test_every_registered_model_survives_the_store():
    # The store rebuilds fits from model + params; a model the codec cannot rebuild would break
    # stored advice as soon as an operator selects it with TAME_MODEL.
    from models.registry import MODELS

    assert set(MODELS) == {model for model, _ in CASES.values()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stored_fit_gives_the_same_advice_as_the_original(case):
    model, points = CASES[case]
    original = fit(model, points)
    record = fit_to_record(original)
    rebuilt = fit_from_stored(**record)
    # Fits stored before records were kept carry only the plain values: they read back the same.
    legacy = fit_from_legacy_record(record["model"], record["params"], record["regime"], record["probe_streams"],
                                    record["warnings"])
    assert rebuilt == original and type(legacy) is type(original)
    for budget in (0.0, 0.05, 0.3, 0.9, 1.0):
        assert advise(rebuilt, budget, 64, 0.02, points) == advise(original, budget, 64, 0.02, points)
        assert advise(legacy, budget, 64, 0.02, points) == advise(original, budget, 64, 0.02, points)
    n = [1, 2, 5, 17, 64]
    assert_allclose(rebuilt.throughput_bps(n), original.throughput_bps(n), rtol=1e-12)
    assert_allclose(rebuilt.impact(n), original.impact(n), rtol=1e-12)
    assert type(rebuilt) is type(original)


def test_a_knee_stored_before_the_plateau_is_read_without_one():
    # Knees stored before models.auto held the congested part flat below its lowest probe carry no
    # plateau_until_streams; they must keep the curve they were stored with (the fair share beyond the line).
    model, points = CASES["auto knee"]
    record = fit_to_record(fit(model, points))
    params = {k: v for k, v in record["params"].items() if k != "plateau_until_streams"}
    assert len(params) == len(record["params"]) - 1
    old = fit_from_legacy_record(model, params, record["regime"], record["probe_streams"], record["warnings"])
    capacity, competing = params["congested_capacity_bps"], params["congested_competing_flows"]
    assert_allclose(old.throughput_bps(17), capacity * 17 / (17 + competing), rtol=1e-12)
    assert old.throughput_bps(17) < fit(model, points).throughput_bps(17)


def test_migrations_are_versioned_and_idempotent(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/s.sqlite3")
    known = migrations()
    assert db.migrate() == list(range(1, len(known) + 1))  # numbered 1..N without gaps, applied in order
    assert db.migrate() == []
    with db.transaction() as tx:
        assert tx.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert tx.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall() == [
            (version, known[version][0]) for version in sorted(known)]
        assert [name for _, name in tx.execute("SELECT version, name FROM schema_migrations "
                                               "ORDER BY version LIMIT 4").fetchall()] == [
            "initial", "evidence_and_margin", "stream_losses", "held_impact"]
    db.close()


def test_a_failed_write_leaves_nothing(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3")
    with pytest.raises(RuntimeError):
        with store.db.transaction(write=True) as tx:
            tx.execute("INSERT INTO destinations (src, dest, host, port, created_at) VALUES ('here', 'x:1', 'x', 1, 0)")
            raise RuntimeError("crash between two writes")
    with store.db.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM destinations").fetchone()[0] == 0
    store.close()


def test_jobs_respect_the_global_limit_and_one_per_destination(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3")
    first, created = store.enqueue_job(parse_destination("127.0.0.1"), [1, 10], 1.0, src=SITE)
    again, created_again = store.enqueue_job(parse_destination("127.0.0.1:5201"), [1, 4], 2.0, src=SITE)
    assert created and not created_again and again.id == first.id
    store.enqueue_job(parse_destination("127.0.0.2"), [1, 10], 1.0, src=SITE)
    assert store.claim_job("h:1:a", lambda job: 100, limit=1, src=SITE).id == first.id
    assert store.claim_job("h:2:b", lambda job: 100, limit=1, src=SITE) is None
    # The owner died: its job goes back to the queue.
    assert store.recover_jobs(3, owner_is_dead=lambda owner: owner == "h:1:a") == 1
    assert store.job(first.id).status == "queued"
    store.close()


@pytest.mark.parametrize("text, key", [
    ("Host.Example.org", "host.example.org:5201"),
    ("10.0.0.1:6000", "10.0.0.1:6000"),
    ("[::1]:5202", "[::1]:5202"),
    ("::1", "[::1]:5201"),
])
def test_destinations_are_canonical(text, key):
    assert parse_destination(text).key == key


@pytest.mark.parametrize("text", ["", "a b", "host:", "host:99999", "[::1", "1.2.3.999", "x" * 64 + ".org", "a_b.org"])
def test_bad_destinations_are_refused(text):
    with pytest.raises(InvalidRequest):
        parse_destination(text)


def test_a_stored_run_keeps_the_evidence_the_auto_model_reads(tmp_path):
    # Retransmissions, duration, segment size and each stream's rate and retransmissions come back
    # with each probe, so a refit after an observation judges the probes as the first fit did.
    from probes.result import ProbeResult

    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3")
    per_stream = {1: ((), ()), 10: ((2e6,) * 10, (1, 0, 2, 0, 0, 1, 1, 0, 2, 0))}
    results = [ProbeResult(dest="127.0.0.1:5201", streams=n, duration_s=30.0, omit_s=2.0, throughput_bps=2e6 * n,
                           sender_bps=2e6 * n, retransmits=r, rtt_mean_s=0.05, mss_bytes=1448,
                           stream_bps=per_stream[n][0], stream_retransmits=per_stream[n][1])
               for n, r in ((1, 0), (10, 7))]
    store.record_run(parse_destination("127.0.0.1"), source="probe", idle_rtt_s=0.05, results=results,
                     started_at=0.0, fit=None, src=SITE)
    run = store.latest_run_points("127.0.0.1:5201", src=SITE)
    assert run.idle_rtt_s == 0.05
    assert run.points == [
        {"streams": 1, "throughput_bps": 2e6, "rtt_mean_s": 0.05, "retransmits": 0, "duration_s": 30.0, "mss_bytes": 1448,
         "stream_bps": (), "stream_retransmits": ()},
        {"streams": 10, "throughput_bps": 2e7, "rtt_mean_s": 0.05, "retransmits": 7, "duration_s": 30.0, "mss_bytes": 1448,
         "stream_bps": (2e6,) * 10, "stream_retransmits": (1, 0, 2, 0, 0, 1, 1, 0, 2, 0)},
    ]
    store.close()


def test_fits_are_stored_as_their_own_records_and_rows_stored_before_still_read(tmp_path):
    from advisor.service import AdviceService
    from advisor.settings import Settings
    from probes.result import ProbeResult

    store = Store.open(f"sqlite:///{tmp_path}/s.sqlite3", clock=lambda: 1_700_000_000.0)
    service = AdviceService(store, Settings(model="auto"), clock=lambda: 1_700_000_000.0,
                            resolver=lambda host: ["127.0.0.1"])
    model, points = CASES["auto knee"]
    results = [ProbeResult(dest="127.0.0.1:5201", streams=int(p.streams), throughput_bps=p.throughput_bps,
                           duration_s=p.duration_s, omit_s=0.0, sender_bps=None, retransmits=p.retransmits,
                           rtt_mean_s=p.rtt_s, mss_bytes=int(p.mss_bytes)) for p in points]
    service.ingest_run(parse_destination("127.0.0.1"), 0.05, results, 0.0, source="test")
    row = store.current_fit("127.0.0.1:5201", src=SITE)
    # The record names its form and version; nothing is inferred from which params exist.
    assert row.record["form"] == "knee" and row.record["version"] == 1
    assert row.record["congested"]["form"] == "fair_share"
    fresh = service.advice("127.0.0.1", 0.3)
    # A row written before records were kept (record_json NULL) reads back to the same advice.
    with store.db.transaction(write=True) as tx:
        tx.execute("UPDATE fits SET record_json = NULL")
    service.drop_cache()
    assert store.current_fit("127.0.0.1:5201", src=SITE).record is None
    assert service.advice("127.0.0.1", 0.3) == fresh
    store.close()


@pytest.mark.parametrize("record, words", [
    ({"form": "spline", "version": 1}, "unknown form"),
    ({"form": "knee", "version": 99}, "version 99"),
    ({"form": "fair_share", "version": 1, "model": "auto", "params": {}, "regime": "congested",
      "probe_streams": [1.0], "surprise": 1}, "unknown fields"),
])
def test_a_fit_record_that_cannot_be_read_says_why(record, words):
    from models.parallel import fit_from_record

    with pytest.raises(ValueError, match=words):
        fit_from_record(record)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_worker_takes_clients_in_turn_not_one_client_s_queue_first(tmp_path, request, backend):
    # Client A queues three probes, then B one: B's waits behind A's first only, not behind all three (one client
    # asking for many long probes held the service's worker for hours while another's waited).
    url = f"sqlite:///{tmp_path}/s.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    store = Store.open(url)
    try:
        a = [store.enqueue_job(parse_destination(f"127.0.0.{i}"), [1, 10], 1.0, client="10.0.0.1", src=SITE)[0]
             for i in (1, 2, 3)]
        b, _ = store.enqueue_job(parse_destination("127.0.0.9"), [1, 10], 1.0, client="10.0.0.2", src=SITE)
        taken = []
        for _ in range(4):
            job = store.claim_job("h:1:a", lambda job: 100, limit=1, src=SITE)
            taken.append(job.id)
            store.fail_job(job.id, "done with it")  # finished: the next one may start
        assert taken == [a[0].id, b.id, a[1].id, a[2].id]
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_service_s_own_re_probes_wait_one_round_of_the_clients_not_until_they_have_had_as_many(tmp_path, request,
                                                                                                  backend):
    # The service (client NULL) started two re-probes this hour; then B and C queue two probes each. Its third waits
    # for one of B's and one of C's, not for B and C to have had two each (by count it went last).
    url = f"sqlite:///{tmp_path}/s.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    clock = Clock()
    store = Store.open(url, clock=clock)
    try:
        def queued(dest, client=None):
            clock.advance(1)  # requested in this order
            return store.enqueue_job(parse_destination(dest), [1, 10], 1.0, client=client, src=SITE)[0]

        own = [queued(f"127.0.0.{i}") for i in (1, 2, 3)]

        def next_job():
            clock.advance(60)
            job = store.claim_job("h:1:a", lambda job: 100, limit=1, src=SITE)
            store.fail_job(job.id, "done with it")  # finished: the next one may start
            return job.id

        assert [next_job(), next_job()] == [own[0].id, own[1].id]
        b = [queued(f"127.0.1.{i}", "10.0.0.2") for i in (1, 2)]
        c = [queued(f"127.0.2.{i}", "10.0.0.3") for i in (1, 2)]
        assert [next_job() for _ in range(5)] == [b[0].id, c[0].id, own[2].id, b[1].id, c[1].id]
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_clients_keep_taking_turns_when_the_clock_steps_back(tmp_path, request, backend):
    # The turns go by each client's last start. After the clock steps back (NTP at boot, a VM restored; or another
    # replica's clock ahead of this one's), a start "in the future" stayed the client's last until the clock caught
    # up: it went last while the client served first after the step, its new starts all older, took every turn.
    url = f"sqlite:///{tmp_path}/s.sqlite3" if backend == "sqlite" else request.getfixturevalue("pg_url")
    clock = Clock()
    store = Store.open(url, clock=clock)
    try:
        def queued(dest, client):
            clock.advance(1)
            return store.enqueue_job(parse_destination(dest), [1, 10], 1.0, client=client, src=SITE)[0]

        b = [queued(f"127.0.1.{i}", "10.0.0.2") for i in (1, 2, 3)]
        c = [queued(f"127.0.2.{i}", "10.0.0.3") for i in (1, 2, 3)]

        def next_job():
            clock.advance(60)
            job = store.claim_job("h:1:a", lambda job: 100, limit=1, src=SITE)
            store.fail_job(job.id, "done with it")
            return job.id

        assert [next_job(), next_job()] == [b[0].id, c[0].id]
        clock.advance(-1800)
        assert [next_job() for _ in range(4)] == [b[1].id, c[1].id, b[2].id, c[2].id]
    finally:
        store.close()
