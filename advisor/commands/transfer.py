"""`tame transfer DEST`: open the advice for DEST as advised, run the transfer (iperf3 stands in for the data),
and report what it got as an observation.

The advice comes from the local store, or from the server at TAME_URL (TAME_TOKEN to write the observation
there). Fractional form (no --streams): floor(n*) standard streams to DEST's port plus, when the advice has a
fractional stream, one stream under the tame congestion control to --fractional-port, at the FM the measured
share law gives (advisor.opening.how_to_open), set for DEST's address for the transfer and put back after.
Aggregate form (--streams N): N tame streams, each at the FM that makes them together take n*'s share.
The observation keeps each stream's rate, retransmissions and control; one with a tame stream does not refit
the curve (advisor/observations.py says why).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from advisor.advice import Advice
from advisor.cli import UsageError
from advisor.commands.cc import report_pruned, setting_for
from advisor.commands.common import (
    add_src_option, format_bps, n_star_text, port_number, print_json, service_token, service_url, whole_number,
)
from advisor.commands.runtime import on_stop_signals
from advisor.destinations import Destination, parse_destination
from advisor.errors import AdvisorError, InvalidRequest
from advisor.limits import MAX_PROBE_STREAMS, parse_number
from advisor.observations import Observation
from advisor.opening import how_to_open
from advisor.tame import calibration_warnings, window_floor_warning
from probes import cc, cc_map
from probes.controls import available_controls, host_default_control
from probes.errors import CcBusy, CcError, ProbeError
from probes.transfer import ClientSpec, TransferResult, run_transfer

DEFAULT_FRACTIONAL_PORT = 5202
# iperf3 runs a test for at most a day (its MAX_TIME); a transfer of bytes may not have more than a PiB to move.
MAX_DURATION_S = 86400.0
MAX_BYTES = 2**50
# The wall-clock budget beyond --duration (connecting, the end of the test), and of a --bytes transfer.
DEADLINE_SLACK_S = 30.0
DEFAULT_BYTES_TIMEOUT_S = 3600.0
EXIT_TRANSFER_FAILED = 1
# Seconds between the sends of an observation the service did not take (no answer, 5xx, 408, 429): a replica
# restarting loses no transfer's report.
OBSERVATION_RETRY_DELAYS_S = (1.0, 3.0)
# Sent again only within this many seconds of the first send: a service that timed out (30 s) is not waited for
# again, and a transfer ends soon after it ran.
OBSERVATION_RETRY_WITHIN_S = 10.0


def _budget(text: str) -> float:
    try:
        value = parse_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a fraction such as 0.1 for 10 %") from None
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 1]; give a fraction above 0, such as 0.1 for 10 %")
    return value


def _seconds(text: str) -> float:
    try:
        value = parse_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 1.0 <= value <= MAX_DURATION_S):
        raise argparse.ArgumentTypeError(f"{text} is outside 1..{MAX_DURATION_S:g} seconds")
    return value


_byte_count = whole_number(1, MAX_BYTES, "a whole number of bytes (e.g. 1000000000)")
_stream_count = whole_number(1, MAX_PROBE_STREAMS, why=f" (iperf3 opens at most {MAX_PROBE_STREAMS} streams)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "transfer", help="open the advice for DEST and run a transfer with iperf3, then report it (root for tame)",
        description="Gets the advice for DEST (local store, or TAME_URL), opens it (standard streams plus a tame "
        "stream at the advice's fractional multiplier, or --streams N tame streams) with iperf3 standing in for "
        "the data, and stores what it got as an observation. DEST runs 'iperf3 -s' on its port and, for the "
        "fractional form, on --fractional-port too. Tame streams need root and 'tame cc load'.")
    parser.add_argument("dest", metavar="DEST[:PORT]",
                        help="the destination's IPv4 or IPv6 address ([ADDR]:PORT for IPv6 with a port), port 5201 "
                        "if none: the tame setting is kept per address")
    parser.add_argument("--max-impact", type=_budget, required=True,
                        help="largest tolerated throughput loss of competing flows, fraction above 0, at most 1")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--duration", type=_seconds, metavar="SECONDS", help="run the transfer this long")
    size.add_argument("--bytes", type=_byte_count, metavar="N",
                      help="move N bytes (the fractional form splits them in proportion to each part's share of n*)")
    parser.add_argument("--streams", type=_stream_count, metavar="N",
                        help="aggregate form: open N streams, all tame, scaled to take n*'s share together "
                        "(N at least ceil(n*); N standard streams when that is n*'s share)")
    parser.add_argument("--fractional-port", type=port_number, default=DEFAULT_FRACTIONAL_PORT, metavar="PORT",
                        help=f"DEST's second iperf3 server, for the tame stream (default {DEFAULT_FRACTIONAL_PORT})")
    parser.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                        help=f"stop the transfer after this long (default: --duration + {DEADLINE_SLACK_S:g} s, "
                        f"or {DEFAULT_BYTES_TIMEOUT_S:g} s for --bytes)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_src_option(parser, "this transfer runs from, whose link's advice it follows and reports to")
    parser.set_defaults(handler=run)


@dataclass(frozen=True)
class Opened:
    """What the transfer opens: the iperf3 clients, and the tame stream's FM (None without one)."""

    form: str  # "fractional", "standard" (the advice has no fractional stream) or "aggregate"
    standard_streams: int
    tame_streams: int
    fractional_multiplier: float | None
    tcp_equivalent_streams: float
    clients: tuple[ClientSpec, ...]

    @property
    def congestion_control(self) -> str:
        """The tame control when a stream runs it, else the standard streams'."""
        return cc.NAME if self.tame_streams else self.clients[0].congestion_control

    def to_json(self) -> dict[str, Any]:
        return {"standard_streams": self.standard_streams, "fractional_multiplier": self.fractional_multiplier,
                "congestion_control": self.congestion_control, "streams": self.standard_streams + self.tame_streams}


