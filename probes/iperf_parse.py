"""Pure parsing of libiperf's JSON output (iperf3 3.x, TCP client side) into a ProbeResult."""

from __future__ import annotations

import json
import re
import statistics
from typing import Any

from probes.errors import (
    HostUnresolvable,
    NothingListening,
    ProbeError,
    ServerBusy,
    ZeroThroughput,
)
from probes.result import ProbeResult, StreamRtt
from probes.settle import assess_series

_US = 1e-6  # libiperf reports tcp_info RTTs in microseconds

#: The most characters a probe's ``raw`` record holds, here and where the API takes a pushed probe.
#: :func:`raw_summary` stays well inside it for 128 streams x 600 s (about 0.2 M characters) and
#: enforces it whatever the input.
RAW_MAX_CHARS = 1_000_000
RAW_FORM = "iperf3-summary/1"
_COMPACT = (",", ":")

# Substrings of libiperf's error text (iperf_strerror, 3.x) and of getaddrinfo's messages,
# checked in order; the first that matches names the error class.
_ERROR_PATTERNS: tuple[tuple[str, type[ProbeError]], ...] = (
    ("unable to resolve host", HostUnresolvable),
    ("name or service not known", HostUnresolvable),
    ("temporary failure in name resolution", HostUnresolvable),
    ("no address associated with hostname", HostUnresolvable),
    ("nodename nor servname", HostUnresolvable),
    ("server is busy", ServerBusy),
    ("connection refused", NothingListening),
)


def error_from_message(message: str, dest: str) -> ProbeError:
    """The ProbeError for one of libiperf's error strings, with a one-line message naming ``dest``."""
    lowered = message.lower()
    for pattern, cls in _ERROR_PATTERNS:
        if pattern in lowered:
            break
    else:
        cls = ProbeError
    what = {
        HostUnresolvable: f"host of {dest} does not resolve",
        NothingListening: f"nothing listening at {dest} (is `iperf3 -s` running there?)",
        ServerBusy: f"the iperf3 server at {dest} is busy with another test; try again later",
    }.get(cls, f"iperf3 probe to {dest} failed")
    return cls(f"{what} (iperf3: {message.strip()})")


