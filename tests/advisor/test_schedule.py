"""The scheduler's queue reader and its concurrent runner (advisor/schedule.py), without the network."""

import json
import threading

import pytest

from advisor.schedule import MAX_QUEUE_BYTES, QueueError, parse_queue, run_concurrently


def test_a_json_queue_reads_each_transfer_and_its_sources_prefix():
    queue = parse_queue(json.dumps({
        "sources": {"siteA": ["ip", "netns", "exec", "ns-a"], "here": []},
        "transfers": [{"src": "siteA", "dest": "10.0.0.1", "max_impact": 0.1, "duration_s": 30},
                      {"src": "here", "dest": "DTN.Example.org.:5202", "max_impact": 1, "bytes": 10**9, "cc": "cubic"},
                      {"dest": "[::1]:5201", "max_impact": 0.5, "duration_s": 1}]}))
    a, b, c = queue.transfers
    # Site names are keys: lowercased, as the service keys them.
    assert (a.src, a.dest.key, a.max_impact, a.duration_s, a.bytes, a.cc) == ("sitea", "10.0.0.1:5201", 0.1, 30.0, None, None)
    assert (b.dest.key, b.bytes, b.cc, b.duration_s) == ("dtn.example.org:5202", 10**9, "cubic", None)
    assert (c.src, c.dest.key, c.link) == (None, "[::1]:5201", (None, "[::1]:5201"))
    assert queue.prefix(a) == ("ip", "netns", "exec", "ns-a") and queue.prefix(b) == () and queue.prefix(c) == ()


def test_a_line_queue_reads_key_value_fields_and_sources_from_options():
    queue = parse_queue("# site A's nightly copies\n\nsrc=a dest=10.0.0.1:5201 max_impact=0.2 duration_s=5  # first\n"
                        "dest=10.0.0.2 max_impact=1e-1 bytes=1000\n", sources={"a": ["ip", "netns", "exec", "ns-a"]})
    first, second = queue.transfers
    assert (first.src, first.dest.key, first.max_impact, first.duration_s) == ("a", "10.0.0.1:5201", 0.2, 5.0)
    assert (second.src, second.dest.key, second.bytes) == (None, "10.0.0.2:5201", 1000)
    assert queue.prefix(first) == ("ip", "netns", "exec", "ns-a")


def _one(**fields):
    return json.dumps({"sources": {"a": []}, "transfers": [{"src": "a", "dest": "10.0.0.1", "max_impact": 0.1,
                                                            "duration_s": 5, **fields}]})


