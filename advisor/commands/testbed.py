"""`tame testbed up|down|status`: an emulated WAN path in network namespaces on this machine (needs root)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from dataclasses import asdict

from advisor.cli import UsageError
from advisor.limits import parse_number
from probes import sharedbed, testbed

SHARED_SERVER_PORT = 5201

_RATE = re.compile(r"^\s*([0-9.eE+-]+)\s*([kKMG]?)(?:bit|bps|bit/s|b/s)?\s*$")
_TIME = re.compile(r"^\s*([0-9.eE+-]+)\s*(s|ms|us)?\s*$")
_SIZE = re.compile(r"^\s*([0-9.eE+-]+)\s*(|k|K|M|p|pkt|pkts|packets|B)\s*$")
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}


def parse_rate(text: str) -> float:
    """`100M`, `100Mbit`, `1e8` → bits/s (decimal prefixes)."""
    match = _RATE.match(text)
    value = _number(match.group(1), _SCALE[match.group(2)]) if match else None
    if value is None or value <= 0:
        raise UsageError(f"--rate {text!r}: give bits/s, e.g. --rate 100M or --rate 1e8")
    return value


def parse_rtt(text: str) -> float:
    """`40ms`, `0.04`, `0.04s`, `40000us` → seconds."""
    match = _TIME.match(text)
    value = _number(match.group(1), {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}[match.group(2)]) if match else None
    if value is None or value < 0:
        raise UsageError(f"--rtt {text!r}: give a round-trip time such as --rtt 40ms or --rtt 0.04 (seconds)")
    return value


def parse_queue(text: str) -> int:
    """`150000`, `150k` (bytes) or `100p` (full-size packets of 1514 bytes) → bytes."""
    match = _SIZE.match(text)
    if match:
        unit = match.group(2)
        value = _number(match.group(1), testbed.FRAME_BYTES if unit in ("p", "pkt", "pkts", "packets")
                        else _SCALE.get(unit, 1.0))
    # At least one whole byte (0.1 was taken as a queue of 0 bytes), and few enough to be shown.
    if not match or value is None or not 1 <= round(value) <= 2**53:
        raise UsageError(f"--queue {text!r}: give bytes (e.g. --queue 500000 or --queue 500k) or packets (--queue 300p)")
    return int(round(value))


def parse_loss(text: str) -> float:
    """`0.001` (fraction) or `0.1%` → fraction 0–1."""
    percent = text.strip().endswith("%")
    value = _number(text.strip().rstrip("%"))
    if value is None:
        raise UsageError(f"--loss {text!r}: give a fraction such as 0.001 or a percentage such as 0.1%")
    value = value / 100 if percent else value
    if not 0.0 <= value < 1.0:
        raise UsageError(f"--loss {text!r}: the loss rate must be at least 0 and below 1 (100 %)")
    return value


def _number(text: str, scale: float = 1.0) -> float | None:
    """``text`` times ``scale``; None when it is not a number or not finite (1e300G overflows to inf)."""
    try:
        value = parse_number(text) * scale
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "testbed",
        help="build or remove an emulated WAN path in network namespaces (root)",
        description="Sender, cross-traffic sender, router and receiver namespaces joined by veth pairs; the router "
        "has a tbf bottleneck, random loss (nftables) and a propagation delay (NFQUEUE delay line).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="build a test bed")
    up.add_argument("--rate", default="100M", help="bottleneck rate in bits/s, e.g. 100M (default 100M)")
    up.add_argument("--rtt", default="40ms", help="round-trip propagation delay, e.g. 40ms or 0.04 (default 40ms)")
    up.add_argument("--queue", default=None,
                    help="bottleneck queue: bytes (500k) or packets (300p); default one bandwidth-delay product")
    up.add_argument("--loss", default="0", help="random loss towards the receiver: fraction (0.001) or percent (0.1%%)")
    up.add_argument("--cross-flows", default="0", help="long-running TCP cross-traffic flows (default 0)")
    up.add_argument("--cc", default="cubic", help="TCP congestion control for the bed (default cubic)")
    up.add_argument("--name", default="tb0", help="test bed id: 1-12 lowercase letters/digits (default tb0)")
    up.add_argument("--json", action="store_true", help="print the handle as JSON")
    up.add_argument("--shared", action="store_true",
                    help="two sources and two destinations (each with iperf3 -s on 5201) behind one bottleneck, "
                    "for tame schedule (--rate, --rtt, --queue and --name apply)")
    down = actions.add_parser("down", help="remove a test bed this tool built")
    down.add_argument("--name", default="tb0", help="test bed id (default tb0)")
    down.add_argument("--shared", action="store_true", help="a bed built with up --shared")
    status = actions.add_parser("status", help="list test beds and whether their parts are alive")
    status.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def spec_from_args(args: argparse.Namespace) -> testbed.TestbedSpec:
    """The TestbedSpec the `up` options describe; UsageError says which option to fix."""
    rate = parse_rate(args.rate)
    rtt = parse_rtt(args.rtt)
    queue = parse_queue(args.queue) if args.queue is not None else None
    try:
        cross = parse_number(args.cross_flows, int)
    except ValueError:
        raise UsageError(f"--cross-flows {args.cross_flows!r}: give a whole number of flows, e.g. 5") from None
    smallest = 10 * testbed.FRAME_BYTES
    try:
        spec = testbed.TestbedSpec(rate_bps=rate, rtt_s=rtt, queue_bytes=queue or smallest,
                                   loss_rate=parse_loss(args.loss), cross_flows=cross, congestion_control=args.cc,
                                   name=args.name)
        if queue is None:  # one bandwidth-delay product, once the spec has the rate and RTT in range
            spec = dataclasses.replace(spec, queue_bytes=max(smallest, int(spec.bdp_bytes)))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return spec


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "up":
            return _up_shared(args) if args.shared else _up(args)
        if args.action == "down":
            (sharedbed.down if args.shared else testbed.down)(args.name)
            print(f"test bed {args.name} removed")
            return 0
        return _status(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    except testbed.TestbedError as exc:
        print(f"tame testbed {args.action}: {exc}", file=sys.stderr)
        return 1


def _up(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    tb = testbed.up(spec)
    if args.json:
        payload = {k: v for k, v in asdict(tb).items() if k != "spec"}
        print(json.dumps({"name": tb.name, "spec": asdict(spec), **payload}, indent=2))
        return 0
    print(f"test bed {tb.name} up: {spec.rate_bps / 1e6:g} Mbit/s, RTT {spec.rtt_s * 1e3:g} ms, "
          f"queue {spec.queue_bytes} bytes, loss {spec.loss_rate:g}, {spec.cross_flows} cross flows, {spec.congestion_control}")
    print(f"  sender   {tb.sender_ns:<14} {tb.sender_addr}")
    print(f"  receiver {tb.receiver_ns:<14} {tb.receiver_addr}")
    print(f"  router   {tb.router_ns}")
    print(f"  cross    {tb.cross_sender_ns:<14} -> {tb.cross_receiver_addr}")
    print(f"  e.g. ip netns exec {tb.receiver_ns} iperf3 -s -B {tb.receiver_addr}")
    print(f"       ip netns exec {tb.sender_ns} iperf3 -c {tb.receiver_addr} -C {spec.congestion_control}")
    if tb.default_congestion_control != spec.congestion_control:
        print(f"  note: sockets that do not choose get {tb.default_congestion_control} here (this host only allows "
              f"some algorithms as namespace defaults); pass -C {spec.congestion_control} to iperf3")
    print(f"  remove with: tame testbed down --name {tb.name}")
    return 0


def _up_shared(args: argparse.Namespace) -> int:
    if parse_loss(args.loss) or args.cross_flows != "0" or args.cc != "cubic":
        raise UsageError("--shared takes --rate, --rtt, --queue and --name only (no loss, cross flows or --cc)")
    tb = spec_from_args(args)
    spec = sharedbed.SharedSpec(rate_bps=tb.rate_bps, queue_bytes=tb.queue_bytes, rtt_s=tb.rtt_s, name=tb.name)
    bed = sharedbed.up(spec)
    try:
        for dest in sharedbed.DESTINATIONS:
            sharedbed.start_server(bed, dest, SHARED_SERVER_PORT)
    except BaseException:
        sharedbed.down(spec.name)
        raise
    if args.json:
        print(json.dumps({"name": bed.name, "spec": asdict(spec), "sources": bed.source_ns, "destinations": {
            d: {"ns": bed.dest_ns[d], "addr": f"{bed.dest_addr[d]}:{SHARED_SERVER_PORT}"} for d in bed.dest_ns}},
            indent=2))
        return 0
    print(f"shared test bed {bed.name} up: {spec.rate_bps / 1e6:g} Mbit/s, RTT {spec.rtt_s * 1e3:g} ms, "
          f"queue {spec.queue_bytes} bytes, shared by every source -> destination link")
    for src, ns in bed.source_ns.items():
        print(f"  source      {ns:<16} {bed.source_addr[src]}   (tame schedule --netns SITE={ns})")
    for dest, ns in bed.dest_ns.items():
        print(f"  destination {ns:<16} {bed.dest_addr[dest]}:{SHARED_SERVER_PORT} (iperf3 -s running)")
    print(f"  remove with: tame testbed down --shared --name {bed.name}")
    return 0


def _status(args: argparse.Namespace) -> int:
    beds = testbed.status()
    if args.json:
        print(json.dumps([{**asdict(b), "spec": asdict(b.spec) if b.spec else None} for b in beds], indent=2))
        return 0
    if not beds:
        print("no test beds")
    for bed in beds:
        if not bed.owned:
            print(f"{bed.name}: namespace with our prefix but no record of creating it (not ours; left alone)")
            continue
        alive_ns = sum(bed.namespaces.values())
        alive_proc = sum(bed.processes.values())
        spec = bed.spec
        state = "up" if bed.complete and alive_ns == len(bed.namespaces) and alive_proc == len(bed.processes) else "BROKEN"
        print(f"{bed.name}: {state}, {spec.rate_bps / 1e6:g} Mbit/s, RTT {spec.rtt_s * 1e3:g} ms, "
              f"queue {spec.queue_bytes} B, loss {spec.loss_rate:g}, {spec.cross_flows} cross flows; "
              f"namespaces {alive_ns}/{len(bed.namespaces)}, processes {alive_proc}/{len(bed.processes)} alive")
    return 0
