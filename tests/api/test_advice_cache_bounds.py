"""What a reader can make the advice cache hold, over HTTP on a real SQLite file: destinations that fail leave
nothing behind, one link spelt many ways is one entry, a write drops its own link's entries and no other, more budgets than the cache holds evict the least
recently read entries one at a time (no miss storm for every client at once), and an entry is little more than
the JSON that GET and batch items send as it is."""

import gc
import tracemalloc
import uuid

from advisor.destinations import parse_destination
from probes.result import ProbeResult
from tests.api.conftest import rate

DEST = "127.0.0.1:5201"


def seed(app, dest=DEST):
    """A fit for ``dest``, stored as a probe run through the service."""
    service = app.state.service
    results = [ProbeResult(dest=dest, streams=n, throughput_bps=rate(n), duration_s=10.0, omit_s=0.0, sender_bps=None)
               for n in (1, 10)]
    service.ingest_run(parse_destination(dest), 0.04, results, service.clock(), source="test")


def hostile_batch(unparsable=500, unknown=500):
    """Distinct keys that never become advice: some do not parse, the others parse but name no known link."""
    tag = uuid.uuid4().hex
    return ([{"dest": f"{tag}{'x' * 200}!{i}", "max_impact": 0.1} for i in range(unparsable)]
            + [{"dest": f"h{i}-{tag}.example:5201", "max_impact": 0.1} for i in range(unknown)])


def retained_by_advisor(snapshot):
    """Bytes held by allocations made in advisor/."""
    return sum(stat.size for stat in
               snapshot.filter_traces([tracemalloc.Filter(True, "*/advisor/*")]).statistics("filename"))


def test_distinct_keys_that_fail_leave_nothing_behind(service_factory):
    _, client, app = service_factory(start_worker=False)
    service = app.state.service
    seed(app)
    assert client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.1}).status_code == 200
    client.post("/v1/advice:batch", json=hostile_batch())  # warm: first-use allocations are not growth

    tracemalloc.start()
    try:
        before = retained_by_advisor(tracemalloc.take_snapshot())
        for _ in range(4):
            results = client.post("/v1/advice:batch", json=hostile_batch()).json()["results"]
            assert [r["error"]["kind"] for r in results] == ["InvalidRequest"] * 500 + ["UnknownDestination"] * 500
        grown = retained_by_advisor(tracemalloc.take_snapshot()) - before
    finally:
        tracemalloc.stop()
    # Anything kept per key (a lock, a key tuple, a table slot: about 200 bytes) would come to 0.8 MB; the bound
    # leaves room only for allocations that do not grow with the keys (a few hundred bytes).
    assert grown < 64_000, f"{grown} bytes retained by advisor/ after 4,000 failing keys"
    assert list(service._cache) == [(service.settings.site, DEST, 0.1, service.settings.congestion_control)]
    assert client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.1}).status_code == 200


def test_one_link_spelt_many_ways_is_one_entry(service_factory):
    _, client, app = service_factory(start_worker=False)
    service = app.state.service
    seed(app)
    spellings = ["127.0.0.1", DEST, " 127.0.0.1:5201 ", "::ffff:127.0.0.1", "[::ffff:7f00:1]:5201"]
    answers = [client.get("/v1/advice", params={"dest": s, "max_impact": 0.1}) for s in spellings]
    answers += [client.post("/v1/advice:batch", json=[{"dest": s, "max_impact": 0.1} for s in spellings])]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert {a.json()["dest"] for a in answers[:-1]} == {DEST}
    assert [r["dest"] for r in answers[-1].json()["results"]] == spellings  # each item names what it was asked
    assert {r["advice"]["dest"] for r in answers[-1].json()["results"]} == {DEST}
    assert len(service._cache) == 1 and service.cache_reads()["reloaded"] == 1


def test_more_budgets_than_the_cache_holds_evict_the_least_recently_read(service_factory):
    _, client, app = service_factory(start_worker=False)
    service = app.state.service
    service._cache_limit = limit = 100
    seed(app)
    hot = {"dest": DEST, "max_impact": 0.5}
    budgets = [round(0.01 + i * 1e-4, 6) for i in range(3 * limit)]
    for start in range(0, len(budgets), 20):
        # A reader of one budget keeps it while another walks through 300 others, 20 at a time.
        items = [hot] + [{"dest": DEST, "max_impact": b} for b in budgets[start:start + 20]]
        results = client.post("/v1/advice:batch", json=items).json()["results"]
        assert all(r["advice"] is not None for r in results)
        assert len(service._cache) <= limit
    assert len(service._cache) == limit
    loads = service.cache_reads()["reloaded"]
    assert loads == 1 + len(budgets)  # each budget loaded once, the hot one never again

    # The most recent budgets and the hot one are answered from memory; the oldest were evicted.
    recent = [hot] + [{"dest": DEST, "max_impact": b} for b in budgets[-(limit - 1):]]
    assert all(r["advice"] for r in client.post("/v1/advice:batch", json=recent).json()["results"])
    assert service.cache_reads()["reloaded"] == loads
    assert service.cached_entry(DEST, budgets[0]) is None
    assert client.get("/v1/advice", params={"dest": DEST, "max_impact": budgets[0]}).status_code == 200
    assert service.cache_reads()["reloaded"] == loads + 1
    assert len(service._cache) == limit