def plan_opening(advice: Advice, dest: Destination, rtt_s: float | None, standard_control: str,
                 streams: int | None, fractional_port: int, total_bytes: int | None) -> Opened:
    """The clients that open ``advice`` (UsageError when ``streams`` cannot carry it)."""
    n_star = float(advice.tcp_equivalent_streams)
    if streams is not None:
        if not n_star > 0:
            raise UsageError(f"the advice for {dest.key} is n* {n_star:g}: no share to scale {streams} streams to; "
                             "leave out --streams to open what the advice says")
        setting = setting_for(n_star, streams, rtt_s, standard_control, n_star_named="the advice's n*")
        if setting.fractional_multiplier is None:  # N standard streams are n*'s share
            return standard_opening(dest.port, streams, standard_control, total_bytes)
        client = ClientSpec(dest.port, streams, cc.NAME, total_bytes)
        return Opened("aggregate", 0, streams, setting.fractional_multiplier, n_star, (client,))
    opening = how_to_open(dataclasses.replace(advice, congestion_control=standard_control), dest.key, rtt_s)
    if opening["form"] == "none":
        raise UsageError(f"the advice for {dest.key} opens nothing: {opening['note']}")
    standard, fm = opening["standard_streams"], opening["fractional_multiplier"]
    if standard > MAX_PROBE_STREAMS:
        raise UsageError(f"the advice opens {standard} standard streams; iperf3 opens at most {MAX_PROBE_STREAMS}")
    if fm is None:
        return standard_opening(dest.port, standard, standard_control, total_bytes)
    if fractional_port == dest.port:
        raise UsageError(f"--fractional-port {fractional_port} is DEST's own port: the tame stream needs a second "
                         "iperf3 server (iperf3 -s -p PORT) on DEST")
    remainder = n_star - standard
    tame_bytes = standard_bytes = None
    if total_bytes is not None:  # each part carries its share of n*, so both should finish together
        tame_bytes = max(1, round(total_bytes * remainder / n_star)) if standard else total_bytes
        standard_bytes = max(1, total_bytes - tame_bytes)
    clients = (ClientSpec(dest.port, standard, standard_control, standard_bytes),) if standard else ()
    clients += (ClientSpec(fractional_port, 1, cc.NAME, tame_bytes),)
    return Opened("fractional", standard, 1, fm, n_star, clients)


