"""The libiperf JSON parser on files recorded from real runs (scripts/record_iperf_fixtures.py)."""

import json
from pathlib import Path

import pytest
from numpy.testing import assert_allclose

from probes.errors import HostUnresolvable, NothingListening, ProbeError, ServerBusy, ZeroThroughput
from probes.iperf_parse import error_from_message, parse_iperf_json, receiver_intervals, sender_intervals

DATA = Path(__file__).parent / "data"
DEST = "127.0.0.1:5201"


def load(name):
    text = (DATA / name).read_text()
    return text, json.loads(text)


@pytest.mark.parametrize(
    "name, streams, omit_s, cc",
    [
        ("tcp_1stream_5s.json", 1, 0, None),
        ("tcp_10streams_10s_omit2.json", 10, 2, None),
        ("tcp_32streams_10s_reno.json", 32, 1, "reno"),
    ],
)
def test_recorded_result_is_parsed_field_by_field(name, streams, omit_s, cc):
    text, doc = load(name)
    result = parse_iperf_json(text, DEST)
    end = doc["end"]
    senders = [s["sender"] for s in end["streams"]]
    assert result.dest == DEST
    assert result.streams == streams == len(result.stream_rtts)
    assert result.omit_s == omit_s
    assert_allclose(result.throughput_bps, end["sum_received"]["bits_per_second"])
    assert_allclose(result.sender_bps, end["sum_sent"]["bits_per_second"])
    assert_allclose(result.duration_s, end["sum_received"]["seconds"])
    assert result.retransmits == end["sum_sent"]["retransmits"]
    # libiperf reports tcp_info RTTs in microseconds.
    assert_allclose([r.mean_s for r in result.stream_rtts], [s["mean_rtt"] * 1e-6 for s in senders])
    assert_allclose(result.rtt_mean_s, sum(s["mean_rtt"] for s in senders) / streams * 1e-6)
    assert_allclose(result.rtt_min_s, min(s["min_rtt"] for s in senders) * 1e-6)
    assert_allclose(result.rtt_max_s, max(s["max_rtt"] for s in senders) * 1e-6)
    assert result.mss_bytes == doc["start"]["tcp_mss_default"]
    assert result.congestion_control == end["sender_tcp_congestion"]
    if cc:
        assert result.congestion_control == cc
    assert result.started_at == doc["start"]["timestamp"]["timesecs"]
    # Each stream's receiver rate, in stream order; together they make up the receiver's total.
    assert_allclose(result.stream_bps, [s["receiver"]["bits_per_second"] for s in end["streams"]])
    assert len(result.stream_bps) == streams
    assert_allclose(sum(result.stream_bps), result.throughput_bps, rtol=1e-6)
    # Each stream's retransmissions, as its sender counted them, in the same order; they add up to the total.
    assert result.stream_retransmits == tuple(s["retransmits"] for s in senders)
    assert sum(result.stream_retransmits) == result.retransmits
    # The interval series is the receiver's, read from the plain server's text output: one
    # interval a second like the sender's (the server may add one cut short, which is dropped),
    # and together they carry the receiver's bytes to within the text's three significant digits.
    assert result.interval_side == "receiver"
    kept = [iv["sum"]["bits_per_second"] for iv in doc["intervals"] if not iv["sum"]["omitted"]]
    assert abs(len(result.interval_bps) - len(kept)) <= 1
    assert_allclose(sum(result.interval_bps), end["sum_received"]["bits_per_second"] * len(result.interval_bps),
                    rtol=0.01)
    assert result.throughput_stderr_bps is not None and result.throughput_stderr_bps >= 0
    assert json.loads(result.raw)["end"] == end  # raw is the report summarised (tests/probes/test_iperf_raw.py)


def test_a_json_server_s_intervals_are_taken_as_they_are():
    text, doc = load("tcp_3streams_6s_omit1_json_server.json")
    result = parse_iperf_json(text, DEST)
    server = doc["server_output_json"]["intervals"]
    kept = [iv["sum"]["bits_per_second"] for iv in server if not iv["sum"]["omitted"]]
    assert len(kept) >= 6 and result.interval_side == "receiver"
    assert_allclose(result.interval_bps, kept[: len(result.interval_bps)])
    assert len(result.interval_bps) >= len(kept) - 1  # at most a trailing interval cut short is dropped


@pytest.mark.parametrize("name", ["tcp_1stream_5s.json", "tcp_10streams_10s_omit2.json"])
def test_without_the_server_s_output_the_sender_s_series_is_used(name):
    _, doc = load(name)
    del doc["server_output_text"]
    result = parse_iperf_json(json.dumps(doc), DEST)
    kept = [iv["sum"]["bits_per_second"] for iv in doc["intervals"] if not iv["sum"]["omitted"]]
    assert result.interval_side == "sender"
    assert_allclose(result.interval_bps, kept)
    assert_allclose(sender_intervals(doc), kept)


