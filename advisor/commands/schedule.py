"""`tame schedule QUEUE_FILE`: a reference scheduler. Reads the advice for each queued transfer's link (over
HTTP, or with the schedulers' SQL), runs the transfers with the advised streams (iperf3 standing in for the
data, each on its source through the source's command prefix), and reports each one as an observation.

Every transfer opens the advice's whole standard streams (num_flows, what the SQL view gives too); the
fractional form with a tame stream is `tame transfer`'s. The advice is read for the whole queue before
anything runs, so a queue that names an unknown link or a budget out of range runs nothing (exit 2).
Observations go to --server (TAME_URL) when given, else into the store at --database-url (or the local one).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.cli import UsageError
from advisor.commands.common import format_bps, link_text, print_json, service_url, whole_number
from advisor.commands.runtime import load_settings, on_stop_signals
from advisor.commands.transfer import (DEADLINE_SLACK_S, DEFAULT_BYTES_TIMEOUT_S, Reporter, observation_of,
                                       standard_opening)
from advisor.errors import AdvisorError, InvalidRequest
from advisor.limits import MAX_PROBE_STREAMS, check_congestion_control
from advisor.schedule import MAX_QUEUE_BYTES, SqlAdvice, Transfer, parse_queue, run_concurrently
from probes.controls import available_controls, host_default_control
from probes.errors import ProbeError
from probes.transfer import run_transfer

EXIT_SOME_FAILED = 1
MAX_CONCURRENCY = 64


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "schedule", help="run a queue of transfers over several links with the advised streams, and report them",
        description="Reads each queued transfer's advice (HTTP from --server, or SQL from --database-url), runs "
        "the transfers with the advised standard streams (iperf3 clients on each source, through its command "
        "prefix), at most --concurrency at once and one at a time per destination, and stores each as an "
        "observation of its link. A queue is JSON ({\"sources\": {SITE: [ARGV...]}, \"transfers\": [{\"src\", "
        "\"dest\", \"max_impact\", \"duration_s\" or \"bytes\", \"cc\"?}]}) or lines of key=value fields.")
    parser.add_argument("queue", metavar="QUEUE_FILE", help="the transfers (JSON or key=value lines; - for stdin)")
    parser.add_argument("--server", metavar="URL",
                        help="the advice service (default TAME_URL): advice read over HTTP, observations sent "
                        "there (TAME_TOKEN to write)")
    parser.add_argument("--database-url", metavar="URL",
                        help="read the advice with SQL from this store (sqlite:///PATH or postgresql://...); "
                        "observations go to --server if given, else into this store")
    parser.add_argument("--netns", action="append", default=[], metavar="SITE=NS",
                        help="run SITE's transfers in network namespace NS (ip netns exec NS; repeat)")
    parser.add_argument("--congestion-control", metavar="NAME",
                        help="the standard streams' control for transfers without cc, over HTTP and SQL alike "
                        "(default: the service's over HTTP; TAME_CONGESTION_CONTROL, else this host's, over SQL)")
    parser.add_argument("--concurrency", type=whole_number(1, MAX_CONCURRENCY), default=4, metavar="N",
                        help="transfers running at once (default 4)")
    parser.add_argument("--plan", action="store_true", help="print the advised streams of each transfer and "
                        "run nothing")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


# Why the advice a transfer started on was stale, by where it was read: the service's answer (over HTTP, or from the
# store through the service in this process) is stale past its TTL or when its cache lags the store; the SQL read
# judges the store's newest evidence against TAME_TTL_S as this host's environment gives it.
_SERVICE_STALE = "its evidence was older than the service's TAME_TTL_S, or the service could not read its store in time"
_STALE = {"http": _SERVICE_STALE, "store": _SERVICE_STALE, "sql": "its evidence was older than TAME_TTL_S"}


@dataclass(frozen=True)
class Planned:
    """A transfer with the advice read for it: the standard streams to open and their control, and the advice's age
    and staleness (GET /v1/advice's age_s and stale; over SQL, advisor.schedule.SqlAdvice's)."""

    transfer: Transfer
    src: str | None  # the link's source site as the advice names it (the service's own when the queue names none)
    streams: int
    congestion_control: str
    source: str  # "http", "sql" or "store": where the advice was read
    age_s: float
    stale: bool

    def to_json(self) -> dict[str, Any]:
        t = self.transfer
        return {"index": t.index, "src": self.src, "dest": t.dest.key, "max_impact": t.max_impact,
                "duration_s": t.duration_s, "bytes": t.bytes, "advised_streams": self.streams,
                "congestion_control": self.congestion_control, "advice_read": self.source,
                "advice_age_s": self.age_s, "advice_stale": self.stale}


def run(args) -> int:
    server = (service_url(os.environ.get("TAME_URL")) if args.server is None
              else service_url(args.server, "--server"))
    try:
        queue = parse_queue(_read(args.queue), _netns_sources(args.netns))
    except InvalidRequest as exc:
        raise UsageError(f"{args.queue}: {exc}") from exc
    if args.congestion_control is not None:
        try:
            check_congestion_control(args.congestion_control, "--congestion-control")
        except InvalidRequest as exc:
            raise UsageError(str(exc)) from exc
    if args.database_url:
        # The service's site, default control and TTL, as this environment gives them (its errors name the variable).
        settings = load_settings()
        try:
            sql = SqlAdvice(args.database_url, settings.site, settings.congestion_control, settings.freshness)
        except AdvisorError as exc:
            raise UsageError(f"--database-url: {exc}") from exc
    else:
        sql = None
    try:
        with Reporter(server, args.database_url) as reporter:
            planned = [_plan(t, reporter, sql, args.congestion_control) for t in queue.transfers]
            if args.plan:
                _output(args, [p.to_json() for p in planned])
                return 0
            finished: list[dict[str, Any]] = []
            try:
                reports = _run_all(planned, queue, reporter, args.concurrency, finished)
            except KeyboardInterrupt:
                # Stopped (Ctrl-C, SIGTERM): what finished, stored or not, and the transfers it cut short are said.
                _output(args, sorted(finished, key=lambda row: row["index"]))
                raise
    finally:
        if sql is not None:
            sql.close()
    _output(args, reports)
    return EXIT_SOME_FAILED if any(r["error"] for r in reports) else 0


def _read(path: str) -> str:
    try:
        if path == "-":
            text = sys.stdin.read(MAX_QUEUE_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(MAX_QUEUE_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the queue file {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    return text


def _netns_sources(values: list[str]) -> dict[str, list[str]]:
    sources = {}
    for value in values:
        site, sep, ns = value.partition("=")
        if not sep or not site or not ns or "/" in ns or len(ns) > 255:
            raise UsageError(f"--netns {value!r}: give SITE=NAMESPACE, e.g. --netns siteA=ns-a")
        if site in sources:  # which of the two namespaces was meant cannot be told
            raise UsageError(f"--netns names site {site!r} twice; give each source once")
        sources[site] = ["ip", "netns", "exec", ns]
    return sources


def _plan(t: Transfer, reporter: Reporter, sql: SqlAdvice | None, default_control: str | None) -> Planned:
    """The advice for ``t``'s link: UsageError (nothing has run) when there is none or it cannot be opened."""
    src = t.src
    try:
        if sql is not None:
            control = t.cc or default_control or sql.default_control  # the service's: TAME_CONGESTION_CONTROL first
            advice, source = sql.advice(src, t.dest.key, control, t.max_impact), "sql"
            streams, age_s, stale = advice.streams, advice.age_s, advice.stale
            src = src or (sql.own_site if sql.has_src() else None)
        else:
            asked = t.cc or default_control  # None: the service's default
            payload = reporter.link(src, t.dest).advice(t.max_impact, asked)
            src = payload.get("src", src)
            streams, control = int(payload["num_flows"]), payload.get("congestion_control") or asked
            age_s, stale = payload["age_s"], payload["stale"]
            control = control or host_default_control()
            source = "http" if reporter.url else "store"
    except (AdvisorError, UsageError) as exc:
        raise UsageError(f"transfer {t.index + 1} ({t.link_name}): {exc}") from exc
    if streams > MAX_PROBE_STREAMS:
        raise UsageError(f"transfer {t.index + 1} ({t.link_name}): the advice opens {streams} streams; iperf3 "
                         f"opens at most {MAX_PROBE_STREAMS}")
    if control not in available_controls():
        raise UsageError(f"transfer {t.index + 1} ({t.link_name}): its streams' congestion control {control!r} is "
                         f"not available here ({' '.join(available_controls())}); load it (modprobe tcp_{control})")
    return Planned(t, src, streams, control, source, age_s, stale)