def standard_opening(port: int, streams: int, control: str, total_bytes: int | None) -> Opened:
    """``streams`` standard streams of ``control`` to ``port`` (one iperf3 client), no tame stream."""
    return Opened("standard", streams, 0, None, float(streams), (ClientSpec(port, streams, control, total_bytes),))


def observation_of(opened: Opened, result: TransferResult, standard_control: str) -> Observation:
    """What a transfer that opened ``opened`` reports: its totals and each stream's detail."""
    return Observation.checked(
        result.streams, result.throughput_bps, congestion_control=standard_control, stream_bps=result.stream_bps,
        stream_retransmits=result.stream_retransmits, stream_congestion_controls=result.stream_congestion_controls,
        fractional_multiplier=opened.fractional_multiplier, tcp_equivalent_streams=opened.tcp_equivalent_streams,
        duration_s=result.duration_s)


def run(args) -> int:
    if args.timeout is not None and args.duration is not None and args.timeout < args.duration:
        raise UsageError(f"--timeout {args.timeout:g} s is shorter than --duration {args.duration:g} s: the transfer "
                         "would be stopped before it ends; give a longer --timeout, or none")
    dest = _destination(args.dest)
    address = cc.canonical_address(dest.host)
    server = service_url(os.environ.get("TAME_URL"))
    with Reporter(server) as service:
        reporter = service.link(args.src, dest)
        payload = reporter.advice(args.max_impact)
        advice = Advice(**{k: v for k, v in payload.items() if k in Advice.__dataclass_fields__})
        rtt_s = (payload.get("open") or {}).get("rtt_s")
        # The advice's probed control when the service knows it, else this host's: what its standard streams run.
        standard_control = payload.get("congestion_control") or host_default_control()
        opened = plan_opening(advice, dest, rtt_s, standard_control, args.streams, args.fractional_port, args.bytes)
        if opened.form == "aggregate":  # the fractional form's warning is the advice's own
            beyond = calibration_warnings(opened.fractional_multiplier, standard_control, rtt_s, aggregate=True)
            floor = window_floor_warning(opened.tame_streams, rtt_s, advice.tcp_equivalent_streams,
                                         advice.tcp_equivalent_throughput_bps())
            for warning in [*beyond, *([floor] if floor else [])]:
                print(f"tame transfer: warning: {warning}", file=sys.stderr)
        _check_can_open(opened, standard_control)
        deadline_s = args.timeout or (args.duration + DEADLINE_SLACK_S if args.duration else DEFAULT_BYTES_TIMEOUT_S)
        with contextlib.ExitStack() as held:
            if opened.fractional_multiplier is not None:
                try:
                    held.enter_context(cc_map.exclusive_setting(address))
                except CcBusy as exc:  # nothing has run
                    raise UsageError(str(exc)) from None
            try:
                result = _transfer(address, opened, args.duration, deadline_s)
            except (ProbeError, CcError) as exc:
                print(f"tame transfer: {exc}", file=sys.stderr)
                return EXIT_TRANSFER_FAILED
        stored, error = reporter.observe(observation_of(opened, result, standard_control))
    out = {"src": payload.get("src"), "dest": dest.key, "advice": payload, "opened": opened.to_json(),
           "throughput_bps": result.throughput_bps,
           "duration_s": result.duration_s, "observation_id": stored["id"] if stored else None}
    if args.json:
        print_json(out)
    else:
        _print(out, opened, result, stored)
    if error is not None:
        print(f"tame transfer: the transfer ran but its observation was not stored: {error}", file=sys.stderr)
        return EXIT_TRANSFER_FAILED
    return 0