SERVER_TEXT = """\
Accepted connection from 10.0.0.1, port 40000
[ ID] Interval           Transfer     Bitrate
[  5]   0.00-1.00   sec  1.00 MBytes  8.39 Mbits/sec                  (omitted)
[  7]   0.00-1.00   sec  1.00 MBytes  8.39 Mbits/sec                  (omitted)
[SUM]   0.00-1.00   sec  2.00 MBytes  16.8 Mbits/sec                  (omitted)
- - - - - - - - - - - - - - - - - - - - - - - - -
[  5]   0.00-1.00   sec   122 KBytes   999 Kbits/sec
[  7]   0.00-1.00   sec  1.00 MBytes  8.39 Mbits/sec
[SUM]   0.00-1.00   sec  1.12 MBytes  9.39 Mbits/sec
- - - - - - - - - - - - - - - - - - - - - - - - -
[  5]   1.00-2.00   sec   119 MBytes  1.00 Gbits/sec
[  7]   1.00-2.00   sec  0.00 Bytes  0.00 bits/sec
[SUM]   1.00-2.00   sec   119 MBytes  1.00 Gbits/sec
- - - - - - - - - - - - - - - - - - - - - - - - -
[  5]   2.00-3.00   sec  1.00 MBytes  8.39 Mbits/sec
[  7]   2.00-3.00   sec  1.00 MBytes  8.39 Mbits/sec
[SUM]   2.00-3.00   sec  2.00 MBytes  16.8 Mbits/sec
- - - - - - - - - - - - - - - - - - - - - - - - -
[SUM]   3.00-3.04   sec  64.0 KBytes  13.1 Mbits/sec
- - - - - - - - - - - - - - - - - - - - - - - - -
[ ID] Interval           Transfer     Bitrate
[  5]   0.00-3.04   sec   121 MBytes   334 Mbits/sec                  receiver
[  7]   0.00-3.04   sec  2.06 MBytes  5.68 Mbits/sec                  receiver
[SUM]   0.00-3.04   sec   123 MBytes   340 Mbits/sec                  receiver
"""


def test_server_text_gives_the_sum_lines_in_decimal_units_without_warm_up_totals_or_a_cut_interval():
    # The [SUM] lines only; the omitted one, the 0.04 s one and the closing "receiver" total are left out.
    assert_allclose(receiver_intervals({"server_output_text": SERVER_TEXT}), [9.39e6, 1.00e9, 16.8e6])


def test_server_text_of_one_stream_gives_that_stream_s_lines():
    one = "\n".join(line for line in SERVER_TEXT.splitlines() if not line.startswith(("[SUM]", "[  7]")))
    assert_allclose(receiver_intervals({"server_output_text": one}), [999e3, 1.00e9, 8.39e6])


def test_server_text_with_timestamps_is_read_the_same():
    # `iperf3 -s --timestamps` puts the time of day before each line.
    stamped = "\n".join(f"Tue Nov 24 14:00:0{i % 10} 2026 {line}" for i, line in enumerate(SERVER_TEXT.splitlines()))
    assert_allclose(receiver_intervals({"server_output_text": stamped}), [9.39e6, 1.00e9, 16.8e6])


def test_a_server_report_that_does_not_read_leaves_the_probe_with_the_sender_s_series():
    text, doc = load("tcp_3streams_6s_omit1_json_server.json")
    del doc["server_output_json"]["intervals"][2]["sum"]["bits_per_second"]
    result = parse_iperf_json(json.dumps(doc), DEST)
    assert result.interval_side == "sender"
    assert_allclose(result.interval_bps, sender_intervals(doc))
    assert_allclose(result.throughput_bps, doc["end"]["sum_received"]["bits_per_second"])


@pytest.mark.parametrize("doc", [{}, {"server_output_text": ""}, {"server_output_text": "iperf3: error - x\n"}])
def test_missing_or_empty_server_output_gives_no_receiver_series(doc):
    assert receiver_intervals(doc) == ()


def test_omitted_warm_up_intervals_are_left_out():
    text, doc = load("tcp_10streams_10s_omit2.json")
    omitted = sum(iv["sum"]["omitted"] for iv in doc["intervals"])
    assert omitted >= 1
    assert len(parse_iperf_json(text, DEST).interval_bps) == len(doc["intervals"]) - omitted


def test_32_stream_recording_is_larger_than_a_pipe_buffer():
    # The case the worker's fd 1 redirection exists for: more than 64 KiB of JSON.
    text, _ = load("tcp_32streams_10s_reno.json")
    assert len(text.encode()) > 65536
    assert parse_iperf_json(text, DEST).streams == 32


@pytest.mark.parametrize(
    "name, cls",
    [
        ("error_refused.json", NothingListening),
        ("error_busy.json", ServerBusy),
        ("error_unresolvable.json", HostUnresolvable),
    ],
)
def test_recorded_errors_map_to_their_class(name, cls):
    text, doc = load(name)
    with pytest.raises(cls) as info:
        parse_iperf_json(text, DEST)
    message = str(info.value)
    assert DEST in message and doc["error"] in message and "\n" not in message


@pytest.mark.parametrize(
    "message, cls",
    [
        ("unable to connect to server: Connection refused", NothingListening),
        ("the server is busy running a test. try again later", ServerBusy),
        ("unable to resolve host nonexistent.invalid: Name or service not known", HostUnresolvable),
        ("unable to connect to server: Name or service not known", HostUnresolvable),
        ("unable to connect to server: Temporary failure in name resolution", HostUnresolvable),
        ("unable to connect to server: No route to host", ProbeError),
        ("control socket has closed unexpectedly", ProbeError),
    ],
)
def test_error_strings_map_to_classes(message, cls):
    assert type(error_from_message(message, DEST)) is cls


def test_error_after_intervals_keeps_no_partial_result():
    text, doc = load("tcp_1stream_5s.json")
    doc["error"] = "the server has terminated"
    with pytest.raises(ProbeError, match="server has terminated"):
        parse_iperf_json(json.dumps(doc), DEST)


def test_zero_received_rate_raises_zero_throughput():
    _, doc = load("tcp_1stream_5s.json")
    doc["end"]["sum_received"]["bits_per_second"] = 0
    with pytest.raises(ZeroThroughput):
        parse_iperf_json(json.dumps(doc), DEST)


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"start": {}}'])
def test_unreadable_output_raises_probe_error(text):
    with pytest.raises(ProbeError):
        parse_iperf_json(text, DEST)