@pytest.mark.parametrize("text, says", [
    ("", "no transfers"),
    ("{", "not valid JSON"),
    ('{"transfers": {}}', "must be a list"),
    ('{"transfers": [], "extra": 1}', "unknown key"),
    ('{"transfers": []}', "no transfers"),
    ('{"transfers": [5]}', "transfer 1: a transfer is an object"),
    ('{"sources": [], "transfers": []}', "\"sources\" must map"),
    ('{"sources": {"a": "ip netns exec x"}, "transfers": []}', "command prefix must be a list"),
    ('{"sources": {"a": ["ip", ""]}, "transfers": []}', "command prefix must be a list"),
    ('{"sources": {"a": ["ip\\u0000x"]}, "transfers": []}', "command prefix must be a list"),
    ('{"sources": {"a b": []}, "transfers": [{"dest": "10.0.0.1", "max_impact": 0.1, "duration_s": 5}]}',
     "source 'a b': a source site must name a site"),
    (_one(dest="no such host!"), "transfer 1: dest"),
    (_one(dest=["10.0.0.1"]), "transfer 1: dest"),
    (_one(max_impact=0), "max_impact must be a fraction above 0"),
    (_one(max_impact=1.5), "max_impact must be a fraction above 0"),
    (_one(max_impact=-0.1), "max_impact must be a fraction above 0"),
    (_one(max_impact="0.1"), "max_impact must be a fraction above 0"),
    (_one(max_impact=True), "max_impact must be a fraction above 0"),
    (_one(max_impact=float("nan")), "max_impact must be a fraction above 0"),
    ('{"sources": {"a": []}, "transfers": [{"src": "a", "dest": "10.0.0.1", "max_impact": 1e999, "duration_s": 5}]}',
     "max_impact must be a fraction above 0"),
    (_one(bytes=10), "exactly one of duration_s"),
    (_one(duration_s=None), "exactly one of duration_s"),
    (_one(duration_s=0.5), "duration_s must be 1..86400"),
    (_one(duration_s=None, bytes=0), "bytes must be a whole number"),
    (_one(duration_s=None, bytes=1.5), "bytes must be a whole number"),
    (_one(duration_s=None, bytes=2**51), "bytes must be a whole number"),
    (_one(cc="Cubic; rm -rf /"), "transfer 1: cc"),
    (_one(src="b"), "no way to run a command on source 'b'"),
    (_one(src="../etc"), "transfer 1: src: a source site must name a site"),
    (_one(streams=4), "unknown field(s) 'streams'"),
    ("dest=10.0.0.1 max_impact=0.1 duration_s", "line 1: 'duration_s' is not key=value"),
    ("dest=10.0.0.1 max_impact=0.1 max_impact=0.2 duration_s=3", "line 1: max_impact is given twice"),
    ("dest=10.0.0.1 max_impact=lots duration_s=3", "line 1: max_impact: 'lots' is not a number"),
    ("dest=10.0.0.1 max_impact=0.1 bytes=1e9", "line 1: bytes: '1e9' is not a whole number"),
    # Were read by float() and int() as 10, 1000 and 0.1 (advisor.limits.parse_number is the one rule).
    ("dest=10.0.0.1 max_impact=0.1 duration_s=\uff11\uff10", "line 1: duration_s: '\uff11\uff10' is not a number"),
    ("dest=10.0.0.1 max_impact=0.1 bytes=1_000", "line 1: bytes: '1_000' is not a whole number"),
    ("dest=10.0.0.1 max_impact=\u0660.1 duration_s=3", "line 1: max_impact: '\u0660.1' is not a number"),
    # Were taken, the last of the two winning, where the line form refuses a key given twice.
    ('{"transfers": [{"dest": "10.0.0.1", "max_impact": 0.1, "max_impact": 1, "duration_s": 5}]}',
     "gives 'max_impact' twice in one object"),
    ('{"transfers": [], "transfers": [{"dest": "10.0.0.1", "max_impact": 0.1, "duration_s": 5}]}',
     "gives 'transfers' twice in one object"),
    ('{"sources": {"siteA": [], "sitea": ["ip", "netns", "exec", "x"]}, "transfers": [{"src": "sitea", '
     '"dest": "10.0.0.1", "max_impact": 0.1, "duration_s": 5}]}', "name site 'sitea' twice ('siteA' and 'sitea')"),
    ("\n# nothing\n", "no transfers"),
    pytest.param("[" + ",".join(['{"dest": "10.0.0.1", "max_impact": 0.1, "duration_s": 1}'] * 1001) + "]",
                 "at most 1000", id="1001 transfers"),
    pytest.param(" " * (MAX_QUEUE_BYTES + 1), "larger than", id="over 1 MiB"),
    # Was a RecursionError traceback from the JSON parser.
    pytest.param("[" * 100_000, "nests lists or objects too deeply", id="100000 nested lists"),
    pytest.param('{"transfers": [' + '{"a": ' * 100_000, "nests lists or objects too deeply", id="nested objects"),
])
def test_a_malformed_queue_is_refused_with_what_to_fix(text, says):
    with pytest.raises(QueueError) as raised:
        parse_queue(text)
    assert says in str(raised.value)


def test_the_runner_keeps_to_its_limit_runs_one_destination_at_a_time_and_keeps_the_order():
    lock = threading.Lock()
    running: list[str] = []
    most = [0]
    seen_together: list[tuple[str, ...]] = []

    def run(item):
        with lock:
            running.append(item[1])
            most[0] = max(most[0], len(running))
            seen_together.append(tuple(running))
        # Let the others be scheduled meanwhile (no wall-clock assertion rests on this).
        threading.Event().wait(0.01)
        with lock:
            running.remove(item[1])
        return item[0]

    items = [(i, dest) for i, dest in enumerate(["d1", "d1", "d2", "d3", "d2", "d1"])]
    assert run_concurrently(items, run, limit=2, key=lambda item: item[1]) == list(range(6))
    assert most[0] <= 2
    assert all(len(set(together)) == len(together) for together in seen_together)


def test_a_failing_item_starts_nothing_more_and_cancels_the_running_ones():
    cancel = threading.Event()
    started = []

    def run(item):
        started.append(item)
        if item == 0:
            raise RuntimeError("boom")
        cancel.wait(30)  # a transfer heeds the cancel event
        return item

    with pytest.raises(RuntimeError, match="boom"):
        run_concurrently([0, 1, 2, 3], run, limit=2, cancel=cancel)
    assert cancel.is_set() and 3 not in started


def test_the_runner_refuses_a_limit_below_one():
    with pytest.raises(ValueError, match="limit"):
        run_concurrently([1], lambda x: x, limit=0)
