"""A probe's raw record is iperf3's report without its per-interval per-stream data, and bounded (issue 31, defect 8)."""

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from api.schemas import ProbeResultIn
from probes.iperf_parse import RAW_FORM, RAW_MAX_CHARS, parse_iperf_json, raw_summary

DATA = Path(__file__).parent / "data"
DEST = "127.0.0.1:5201"
RECORDED = ["tcp_1stream_5s.json", "tcp_10streams_10s_omit2.json", "tcp_32streams_10s_reno.json",
            "tcp_3streams_6s_omit1_json_server.json"]


def measured(result):
    """Everything a ProbeResult says but its raw record."""
    return {k: v for k, v in dataclasses.asdict(result).items() if k != "raw"}


def synthesised(streams, seconds):
    """The recorded 32-stream run scaled to ``streams`` streams and ``seconds`` one-second intervals.

    Each interval lists every stream as iperf3 does (copies of the recorded first stream), and the
    server's text report has a line per stream per interval plus its [SUM] line: the shape whose
    size grows as streams x seconds.
    """
    doc = json.loads((DATA / "tcp_32streams_10s_reno.json").read_text())
    one = doc["intervals"][1]
    doc["intervals"] = []
    for second in range(seconds):
        interval = copy.deepcopy(one)
        interval["streams"] = [dict(one["streams"][0], socket=5 + i, start=second, end=second + 1)
                               for i in range(streams)]
        interval["sum"] = dict(one["sum"], start=second, end=second + 1, omitted=False)
        doc["intervals"].append(interval)
    doc["end"]["streams"] = [copy.deepcopy(doc["end"]["streams"][i % 32]) for i in range(streams)]
    doc["start"]["test_start"].update(num_streams=streams, duration=seconds, omit=0)
    lines = ["[ ID] Interval           Transfer     Bitrate"]
    for second in range(seconds):
        span = f"{second:6.2f}-{second + 1:<6.2f}"
        lines += [f"[{5 + i:3d}] {span} sec   101 MBytes   850 Mbits/sec" for i in range(streams)]
        lines.append(f"[SUM] {span} sec  12.6 GBytes  109 Gbits/sec")
    lines += [f"[{5 + i:3d}]   0.00-{seconds:.2f}  sec   606 MBytes   508 Mbits/sec   receiver" for i in range(streams)]
    doc["server_output_text"] = "\n".join(lines)
    return json.dumps(doc, indent="\t")  # as iperf3 prints it


@pytest.mark.parametrize("name", RECORDED)
def test_the_raw_summary_of_a_recorded_run_reads_back_as_the_same_measurement(name):
    text = (DATA / name).read_text()
    result = parse_iperf_json(text, DEST)
    summary = json.loads(result.raw)
    assert summary["form"] == RAW_FORM
    assert summary["end"] == json.loads(text)["end"]  # each stream's totals are all there
    assert all(set(interval) == {"sum"} for interval in summary["intervals"])
    # The parser gets from the summary everything it got from the whole report.
    assert measured(parse_iperf_json(result.raw, DEST)) == measured(result)


def test_the_32_stream_recording_s_summary_is_a_fraction_of_it():
    text = (DATA / "tcp_32streams_10s_reno.json").read_text()
    raw = parse_iperf_json(text, DEST).raw
    assert len(raw) < len(text) / 3, (len(raw), len(text))


@pytest.mark.parametrize("streams, seconds", [(128, 20), (128, 600)])
def test_many_streams_for_long_fit_the_bound_the_api_accepts(streams, seconds):
    text = synthesised(streams, seconds)
    assert len(text) > RAW_MAX_CHARS  # what was refused before: iperf3's whole report
    result = parse_iperf_json(text, DEST)
    assert result.streams == streams and len(result.stream_bps) == streams
    assert len(result.interval_bps) == seconds
    assert len(result.raw) <= RAW_MAX_CHARS
    assert measured(parse_iperf_json(result.raw, DEST)) == measured(result)
    # The API's limit on a pushed probe's raw is the same bound, so the agent's push (JSON) is accepted.
    fields = {k: v for k, v in dataclasses.asdict(result).items() if k in ProbeResultIn.model_fields}
    assert ProbeResultIn.model_validate_json(json.dumps(fields)).raw == result.raw
    assert ProbeResultIn.model_fields["raw"].metadata[0].max_length == RAW_MAX_CHARS


def test_the_bound_holds_whatever_the_report():
    # A report that no summary keeps under the bound by dropping per-stream intervals: its interval
    # sums alone are too long. The series go, and the record says how many.
    doc = json.loads(synthesised(2, 3))
    doc["intervals"] = [{"sum": dict(doc["intervals"][0]["sum"], note="x" * 1000)} for _ in range(2000)]
    raw = raw_summary(doc)
    assert len(raw) <= RAW_MAX_CHARS
    assert json.loads(raw)["intervals_dropped"] == 2000
    assert json.loads(raw)["end"] == doc["end"]