def _destination(text: str) -> Destination:
    try:
        dest = parse_destination(text)
    except InvalidRequest as exc:
        raise UsageError(f"DEST {text!r}: {exc}") from None
    try:
        cc.canonical_address(dest.host)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return dest


def _check_can_open(opened: Opened, standard_control: str) -> None:
    """Refuse before anything runs: tame streams need root and the control registered; every control must exist."""
    if opened.tame_streams:
        hint = f"tame streams need root and the {cc.NAME} control loaded: run 'tame cc load' as root, then this as root"
        if os.geteuid() != 0:
            raise UsageError(f"not running as root; {hint}")
        try:
            registered = cc.registration() is not None
        except CcError as exc:
            raise UsageError(f"cannot tell whether {cc.NAME} is loaded ({exc}); {hint}") from exc
        if not registered:
            raise UsageError(f"the {cc.NAME} congestion control is not loaded; {hint}")
    if opened.standard_streams and standard_control not in available_controls():
        raise UsageError(f"the standard streams' congestion control {standard_control!r} is not available here "
                         f"(net.ipv4.tcp_available_congestion_control: {' '.join(available_controls())}); "
                         f"load its module (modprobe tcp_{standard_control})")


def _transfer(address, opened: Opened, duration_s: float | None, deadline_s: float) -> TransferResult:
    """Run the clients; the tame FM is set for ``address`` for the transfer and put back after, whatever happens."""
    # A plain kill (SIGTERM) or a hang-up (SIGHUP: the terminal or SSH session went) unwinds like Ctrl-C, so the FM
    # entry is put back and the clients are reaped; a signal the caller set to be ignored (nohup) stays ignored.
    with on_stop_signals(_terminate):
        if opened.fractional_multiplier is None:
            return run_transfer(str(address), opened.clients, duration_s, deadline_s)
        setting = cc_map.CcSetting(opened.fractional_multiplier, scale_slow_start=cc_map.SCALE_SLOW_START_BY_DEFAULT)
        with cc_map.temporary_setting(address, setting) as pruned:
            if pruned is not None:
                report_pruned(pruned, "tame transfer")
            return run_transfer(str(address), opened.clients, duration_s, deadline_s)


def _terminate(signum, frame):
    raise KeyboardInterrupt


class Reporter:
    """Where advice comes from and observations go: the local store, or the server at ``url`` (TAME_TOKEN, or
    TAME_READ_TOKEN for reads only). ``link(src, dest)`` is one link's view of it."""

    def __init__(self, url: str | None, database_url: str | None = None):
        self.url = url
        self.database_url = database_url
        self._store = self._service = self._client = None

    def __enter__(self) -> "Reporter":
        if self.url:
            from api.client import TameClient  # the CLI is where the layers are wired together

            self._client = TameClient(self.url, token=service_token(), timeout_s=30)
        else:
            from advisor.commands.runtime import load_settings, open_store
            from advisor.service import AdviceService

            settings = load_settings()
            if self.database_url:
                settings = dataclasses.replace(settings, database_url=self.database_url)
            self._store = open_store(settings)
            self._service = AdviceService(self._store, settings)
        return self

    def __exit__(self, *exc) -> None:
        if self._client is not None:
            self._client.close()
        if self._store is not None:
            self._store.close()

    def link(self, src: str | None, dest: Destination) -> "LinkReporter":
        return LinkReporter(self, src, dest)