def test_a_write_drops_its_own_links_advice_and_no_other(service_factory):
    # A replica that takes agents' runs and transfers' observations for many links keeps every other link's advice
    # warm: a write is followed by one store read, of its own link, not of every link its readers ask for.
    _, client, app = service_factory(start_worker=False)
    service = app.state.service
    # Links share a write stripe by their hash (1 in 4,096, and Python's string hash differs from run to run): the
    # other link and the other site are ones whose stripes are not DEST's, as nearly every link's is not.
    own = service._stripe(service.settings.site, DEST)
    other = next(d for d in (f"127.0.0.1:{port}" for port in range(5202, 5300)) if service._stripe(
        service.settings.site, d) != own)
    other_site = next(s for s in (f"dtn{i}" for i in range(2, 100)) if service._stripe(s, DEST) != own)
    seed(app)
    seed(app, other)
    read = {"dest": DEST, "max_impact": 0.1}
    assert client.get("/v1/advice", params=read).status_code == 200
    written = client.get("/v1/advice", params={"dest": other, "max_impact": 0.1}).json()
    loads = service.cache_reads()["reloaded"]

    # Written over HTTP as agents and transfers write: a probe run from another site to DEST, then to the other
    # link a run and an observation from this site.
    probes = [{"streams": n, "throughput_bps": 0.5 * rate(n)} for n in (1, 10)]
    assert client.post("/v1/probe-runs", json={"src": other_site, "dest": DEST, "probes": probes}).status_code == 201
    assert service.cached_entry(DEST, 0.1) is not None  # another link, though the same destination
    assert client.post("/v1/probe-runs", json={"dest": other, "probes": probes}).status_code == 201
    assert service.cached_entry(other, 0.1) is None  # not served again: it predates the write
    assert service.cached_entry(DEST, 0.1) is not None
    rewritten = client.get("/v1/advice", params={"dest": other, "max_impact": 0.1}).json()
    assert rewritten["params"] != written["params"]  # the new run's fit
    observed = client.post("/v1/observations", json={"dest": other, "streams": 2, "throughput_bps": rate(2)})
    assert observed.status_code == 202 and observed.json()["refit"] is True
    assert service.cached_entry(other, 0.1) is None
    assert client.get("/v1/advice", params={"dest": other, "max_impact": 0.1}).json()["observations_used"] == 1

    assert client.get("/v1/advice", params=read).status_code == 200
    # Two loads of the written link after its two writes; DEST's entry was never read from the store again.
    assert service.cache_reads()["reloaded"] == loads + 2


def test_a_batch_item_carries_the_bytes_get_sends(service_factory):
    _, client, app = service_factory(start_worker=False)
    seed(app)
    get = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.1})
    batch = client.post("/v1/advice:batch", json=[{"dest": "127.0.0.1", "max_impact": 0.1},
                                                  {"dest": "nowhere!", "max_impact": 0.1, "cc": "reno"}])
    assert get.status_code == 200 and batch.status_code == 200
    assert get.content in batch.content  # one serialisation: the cached entry's
    advice, refused = batch.json()["results"]
    assert advice == {"src": None, "dest": "127.0.0.1", "max_impact": 0.1, "cc": None, "advice": get.json(),
                      "error": None}
    assert refused["advice"] is None and refused["error"]["kind"] == "InvalidRequest" and refused["cc"] == "reno"


def test_an_entry_costs_little_more_than_the_json_it_sends(service_factory):
    _, client, app = service_factory(start_worker=False)
    service = app.state.service
    seed(app)
    body = client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.5}).content
    for i in range(20):  # warm: first-use allocations are not entries
        service.advice_entry(DEST, 0.4 + i * 1e-4)
    count = 500
    tracemalloc.start()
    try:
        gc.collect()  # what is held, not cyclic garbage a collection would free
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            service.advice_entry(DEST, 0.5 + i * 1e-4)
        gc.collect()
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    # The JSON, a key and the entry's few fields: 1.4 times the JSON here; the advice kept as a dict as well: 2.8.
    assert per_entry < 2 * len(body), f"{per_entry:.0f} bytes per entry for {len(body)} bytes of JSON"