def parse_iperf_json(text: str, dest: str) -> ProbeResult:
    """Parse the JSON document of one iperf3 TCP client run.

    Raises the matching ProbeError for libiperf's ``"error"`` member (no partial result is kept,
    even when intervals were reported before the error), ProbeError for text that is not an
    iperf3 TCP result, and ZeroThroughput when the receiver counted no bits.
    ``interval_bps`` is the receiver's per-interval sum (:func:`receiver_intervals`, from the
    server's output the client asked for) or, when the server's output is missing or unreadable,
    the sender's; omitted (warm-up) intervals are left out either way and ``interval_side`` says
    whose series it is. ``settled`` and ``throughput_stderr_bps`` come from
    :func:`probes.settle.assess_series` with its default rule. ``raw`` is :func:`raw_summary` of
    the document, not the document.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ProbeError(f"iperf3 probe to {dest} produced output that is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ProbeError(f"iperf3 probe to {dest} produced JSON that is not an object")
    if doc.get("error"):
        raise error_from_message(str(doc["error"]), dest)
    try:
        return _result(doc, dest)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProbeError(f"iperf3 probe to {dest} produced an incomplete result ({exc!r})") from exc


def _result(doc: dict[str, Any], dest: str) -> ProbeResult:
    start, end = doc["start"], doc["end"]
    test_start = start["test_start"]
    if test_start.get("protocol", "TCP") != "TCP":
        raise ProbeError(f"iperf3 probe to {dest} was not a TCP test")
    received, sent = end["sum_received"], end["sum_sent"]
    throughput_bps = float(received["bits_per_second"])
    if not throughput_bps > 0:
        raise ZeroThroughput(f"iperf3 probe to {dest} moved no data (receiver counted 0 bits/s)")

    rtts = tuple(
        StreamRtt(
            mean_s=s["sender"]["mean_rtt"] * _US,
            min_s=s["sender"]["min_rtt"] * _US,
            max_s=s["sender"]["max_rtt"] * _US,
        )
        for s in end.get("streams", [])
        if "sender" in s and "mean_rtt" in s["sender"]
    )
    received_streams = [s for s in end.get("streams", []) if "receiver" in s and "bits_per_second" in s["receiver"]]
    stream_bps = tuple(float(s["receiver"]["bits_per_second"]) for s in received_streams)
    # The sender counts each stream's retransmissions (TCP_INFO); kept only when every stream has them.
    stream_retrans = [s.get("sender", {}).get("retransmits") for s in received_streams]
    stream_retransmits = tuple(int(r) for r in stream_retrans) if stream_retrans and None not in stream_retrans else ()
    intervals, side = receiver_intervals(doc), "receiver"
    if len(intervals) < _MIN_RECEIVER_INTERVALS:
        intervals, side = sender_intervals(doc), "sender"
    verdict = assess_series(intervals)
    retransmits = sent.get("retransmits")
    mss = start.get("tcp_mss") or start.get("tcp_mss_default")
    return ProbeResult(
        dest=dest,
        streams=int(test_start["num_streams"]),
        duration_s=float(received.get("seconds", test_start["duration"])),
        omit_s=float(test_start.get("omit", 0)),
        throughput_bps=throughput_bps,
        sender_bps=float(sent["bits_per_second"]),
        retransmits=int(retransmits) if retransmits is not None else None,
        rtt_mean_s=sum(r.mean_s for r in rtts) / len(rtts) if rtts else None,
        rtt_min_s=min(r.min_s for r in rtts) if rtts else None,
        rtt_max_s=max(r.max_s for r in rtts) if rtts else None,
        stream_rtts=rtts,
        mss_bytes=int(mss) if mss else None,
        congestion_control=end.get("sender_tcp_congestion"),
        started_at=float(start.get("timestamp", {}).get("timesecs", 0.0)),
        throughput_stderr_bps=verdict.stderr_bps,
        settled=verdict.settled,
        interval_bps=intervals,
        interval_side=side,
        stream_bps=stream_bps,
        stream_retransmits=stream_retransmits,
        raw=raw_summary(doc),
    )


def raw_summary(doc: dict[str, Any]) -> str:
    """The record kept as a probe's ``raw``: iperf3's JSON without its per-interval per-stream data.

    iperf3 reports every stream in every interval, so its document grows with streams x seconds
    (128 streams for 12 s is past a million characters). The summary keeps ``start``, ``end``
    (each stream's totals: what ``stream_bps`` and ``stream_retransmits`` come from), each
    interval's ``sum`` (the sender's series), and the server's report the same way (its JSON's
    interval sums, or its text without per-stream interval lines when it has [SUM] lines), so
    :func:`parse_iperf_json` reads the summary as it read the document. ``form`` names this record.
    At most :data:`RAW_MAX_CHARS` characters: should the summary be longer, the interval series go
    (``intervals_dropped`` says so), then all but the totals.
    """
    summary: dict[str, Any] = {"form": RAW_FORM, **_without_stream_intervals(doc)}
    if isinstance(doc.get("server_output_json"), dict):
        summary["server_output_json"] = _without_stream_intervals(doc["server_output_json"])
    if isinstance(doc.get("server_output_text"), str):
        summary["server_output_text"] = _text_without_stream_intervals(doc["server_output_text"])
    text = json.dumps(summary, separators=_COMPACT)
    if len(text) <= RAW_MAX_CHARS:
        return text
    intervals = len(summary.get("intervals", []))
    for key in ("intervals", "server_output_json", "server_output_text"):
        summary.pop(key, None)
    summary["intervals_dropped"] = intervals
    text = json.dumps(summary, separators=_COMPACT)
    if len(text) <= RAW_MAX_CHARS:
        return text
    end = doc.get("end") if isinstance(doc.get("end"), dict) else {}
    return json.dumps({"form": RAW_FORM, "intervals_dropped": intervals, "streams_dropped": True,
                       "end": {k: end[k] for k in ("sum_sent", "sum_received") if k in end}},
                      separators=_COMPACT)[:RAW_MAX_CHARS]


def _without_stream_intervals(doc: dict[str, Any]) -> dict[str, Any]:
    """``start``, ``end`` and each interval's ``sum`` of an iperf3 JSON document."""
    kept = {key: doc[key] for key in ("start", "end") if key in doc}
    intervals = doc.get("intervals")
    if isinstance(intervals, list):
        kept["intervals"] = [{"sum": iv["sum"]} for iv in intervals if isinstance(iv, dict) and "sum" in iv]
    return kept