@dataclass(frozen=True)
class LinkReporter:
    """The advice and observations of one link: ``src`` (a site; None: the service's own) to ``dest``."""

    reporter: Reporter
    src: str | None
    dest: Destination

    @property
    def name(self) -> str:
        return f"{self.src} -> {self.dest.key}" if self.src else self.dest.key

    def advice(self, max_impact: float, cc_name: str | None = None) -> dict[str, Any]:
        """The service's advice (UsageError when it has none or refuses)."""
        rep = self.reporter
        if rep._client is not None:
            from api.client import TameError

            try:
                payload = rep._client.advice(self.dest.key, max_impact, cc=cc_name, src=self.src)
            except TameError as exc:
                raise UsageError(f"{rep._client.shown_url}: {self.name}: {exc}" + (
                    f"; probe it first (tame advise {self.dest.key} --max-impact {max_impact:g})"
                    if exc.status == 404 else "")) from exc
            # A service without source sites ignores ?src= and answers for its own: not this link's advice.
            if self.src is not None and payload.get("src") != self.src:
                raise UsageError(f"{rep._client.shown_url}: {self.name}: the service answered for source "
                                 f"{payload.get('src')!r}, not {self.src!r}: it keeps no advice per source site")
            return payload
        try:
            payload = rep._service.advice(self.dest.key, max_impact, cc_name, src=self.src)
            # Refused now, not after the transfer ran: the observation becomes advice, as for the service's probes.
            rep._service.check_allowed(self.dest)
        except AdvisorError as exc:
            raise UsageError(f"{self.name}: {exc}") from exc
        return payload

    def observe(self, observation: Observation) -> tuple[dict[str, Any] | None, str | None]:
        """(the service's answer, None), or (None, why it was not stored)."""
        detail = observation.to_json()
        streams, throughput_bps = detail.pop("streams"), detail.pop("throughput_bps")
        rep = self.reporter
        if rep._client is not None:
            from api.client import TameError

            # Sent again under one Idempotency-Key when the service did not answer: stored once whatever happened.
            key = uuid.uuid4().hex
            started = time.monotonic()
            for delay_s in (*OBSERVATION_RETRY_DELAYS_S, None):
                try:
                    return rep._client.observe(self.dest.key, streams, throughput_bps, idempotency_key=key,
                                               src=self.src, **detail), None
                except TameError as exc:
                    if (delay_s is None or not exc.retryable
                            or time.monotonic() + delay_s - started > OBSERVATION_RETRY_WITHIN_S):
                        return None, f"{rep._client.shown_url}: {exc}"
                time.sleep(delay_s)
        try:
            return rep._service.observe(self.dest.key, streams, throughput_bps, src=self.src, **detail), None
        except AdvisorError as exc:
            return None, str(exc)


def _print(out: dict[str, Any], opened: Opened, result: TransferResult, stored: dict[str, Any] | None) -> None:
    advice = out["advice"]
    if opened.form == "aggregate":
        what = f"{opened.tame_streams} {cc.NAME} streams at FM {opened.fractional_multiplier:g}"
    elif opened.tame_streams:
        what = (f"{opened.standard_streams} standard ({opened.clients[0].congestion_control}) + 1 {cc.NAME} stream "
                f"at FM {opened.fractional_multiplier:g}" if opened.standard_streams
                else f"1 {cc.NAME} stream at FM {opened.fractional_multiplier:g}")
    else:
        what = f"{opened.standard_streams} standard stream{'' if opened.standard_streams == 1 else 's'} " \
               f"({opened.clients[0].congestion_control})"
    print(f"{out['dest']}: {what} for n* {n_star_text(advice['tcp_equivalent_streams'])} (budget {advice['max_impact']:.1%})")
    parts = ", ".join(f"{r.congestion_control} {format_bps(r.throughput_bps)}" for r in result.results)
    print(f"throughput: {format_bps(out['throughput_bps'])} over {out['duration_s']:.1f} s ({parts})")
    if stored is not None:
        use = "used to refit" if stored.get("feeds_fit") else f"kept, not used to refit (it had a {cc.NAME} stream)"
        print(f"observation {stored['id']} stored: {use}")