def _run_all(planned: list[Planned], queue, reporter: Reporter, concurrency: int,
             finished: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each transfer's report, in the queue's order; each is added to ``finished`` as it ends."""
    cancel = threading.Event()

    def one(p: Planned) -> dict[str, Any]:
        report = _one(p)
        finished.append(report)
        return report

    def _one(p: Planned) -> dict[str, Any]:
        t = p.transfer
        report = {**p.to_json(), "opened_streams": None, "throughput_bps": None, "transfer_duration_s": None,
                  "started_at": time.time(), "finished_at": None, "observation_id": None, "error": None}
        opened = standard_opening(t.dest.port, p.streams, p.congestion_control, t.bytes)
        deadline_s = t.duration_s + DEADLINE_SLACK_S if t.duration_s else DEFAULT_BYTES_TIMEOUT_S
        try:
            result = run_transfer(t.dest.host, opened.clients, t.duration_s, deadline_s,
                                  prefix=queue.prefix(t), cancel=cancel)
        except ProbeError as exc:
            report.update(finished_at=time.time(), error=f"the transfer failed: {exc}")
            return report
        report.update(opened_streams=result.streams, throughput_bps=result.throughput_bps,
                      transfer_duration_s=result.duration_s, finished_at=time.time())
        try:
            observation = observation_of(opened, result, p.congestion_control)
        except InvalidRequest as exc:
            report["error"] = f"the transfer ran but cannot be reported: {exc}"
            return report
        stored, error = reporter.link(t.src, t.dest).observe(observation)
        if stored is not None:
            report["observation_id"] = stored["id"]
        else:
            report["error"] = f"the transfer ran but its observation was not stored: {error}"
        return report

    # A plain kill (SIGTERM) unwinds like Ctrl-C: the running transfers are cancelled and their clients reaped.
    with on_stop_signals(_terminate, (signal.SIGTERM,)):
        return run_concurrently(planned, one, concurrency, key=lambda p: p.transfer.dest.key, cancel=cancel)


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _output(args, rows: list[dict[str, Any]]) -> None:
    if args.json:
        print_json({"transfers": rows})
    else:
        _print(rows)
    for row in rows:
        if row.get("error"):
            print(f"tame schedule: transfer {row['index'] + 1}: {row['error']}", file=sys.stderr)


def _print(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        link = link_text(row["src"], row["dest"], row["advice_age_s"], row["advice_stale"], _STALE[row["advice_read"]])
        streams = row["advised_streams"]
        head = (f"{row['index'] + 1}. {link}: budget {row['max_impact']:.1%}, advised {streams} "
                f"{row['congestion_control']} stream{'' if streams == 1 else 's'} ({row['advice_read']})")
        if "error" not in row:
            print(head)
            continue
        if row["throughput_bps"] is not None:
            head += (f", opened {row['opened_streams']}: {format_bps(row['throughput_bps'])} over "
                     f"{row['transfer_duration_s']:.1f} s")
        if row["observation_id"] is not None:
            head += f", observation {row['observation_id']}"
        print(head)