def _text_without_stream_intervals(text: str) -> str:
    """iperf3's text report without each stream's interval lines, when [SUM] lines carry the intervals."""
    lines = text.splitlines()
    matches = [_TEXT_INTERVAL.search(line) for line in lines]
    if not any(m and m["id"] == "SUM" for m in matches):
        return text  # one stream: its own lines are the series
    return "\n".join(line for line, m in zip(lines, matches)
                     if not m or m["id"] == "SUM" or "sender" in m["rest"] or "receiver" in m["rest"])


# A receiver series shorter than this is not used: the server's output was cut or did not parse.
_MIN_RECEIVER_INTERVALS = 3

# A trailing interval shorter than this share of the typical one (the server's last, cut by the
# end of the test) is left out: its rate is a handful of segments' worth of noise.
_SHORT_INTERVAL_SHARE = 0.5

# One interval line of iperf3's text output: "[SUM]   1.00-2.00   sec  10.5 MBytes  88.1 Mbits/sec  ...",
# anywhere in the line (a server run with --timestamps puts the time first).
_TEXT_INTERVAL = re.compile(
    r"\[\s*(?P<id>SUM|\d+)\]\s+(?P<start>[\d.]+)-(?P<end>[\d.]+)\s+sec\s+[\d.]+\s+\w?Bytes\s+"
    r"(?P<rate>[\d.]+)\s+(?P<unit>[KMGT]?)bits/sec(?P<rest>.*)$"
)
_RATE_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # iperf3 rates are decimal


def sender_intervals(doc: dict[str, Any]) -> tuple[float, ...]:
    """The sender's per-interval rate (bits/s) from a client's JSON result, omitted intervals left out."""
    return tuple(
        float(iv["sum"]["bits_per_second"])
        for iv in doc.get("intervals", [])
        if not iv["sum"].get("omitted", False)
    )


def receiver_intervals(doc: dict[str, Any]) -> tuple[float, ...]:
    """The receiver's per-interval rate (bits/s) from the server output in a client's JSON result.

    The client asks for it with ``--get-server-output``; a server run as ``iperf3 -s -J`` sends
    JSON (``server_output_json``), a plain ``iperf3 -s`` its text (``server_output_text``, rates
    to three significant digits). Omitted (warm-up) intervals and a cut trailing interval are
    left out. Returns () when there is no server output or it holds no interval lines; a server
    report that does not read as one is no reason to fail the probe (the sender's series stands in).
    """
    spans: list[tuple[float, float]] = []  # (seconds, bits/s)
    server_json = doc.get("server_output_json")
    if isinstance(server_json, dict):
        try:
            for iv in server_json.get("intervals", []):
                total = iv["sum"]
                if not total.get("omitted", False):
                    spans.append((float(total["end"]) - float(total["start"]), float(total["bits_per_second"])))
        except (KeyError, TypeError, ValueError, AttributeError):
            return ()
    elif isinstance(doc.get("server_output_text"), str):
        spans = _text_intervals(doc["server_output_text"])
    if not spans:
        return ()
    typical_s = statistics.median(seconds for seconds, _ in spans)
    return tuple(rate for seconds, rate in spans if seconds >= _SHORT_INTERVAL_SHARE * typical_s)


def _text_intervals(text: str) -> list[tuple[float, float]]:
    """(seconds, bits/s) of each interval in iperf3's text output: the [SUM] lines, or the one stream's."""
    by_id: dict[str, list[tuple[float, float]]] = {}
    for line in text.splitlines():
        match = _TEXT_INTERVAL.search(line)
        if not match:
            continue
        rest = match["rest"]
        # Warm-up intervals, and the closing totals ("sender" / "receiver"), are not intervals of the test.
        if "omitted" in rest or "sender" in rest or "receiver" in rest:
            continue
        seconds = float(match["end"]) - float(match["start"])
        by_id.setdefault(match["id"], []).append((seconds, float(match["rate"]) * _RATE_UNITS[match["unit"]]))
    if "SUM" in by_id:
        return by_id["SUM"]
    return next(iter(by_id.values())) if len(by_id) == 1 else []
