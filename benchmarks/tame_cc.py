"""The tame congestion control on a real kernel: what share of a standard stream a tame stream takes.

    sudo .venv/bin/python -m benchmarks.tame_cc share       # FM -> share, RTT 10-100 ms (about 20 min)
    sudo .venv/bin/python -m benchmarks.tame_cc hacker      # Hacker et al. 2004 Table III on the test bed (5 min)
    sudo .venv/bin/python -m benchmarks.tame_cc aggregate   # N streams scaled to n* against n* standard (10 min)
    sudo .venv/bin/python -m benchmarks.tame_cc cycles      # 100 load/unload cycles, a transfer across an unload

Every run is on a namespace test bed (probes/testbed.py): a drop-tail bottleneck (tbf with a byte limit of
one bandwidth-delay product), the NFQUEUE delay line, and ``--cross`` long-running cubic flows (Linux's
default) from their own namespace. Our streams run from the sender namespace to iperf3 servers in the
receiver namespace, one server per group of streams that share a congestion control, so a run can mix
``-C cubic`` standard streams with ``-C tame`` ones.

A stream's *share* is its goodput over the mean goodput of the standard (cubic) streams on the path in the
same window, ours and the cross flows together: (tame bits/s / tame streams) / ((standard + cross) bits/s /
(standard streams + cross flows)). The advisor assumes share = FM^-1/2 (shared-loss AIMD, Fu & Indulska
eq. 1); ``share`` fits share = FM^-k to what the kernel does and prints k.

Each subcommand writes its table, with the command on top, to benchmarks/results/tame-cc-<name>.md and its
raw runs to the .json beside it. Needs root; loads the tame control if it is not registered and unloads what
it loaded; removes its test beds on exit, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Iterator, Sequence

import numpy as np

from benchmarks.testbed_accuracy import CLIENT_SETUP_S, CROSS_WARMUP_S, cross_bytes_acked, cross_rate
from probes import cc, cc_map, pathcheck, testbed
from probes.iperf_parse import parse_iperf_json
from probes.plan import ProbePlan

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BASE_PORT = 5201
STANDARD = "cubic"
"""The standard streams' control: the cross flows' and Linux's default."""
CLIENT_SLACK_S = 30.0


class Terminated(Exception):
    """SIGTERM arrived; unwinds like Ctrl-C so every finally block tears down."""


def _on_sigterm(signum, frame):
    raise Terminated()


@dataclass(frozen=True)
class Group:
    """Streams of ours that share one congestion control (one iperf3 client and server)."""

    streams: int
    congestion_control: str


@dataclass
class Run:
    """One measured window: each group's goodput (bits/s) and the cross flows'."""

    rtt_s: float
    rate_bps: float
    cross_flows: int
    groups: list[dict]
    setting: dict | None
    seconds: float
    group_bps: list[float] = field(default_factory=list)
    group_retransmits: list[int | None] = field(default_factory=list)
    cross_bps: float = 0.0
    label: str = ""
    service_rtt_s: float | None = None  # the idle RTT the service measured on the path, when the FM came from it

    def standard_rate(self) -> float:
        """Mean goodput of one standard stream on the path (ours not under tame, and the cross flows), bits/s."""
        streams = self.cross_flows + sum(g["streams"] for g in self.groups if g["congestion_control"] != cc.NAME)
        total = self.cross_bps + sum(bps for g, bps in zip(self.groups, self.group_bps)
                                     if g["congestion_control"] != cc.NAME)
        return total / streams if streams else math.nan

    def tame_bps(self) -> float:
        return sum(bps for g, bps in zip(self.groups, self.group_bps) if g["congestion_control"] == cc.NAME)

    def tame_streams(self) -> int:
        return sum(g["streams"] for g in self.groups if g["congestion_control"] == cc.NAME)

    def share(self) -> float:
        """One tame stream's goodput over one standard stream's (fraction)."""
        return self.tame_bps() / self.tame_streams() / self.standard_rate()

    def ours_bps(self) -> float:
        return sum(self.group_bps)


def path_spec(rate_bps: float, rtt_s: float, cross_flows: int, name: str,
              standard: str = STANDARD) -> testbed.TestbedSpec:
    """A drop-tail path with one bandwidth-delay product of queue (at least 20 full frames); the cross
    flows run ``standard``."""
    queue = max(int(rate_bps * rtt_s / 8), 20 * testbed.FRAME_BYTES)
    return testbed.TestbedSpec(rate_bps=rate_bps, rtt_s=rtt_s, queue_bytes=queue, cross_flows=cross_flows,
                               congestion_control=standard, name=name)


@contextmanager
def bed(spec: testbed.TestbedSpec, servers: int) -> Iterator[testbed.Testbed]:
    """The test bed up with ``servers`` iperf3 servers on BASE_PORT.., its cross flows warmed up; down after."""
    state_dir = Path(tempfile.mkdtemp(prefix="tame-cc-bench-"))
    tb = testbed.up(spec, state_dir=state_dir)
    try:
        with ExitStack() as stack:
            for i in range(servers):
                stack.enter_context(pathcheck.iperf3_server(tb, BASE_PORT + i))
            time.sleep(CROSS_WARMUP_S)
            yield tb
    finally:
        testbed.down(spec.name, state_dir=state_dir)


def _client(tb: testbed.Testbed, port: int, group: Group, seconds: float, omit_s: float) -> subprocess.Popen:
    argv = tb.exec_in(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-p", str(port), "-J",
                                     "-P", str(group.streams), "-t", f"{seconds:g}", "-O", f"{omit_s:g}",
                                     "-C", group.congestion_control])
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def measure(tb: testbed.Testbed, groups: Sequence[Group], seconds: float, omit_s: float,
            setting: cc_map.CcSetting | None, label: str = "") -> Run:
    """Run every group at once for ``omit_s`` + ``seconds``; goodput over the last ``seconds``.

    ``setting`` is written for the receiver's address, for the sender namespace's sockets, first (the tame groups
    read it), or the entry removed.
    """
    addr = cc.canonical_address(tb.receiver_addr)
    sender = cc_map.netns_cookie(tb.sender_ns)
    if setting is None:
        if cc.registration() is not None:
            cc_map.delete_fm(addr, sender)
    else:
        cc_map.set_fm(addr, setting, sender)
    spec = tb.spec
    run = Run(rtt_s=spec.rtt_s, rate_bps=spec.rate_bps, cross_flows=spec.cross_flows,
              groups=[asdict(g) for g in groups], setting=None if setting is None else asdict(setting),
              seconds=seconds, label=label)
    start = time.monotonic()
    procs = [_client(tb, BASE_PORT + i, g, seconds, omit_s) for i, g in enumerate(groups)]
    try:
        if spec.cross_flows:
            time.sleep(max(0.0, start + CLIENT_SETUP_S + omit_s - time.monotonic()))
            first = cross_bytes_acked(tb)
            time.sleep(max(0.0, first[0] + seconds - 1.0 - time.monotonic()))
            run.cross_bps = cross_rate(first, cross_bytes_acked(tb))
        for proc, group in zip(procs, groups):
            out, err = proc.communicate(timeout=seconds + omit_s + CLIENT_SLACK_S)
            if not out.strip():
                raise RuntimeError(f"iperf3 -C {group.congestion_control} -P {group.streams} failed: {err.strip()[-300:]}")
            result = parse_iperf_json(out, f"{tb.receiver_addr}")
            run.group_bps.append(result.throughput_bps)
            run.group_retransmits.append(result.retransmits)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return run


def fit_share(fms: Sequence[float], shares: Sequence[float], groups: Sequence[object]) -> tuple[float, dict]:
    """share = s1[group] x FM^-k: one exponent k for every run, one base share s1 per group (e.g. per RTT),
    least squares on log share. Returns (k, {group: s1})."""
    keys = sorted(set(groups))
    x = np.log(np.asarray(fms, dtype=float))
    design = np.column_stack([-x] + [np.array([g == key for g in groups], dtype=float) for key in keys])
    coef, *_ = np.linalg.lstsq(design, np.log(np.asarray(shares, dtype=float)), rcond=None)
    return float(coef[0]), {key: float(np.exp(c)) for key, c in zip(keys, coef[1:])}


@contextmanager
def tame_loaded() -> Iterator[None]:
    """The control registered for the block; unloaded after only if this registered it."""
    _, new = cc.load()
    try:
        yield
    finally:
        if new:
            cc.unload()


# --- share: FM -> share ------------------------------------------------------------------------


def share_runs(args) -> list[Run]:
    runs = []
    variants = {"reno": [False], "scaled": [True], "both": [False, True]}[args.slow_start]
    for rtt_ms in args.rtts:
        spec = path_spec(args.rate, rtt_ms / 1000, args.cross, "tccshare", args.standard)
        with bed(spec, servers=2) as tb:
            for repeat in range(args.repeats):
                for scaled in variants:
                    for fm in args.fms:
                        setting = cc_map.CcSetting(fm, scale_slow_start=scaled)
                        r = measure(tb, [Group(1, args.standard), Group(args.tame_streams, cc.NAME)],
                                    args.seconds, args.omit, setting, label=f"repeat {repeat + 1}")
                        runs.append(r)
                        print(f"RTT {rtt_ms:g} ms FM {fm:g}{' ss-scaled' if scaled else ''}: tame "
                              f"{r.tame_bps() / r.tame_streams() / 1e6:.2f} Mbit/s a stream, standard "
                              f"{r.standard_rate() / 1e6:.2f}, share {r.share():.3f} (FM^-1/2 {fm ** -0.5:.3f})",
                              file=sys.stderr, flush=True)
    return runs


def share_report(runs: list[Run], command: str) -> list[str]:
    standard = runs[0].groups[0]["congestion_control"]
    first = runs[0]
    lines = [f"# tame stream share against FM (`{command}`)", "",
             f"{first.rate_bps / 1e6:g} Mbit/s, one-BDP drop-tail queue, {first.cross_flows} {standard} cross flows; "
             f"ours: 1 {standard} stream + {first.tame_streams()} tame streams at FM, {first.seconds:g} s measured "
             f"after the warm-up. share = (tame goodput / tame streams) / (mean goodput of one {standard} stream on "
             "the path, ours and the cross flows). Median over repeats (range when more than one).", ""]
    rtts = sorted({r.rtt_s for r in runs})
    variants = sorted({bool(r.setting["scale_slow_start"]) for r in runs})
    fms = sorted({r.setting["fractional_multiplier"] for r in runs})
    head = "| FM | FM^-1/2 | 1/FM | " + " | ".join(
        f"RTT {rtt * 1000:g} ms{' (slow start scaled)' if v else ''}" for v in variants for rtt in rtts) + " |"
    lines += [head, "|" + "---|" * (3 + len(rtts) * len(variants))]
    cells: dict[tuple, list[float]] = {}
    for r in runs:
        cells.setdefault((r.setting["fractional_multiplier"], bool(r.setting["scale_slow_start"]), r.rtt_s), []).append(r.share())
    for fm in fms:
        row = [f"{fm:g}", f"{fm ** -0.5:.3f}", f"{1 / fm:.3f}"]
        for v in variants:
            for rtt in rtts:
                got = cells.get((fm, v, rtt))
                row.append("" if not got else f"{median(got):.3f}" + (f" ({min(got):.2f}-{max(got):.2f})" if len(got) > 1 else ""))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"Fitted share = s1(RTT) x FM^-k (least squares on logs, FM {SHARE_FIT_FMS[0]:g}-{SHARE_FIT_FMS[1]:g}; "
              "s1 is a tame stream at FM 1, i.e. Reno, against one standard stream):", ""]
    for v in variants:
        sel = [r for r in runs if bool(r.setting["scale_slow_start"]) == v
               and SHARE_FIT_FMS[0] <= r.setting["fractional_multiplier"] <= SHARE_FIT_FMS[1]]
        if not sel:
            continue
        k, base = fit_share([r.setting["fractional_multiplier"] for r in sel], [r.share() for r in sel],
                            [r.rtt_s for r in sel])
        each = ", ".join(f"s1({rtt * 1000:g} ms) = {s1:.3f}" for rtt, s1 in base.items())
        lines.append(f"- {'slow start scaled' if v else 'Reno slow start'}: k = {k:.3f}; {each} ({len(sel)} runs)")
    return lines


# --- hacker: Table III --------------------------------------------------------------------------

SHARE_FIT_FMS = (1.0, 30.0)
"""FM range the share law is fitted over: above ~30 a tame stream's window sits at its floor of 2 segments
on these paths, so its share stops falling with FM (see the table's FM 100 row)."""

HACKER_TABLE_III = {  # Hacker et al. 2004, Table III: Mbit/s against 5 cross TCP streams, FM 10
    "Baseline 1": 15.65, "Combined 5": 20.27, "Combined 9": 29.84, "Parallel 5": 45.96, "Parallel 9": 61.33}
HACKER_FM = 10.0


def hacker_methods() -> dict[str, list[Group]]:
    return {"Baseline 1": [Group(1, STANDARD)],
            "Combined 5": [Group(1, STANDARD), Group(4, cc.NAME)],
            "Combined 9": [Group(1, STANDARD), Group(8, cc.NAME)],
            "Parallel 5": [Group(5, STANDARD)],
            "Parallel 9": [Group(9, STANDARD)]}


def hacker_runs(args) -> list[Run]:
    runs = []
    spec = path_spec(args.rate, args.rtts[0] / 1000, 5, "tcchacker")
    with bed(spec, servers=2) as tb:
        idle = measure(tb, [], args.seconds, args.omit, None, label="no transfer")
        runs.append(idle)
        print(f"no transfer: cross {idle.cross_bps / 1e6:.2f} Mbit/s", file=sys.stderr, flush=True)
        for repeat in range(args.repeats):
            for name, groups in hacker_methods().items():
                r = measure(tb, groups, args.seconds, args.omit, cc_map.CcSetting(HACKER_FM), label=name)
                runs.append(r)
                print(f"{name}: ours {r.ours_bps() / 1e6:.2f} Mbit/s, cross {r.cross_bps / 1e6:.2f}",
                      file=sys.stderr, flush=True)
    return runs


def hacker_report(runs: list[Run], command: str) -> list[str]:
    idle = median([r.cross_bps for r in runs if r.label == "no transfer"])
    spec = runs[0]
    lines = [f"# Hacker et al. 2004 Table III on the test bed (`{command}`)", "",
             f"{spec.rate_bps / 1e6:g} Mbit/s, RTT {spec.rtt_s * 1000:g} ms, one-BDP drop-tail queue, 5 cubic cross "
             f"flows ({idle / 1e6:.2f} Mbit/s with no transfer); Combined N = 1 cubic + N-1 tame streams at FM "
             f"{HACKER_FM:g}; Parallel N = N cubic streams. Medians over repeats. Hacker's path: ~43 ms, 100 Mbit/s, "
             "5 cross flows, FM 10.", "",
             "| method | Hacker Mbit/s | Hacker / baseline | ours Mbit/s | ours / baseline | cross taken (ours) |",
             "|---|---|---|---|---|---|"]
    ours = {name: median([r.ours_bps() for r in runs if r.label == name]) for name in HACKER_TABLE_III
            if any(r.label == name for r in runs)}
    cross = {name: median([r.cross_bps for r in runs if r.label == name]) for name in ours}
    base_h, base_o = HACKER_TABLE_III["Baseline 1"], ours.get("Baseline 1")
    for name, h in HACKER_TABLE_III.items():
        if name not in ours:
            continue
        lines.append(f"| {name} | {h:.2f} | {h / base_h:.2f} | {ours[name] / 1e6:.2f} | {ours[name] / base_o:.2f} | "
                     f"{1 - cross[name] / idle:.3f} |")
    return lines


# --- aggregate: N streams scaled to n* ----------------------------------------------------------


def aggregate_runs(args) -> list[Run]:
    from advisor.commands.cc import setting_for  # the FM `tame cc apply --streams N` writes

    runs = []
    spec = path_spec(args.rate, args.rtts[0] / 1000, args.cross, "tccaggr")
    n_star = args.n_star
    if n_star != int(n_star):
        raise SystemExit("--n-star must be whole here: the reference is n* standard streams, measured")
    with bed(spec, servers=1) as tb:
        rtt_s = service_rtt_s(tb)  # what the advice would carry, and `tame cc apply --rtt` take
        print(f"RTT as the service measures it: {rtt_s * 1000:.1f} ms", file=sys.stderr, flush=True)
        settings = [None, *args.streams]  # None: the reference, n* standard streams
        for repeat in range(args.repeats):
            # Each repeat starts one setting later, so no setting always follows the same one or runs first.
            shift = repeat % len(settings)
            for n in settings[shift:] + settings[:shift]:
                if n is None:
                    ref = measure(tb, [Group(int(n_star), STANDARD)], args.seconds, args.omit, None, label="reference")
                    runs.append(ref)
                    print(f"{int(n_star)} cubic: {ref.ours_bps() / 1e6:.2f} Mbit/s", file=sys.stderr, flush=True)
                    continue
                fm = setting_for(n_star, n, rtt_s, STANDARD).fractional_multiplier
                if fm is None:  # N standard streams are n*'s share: tame is not opened
                    setting, group = None, Group(n, STANDARD)
                else:
                    setting = cc_map.CcSetting(fm, scale_slow_start=cc_map.SCALE_SLOW_START_BY_DEFAULT)
                    group = Group(n, cc.NAME)
                r = measure(tb, [group], args.seconds, args.omit, setting, label=f"N={n}")
                r.service_rtt_s = rtt_s
                runs.append(r)
                what = f"{STANDARD}" if fm is None else f"tame at FM {fm:g}"
                print(f"{n} {what}: {r.ours_bps() / 1e6:.2f} Mbit/s", file=sys.stderr, flush=True)
    return runs


def aggregate_report(runs: list[Run], command: str, n_star: float,
                     measured_by: dict[str, str] | None = None) -> list[str]:
    """The aggregate form's table for each path (bed RTT) in ``runs``, each against its own reference, and one fit
    over them all. ``measured_by``: bed RTT in ms (``f"{ms:g}"``) -> the command that measured it, for runs merged
    from several files (``--merge``)."""
    paths = sorted({r.rtt_s for r in runs})
    refs = {rtt: median([r.ours_bps() for r in runs if r.rtt_s == rtt and r.label == "reference"]) for rtt in paths}
    lines = [f"# Aggregate form: N tame streams scaled to n* = {n_star:g} (`{command}`)"]
    for rtt in paths:
        if len(paths) > 1:
            by = (measured_by or {}).get(f"{rtt * 1000:g}")
            lines += ["", f"## RTT {rtt * 1000:g} ms" + (f" (measured by `{by}`)" if by else "")]
        lines += aggregate_path_table([r for r in runs if r.rtt_s == rtt], refs[rtt], n_star)
    from advisor.tame import WINDOW_FLOOR_REACH, most_aggregate_streams

    def floored(r: Run) -> bool:
        """Whether N windows of 2 segments already send most of n*'s share, so that the floor and not the FM sets
        what they take (`tame transfer` warns so): such runs say nothing of the FM -> share law."""
        most = most_aggregate_streams(r.service_rtt_s, refs[r.rtt_s])
        return most is not None and aggregate_streams(r) > most

    tame, floored_runs = [], []
    for r in runs:
        if r.label != "reference" and r.setting:
            (floored_runs if floored(r) else tame).append(r)
    left_out = sorted({f"{r.label} at {r.service_rtt_s * 1000:.1f} ms" for r in floored_runs})
    if len({r.setting["fractional_multiplier"] for r in tame}) >= 2:
        # One tame stream of N against one of its path's reference's n*: the law the aggregate form is set by.
        shares = [r.ours_bps() / aggregate_streams(r) / (refs[r.rtt_s] / n_star) for r in tame]
        fms = [r.setting["fractional_multiplier"] for r in tame]
        k, base = fit_share(fms, shares, [round(r.service_rtt_s, 4) for r in tame])
        each = ", ".join(f"s1({rtt * 1000:.1f} ms) = {s1:.3f}" for rtt, s1 in base.items())
        lines += ["", "Fitted per-stream share of the N tame streams = s1(RTT) x FM^-k (least squares on logs, "
                  f"FM {min(fms):g}-{max(fms):g}; share = (Mbit/s / N) / (reference Mbit/s / n*), RTT as the service "
                  "measured it):", "", f"- aggregate: k = {k:.3f}; {each} ({len(tame)} runs)"]
        if left_out:
            lines += [f"- left out: {', '.join(left_out)}, whose N windows of 2 segments a round trip send "
                      f"at least {WINDOW_FLOOR_REACH:g} of the reference (models.tame_share.window_floor_bps at the "
                      "RTT the service measured)"]
    return lines


def aggregate_streams(run: Run) -> int:
    """N, the streams an aggregate run opened (its label is "N=16")."""
    return int(run.label.removeprefix("N="))


def aggregate_path_table(runs: list[Run], ref: float, n_star: float) -> list[str]:
    """One path's paragraph and table: each N's goodput against ``ref`` (bits/s, the path's n* standard streams)."""
    refs = [r for r in runs if r.label == "reference"]
    spec = runs[0]
    lines = ["",
             f"{spec.rate_bps / 1e6:g} Mbit/s, RTT {spec.rtt_s * 1000:g} ms, one-BDP drop-tail queue, "
             f"{spec.cross_flows} cubic cross flows. Reference: {n_star:g} cubic streams, "
             f"{ref / 1e6:.2f} Mbit/s (median of {len(refs)}). Each of N tame streams at the FM `tame cc apply "
             f"--tcp-equivalent {n_star:g} --streams N --rtt R --standard-control cubic` sets, R the RTT the service "
             f"measured ({', '.join(sorted({f'{r.service_rtt_s * 1000:.1f} ms' for r in runs if r.service_rtt_s}))}); "
             "FM none: it sets no tame stream, N standard streams being n*'s share. Each repeat runs the reference and "
             "every N in turn, starting one setting later than the repeat before. Goal: within ±10 %; the range over "
             "repeats in brackets.", "",
             "| N | FM | Mbit/s (median) | / reference | within ±10 % |", "|---|---|---|---|---|"]
    for n in sorted({aggregate_streams(r) for r in runs if r.label != "reference"}):
        sel = [r for r in runs if r.label == f"N={n}"]
        got = median([r.ours_bps() for r in sel])
        ratio = got / ref
        spread = f" [{min(r.ours_bps() for r in sel) / ref:.2f}-{max(r.ours_bps() for r in sel) / ref:.2f}]" \
            if len(sel) > 1 else ""
        opened = f"{sel[0].setting['fractional_multiplier']:g}" if sel[0].setting else f"none ({STANDARD})"
        lines.append(f"| {n} | {opened} | {got / 1e6:.2f} | {ratio:.3f}{spread} | "
                     f"{'yes' if abs(ratio - 1) <= 0.10 else 'no'} |")
    return lines


# --- plan: following the advice as opened keeps the budget -------------------------------------

PLAN_PATHS = (  # (key, rate bits/s, RTT s, cubic cross flows): drop-tail, one-BDP queue
    ("50M-40ms-5x", 50e6, 0.040, 5),
    ("30M-60ms-3x", 30e6, 0.060, 3),
    ("100M-20ms-8x", 100e6, 0.020, 8),
)
PLAN_BUDGETS = (0.05, 0.1, 0.15, 0.2, 0.3)
PLAN_TOLERANCE = 0.05


def opened_groups(advice, rtt_s: float | None) -> tuple[int, tuple[Group, ...], float | None]:
    """What `tame transfer` opens for ``advice`` (advisor.commands.transfer.plan_opening, the fractional form):
    its standard streams, its groups of streams, and the tame stream's FM (None without one)."""
    from advisor.cli import UsageError
    from advisor.commands.transfer import plan_opening
    from advisor.destinations import parse_destination

    dest = parse_destination("10.0.0.1:5201")  # the ports only tell the two clients apart here
    try:
        opened = plan_opening(advice, dest, rtt_s, STANDARD, None, dest.port + 1, None)
    except UsageError:  # the advice opens nothing: even the smallest tame stream breaks the budget
        return 0, (), None
    return (opened.standard_streams, tuple(Group(c.streams, c.congestion_control) for c in opened.clients),
            opened.fractional_multiplier)


def plan_runs(args) -> tuple[list[Run], list[dict]]:
    """Per path: probe with cubic (the service's plan), advise at each budget, open the advice as `tame
    transfer` does (floor(n*) cubic + one tame stream at its FM, or the tame stream alone below one), and
    measure the cross traffic's loss against no transfer; floor(n*) and ceil(n*) whole cubic streams beside it."""
    from advisor.tame import (DEFAULT_FRACTIONAL_MARGIN, DEFAULT_MARGIN, DEFAULT_MODEL, DEFAULT_N_MAX, NO_MARGIN,
                              point_from_probe, tame_parallel_tcp)
    from benchmarks.testbed_accuracy import probe_plan
    from models.registry import model_probes

    runs, cases = [], []
    wanted = set(args.paths.split(",")) if args.paths else {p[0] for p in PLAN_PATHS}
    for key, rate, rtt_s, cross in PLAN_PATHS:
        if key not in wanted:
            continue
        spec = path_spec(rate, rtt_s, cross, "tccplan")
        with bed(spec, servers=2) as tb:
            plan = probe_plan(tb, args, [DEFAULT_MODEL])
            points = model_probes(DEFAULT_MODEL, {p.streams: point_from_probe(p) for p in plan.probes}, DEFAULT_N_MAX)
            idle = [measure(tb, [], args.seconds, args.omit, None, label=f"{key} idle")]
            runs += idle
            measured: dict[tuple, Run] = {}

            def once(groups: tuple[Group, ...], setting: cc_map.CcSetting | None, label: str) -> Run:
                k = (groups, None if setting is None else setting.fractional_multiplier)
                if k not in measured:
                    measured[k] = measure(tb, list(groups), args.seconds, args.omit, setting, label=f"{key} {label}")
                    runs.append(measured[k])
                return measured[k]

            for budget in args.budgets:
                margins = (NO_MARGIN, NO_MARGIN) if args.no_margin else (DEFAULT_MARGIN, DEFAULT_FRACTIONAL_MARGIN)
                advice = tame_parallel_tcp(points, budget, DEFAULT_N_MAX, DEFAULT_MODEL, plan.idle_rtt_s, *margins,
                                           standard_control=STANDARD)
                standard, groups, fm = opened_groups(advice, plan.idle_rtt_s)
                setting = cc_map.CcSetting(fm, scale_slow_start=cc_map.SCALE_SLOW_START_BY_DEFAULT) if fm else None
                opened = once(groups, setting, f"advice {budget:g}")
                n_star = advice.tcp_equivalent_streams
                whole = {}
                for name, n in (("floor", math.floor(n_star)), ("ceil", math.ceil(n_star))):
                    whole[name] = once((Group(n, STANDARD),), None, f"{n} cubic") if n >= 1 else None
                cases.append({"path": key, "budget": budget, "n_star": n_star, "standard_streams": standard,
                              "fractional_multiplier": fm, "predicted_impact": advice.cross_traffic_impact,
                              "opened_label": opened.label,
                              "floor_label": whole["floor"].label if whole["floor"] else None,
                              "ceil_label": whole["ceil"].label if whole["ceil"] else None})
                print(f"{key} budget {budget:g}: n* {n_star:.2f} -> {standard} cubic + "
                      f"{'tame FM %.3g' % fm if fm else 'no tame'}: cross {opened.cross_bps / 1e6:.2f} Mbit/s "
                      f"(idle {idle[0].cross_bps / 1e6:.2f})", file=sys.stderr, flush=True)
            runs.append(measure(tb, [], args.seconds, args.omit, None, label=f"{key} idle"))
    return runs, cases


def plan_report(runs: list[Run], cases: list[dict], command: str) -> list[str]:
    by_label = {}
    for r in runs:
        by_label.setdefault(r.label, []).append(r)

    def impact(label: str | None, path: str) -> float | None:
        if label is None:
            return None
        idle = median([r.cross_bps for r in by_label[f"{path} idle"]])
        return 1 - by_label[label][0].cross_bps / idle

    def cell(value: float | None, budget: float) -> str:
        if value is None:
            return ""
        miss = value - budget  # > 0: over the budget; < 0: budget left unused
        return f"{value:.3f}" + (" (misses by > 0.1)" if abs(miss) > 2 * PLAN_TOLERANCE else "")

    lines = [f"# Following the advice as opened: the cross traffic's loss against the budget (`{command}`)", "",
             "Per path: the service's probe plan under cubic, the advice at each budget opened as `tame transfer` "
             "opens it (floor(n*) cubic streams + one tame stream at FM, or the tame stream alone), and the "
             "cross flows' measured loss of goodput against no transfer (median of an idle window before and "
             f"after). *Within* means |loss - budget| <= {PLAN_TOLERANCE:g}; *kept* means loss <= budget + "
             f"{PLAN_TOLERANCE:g} (the budget not broken, whatever was left unused). Whole cubic streams beside "
             "it: floor(n*) and ceil(n*), marked where they miss the budget by more than 0.1.", "",
             "| path | budget | n* | opened | loss (opened) | within ±0.05 | kept | floor(n*) cubic: loss | "
             "ceil(n*) cubic: loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    within = kept = 0
    for c in cases:
        got = impact(c["opened_label"], c["path"])
        is_within = abs(got - c["budget"]) <= PLAN_TOLERANCE
        is_kept = got <= c["budget"] + PLAN_TOLERANCE
        within += is_within
        kept += is_kept
        opened = f"{c['standard_streams']} + tame FM {c['fractional_multiplier']:.3g}" if c["fractional_multiplier"] \
            else f"{c['standard_streams']} cubic"
        floor, ceil = impact(c["floor_label"], c["path"]), impact(c["ceil_label"], c["path"])
        lines.append(f"| {c['path']} | {c['budget']:g} | {c['n_star']:.2f} | {opened} | {got:.3f} | "
                     f"{'yes' if is_within else 'no'} | {'yes' if is_kept else 'no'} | {cell(floor, c['budget'])} | "
                     f"{cell(ceil, c['budget'])} |")
    lines += ["", f"Within ±{PLAN_TOLERANCE:g}: {within} of {len(cases)} cases; budget kept (loss <= budget + "
              f"{PLAN_TOLERANCE:g}): {kept} of {len(cases)}."]
    return lines


# --- cycles: load/unload ------------------------------------------------------------------------


def _bpftool_count(kind: str) -> int:
    out = subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True, check=True, timeout=20).stdout
    return len(json.loads(out or "[]"))


def _dmesg_lines() -> list[str]:
    return subprocess.run(["dmesg"], capture_output=True, text=True, check=True, timeout=20).stdout.splitlines()


def cycles(args) -> list[str]:
    if cc.registration() is not None:
        raise SystemExit("tame is registered already (not by this benchmark): unload it first")
    before = (_bpftool_count("prog"), _bpftool_count("map"))
    dmesg_before = len(_dmesg_lines())
    started = time.monotonic()
    for i in range(args.cycles):
        cc.load()
        cc.unload()
    cycle_s = (time.monotonic() - started) / max(args.cycles, 1)
    deadline = time.monotonic() + 10
    while (after := (_bpftool_count("prog"), _bpftool_count("map"))) != before and time.monotonic() < deadline:
        time.sleep(0.2)
    # A transfer under tame while the control is unregistered under it.
    spec = path_spec(args.rate, args.rtts[0] / 1000, 0, "tcccycle")
    with bed(spec, servers=1) as tb:
        cc.load()
        cc_map.set_fm(cc.canonical_address(tb.receiver_addr), cc_map.CcSetting(4.0), cc_map.netns_cookie(tb.sender_ns))
        seconds = 10
        proc = _client(tb, BASE_PORT, Group(1, cc.NAME), seconds, 0)
        time.sleep(CLIENT_SETUP_S + seconds / 2)
        cc.unload()
        out, err = proc.communicate(timeout=seconds + CLIENT_SLACK_S)
    report = json.loads(out)
    intervals = report.get("intervals", [])
    after_unload = [i["sum"]["bits_per_second"] for i in intervals if i["sum"]["start"] >= seconds / 2 + 1]
    while (after2 := (_bpftool_count("prog"), _bpftool_count("map"))) != before and time.monotonic() < deadline + 10:
        time.sleep(0.2)
    new_dmesg = _dmesg_lines()[dmesg_before:]
    return [f"# tame load/unload cycles (`{args.command}`)", "",
            f"- cycles: {args.cycles}, {cycle_s:.2f} s each (load + unload)",
            f"- bpftool prog/map counts: before {before}, after the cycles {after}, after the transfer {after2}",
            f"- dmesg lines added: {len(new_dmesg)}" + ("".join(f"\n  - `{l}`" for l in new_dmesg[:20])),
            f"- a tame transfer running across the unload: {'error: ' + report['error'] if 'error' in report else 'completed'}; "
            f"{len(after_unload)} one-second intervals after the unload, min {min(after_unload, default=0) / 1e6:.2f} "
            f"Mbit/s, mean {np.mean(after_unload) / 1e6 if after_unload else 0:.2f} Mbit/s; "
            f"sender's control as iperf3 reports it: {report.get('end', {}).get('sender_tcp_congestion')}"]


# --- rtt: the RTT the service measures on the share paths -------------------------------------


def service_rtt_s(tb: testbed.Testbed) -> float:
    """The idle RTT `tame probe` measures to the bed's receiver now (probes.iperf.IperfDriver.idle_rtt), seconds."""
    code = ("import sys; from probes.iperf import IperfDriver; "
            "print(IperfDriver().idle_rtt(sys.argv[1] + ':%d', 30))" % BASE_PORT)
    out = subprocess.run(tb.exec_in(tb.sender_ns, [sys.executable, "-c", code, tb.receiver_addr]),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return float(out.split()[-1])


def probe_rtts(args) -> list[str]:
    """The idle RTT the service measures on each share path with its cross flows running: the RTT the advice
    carries, so the share law (models.tame_share) is keyed by it, not by the delay the bed adds."""
    lines = [f"# The RTT the service measures on the share paths (`{args.command}`)", "",
             f"{args.rate / 1e6:g} Mbit/s, one-BDP drop-tail queue, {args.cross} {args.standard} cross flows "
             "running; `tame probe`'s idle RTT (a 1 Mbit/s paced stream, smallest smoothed RTT), "
             f"{args.repeats} time(s) per path.", "",
             "| delay-line RTT | measured (median) | all |", "|---|---|---|"]
    for rtt_ms in args.rtts:
        spec = path_spec(args.rate, rtt_ms / 1000, args.cross, "tccrtt", args.standard)
        with bed(spec, servers=1) as tb:
            got = [service_rtt_s(tb) for _ in range(args.repeats)]
        print(f"{rtt_ms:g} ms: measured {[round(g * 1000, 1) for g in got]} ms", file=sys.stderr, flush=True)
        lines.append(f"| {rtt_ms:g} ms | {median(got) * 1000:.1f} ms | "
                     f"{', '.join(f'{g * 1000:.1f}' for g in got)} |")
    return lines


# --- main ---------------------------------------------------------------------------------------


def _report(args, runs: list[Run], cases: list[dict] | None, measured_by: dict[str, str] | None = None) -> list[str]:
    if args.what == "share":
        return share_report(runs, args.command)
    if args.what == "hacker":
        return hacker_report(runs, args.command)
    if args.what == "aggregate":
        return aggregate_report(runs, args.command, args.n_star, measured_by)
    return plan_report(runs, cases or [], args.command)


def report_command(report: Path) -> str:
    """The command a report was made by: the one between backquotes on its first line."""
    head = report.read_text().splitlines()[0]
    return head[head.index("`") + 1:head.rindex("`")]


def report_n_star(report: Path) -> float:
    """The n* an aggregate report's runs were scaled to, as its first line names it."""
    head = report.read_text().splitlines()[:1]
    found = re.search(r"scaled to n\* = ([0-9]+(?:\.[0-9]+)?) ", head[0]) if head else None
    if found is None:
        raise SystemExit(f"{report} is no aggregate report: its first line names no n*")
    return float(found[1])


def merged_aggregate_runs(reports: Sequence[Path], n_star: float) -> tuple[list[Run], dict[str, str]]:
    """The runs kept beside several aggregate reports (one path each, all scaled to ``n_star``), and which command
    measured each path."""
    runs: list[Run] = []
    measured_by: dict[str, str] = {}
    for report in reports:
        scaled_to = report_n_star(report)
        if scaled_to != n_star:
            raise SystemExit(f"--merge: {report} scaled its runs to n* = {scaled_to:g}, not --n-star "
                             f"{n_star:g}: merge reports of one n*")
        part = [Run(**r) for r in json.loads(report.with_suffix(".json").read_text())["runs"]]
        paths = {f"{r.rtt_s * 1000:g}" for r in part}
        if len(paths) != 1 or paths & measured_by.keys():
            raise SystemExit(f"--merge: {report} must hold one path (bed RTT) that no other report holds; "
                             f"it holds {', '.join(sorted(paths))} ms")
        measured_by[paths.pop()] = report_command(report)
        runs += part
    return runs, measured_by


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tame_cc", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("share", "hacker", "aggregate", "plan", "cycles", "rtt"))
    parser.add_argument("--rate", type=float, default=50e6, help="bottleneck bits/s (default 50e6)")
    parser.add_argument("--rtts", type=_floats, default=None, help="RTTs in ms, comma-separated")
    parser.add_argument("--fms", type=_floats, default=[1.5, 4, 10, 30, 100])
    parser.add_argument("--cross", type=int, default=5, help="cross flows (default 5)")
    parser.add_argument("--standard", choices=("cubic", "reno"), default=STANDARD,
                        help="share: the standard streams' and cross flows' control (default cubic)")
    parser.add_argument("--tame-streams", type=int, default=4, help="share: tame streams beside one cubic (default 4)")
    parser.add_argument("--slow-start", choices=("reno", "scaled", "both"), default="reno")
    parser.add_argument("--n-star", type=float, default=2.0, help="aggregate: n* (whole; default 2)")
    parser.add_argument("--streams", type=_ints, default=[2, 4, 8, 16, 32], help="aggregate: N values")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured seconds per run (default 40)")
    parser.add_argument("--omit", type=float, default=10.0, help="warm-up seconds not measured (default 10)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--paths", default=None, help="plan: comma-separated path keys (default all)")
    parser.add_argument("--budgets", type=_floats, default=list(PLAN_BUDGETS), help="plan: impact budgets")
    parser.add_argument("--no-margin", action="store_true",
                        help="plan: advise on the bare predicted impact (`tame advise --no-margin`), not the service's "
                             "margins for the prediction's error")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--report-only", action="store_true",
                        help="share/hacker/aggregate/plan: rewrite the report from --output's .json, measuring nothing")
    parser.add_argument("--merge", type=lambda t: [Path(x) for x in t.split(",")], default=None,
                        help="aggregate: one report (and .json) at --output of the runs of these aggregate reports, "
                             "one path each, fitted together; measures nothing")
    args = parser.parse_args(argv)
    args.rtts = args.rtts or ([10.0, 40.0, 100.0] if args.what in ("share", "rtt") else [40.0])
    args.command = "python -m benchmarks.tame_cc " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    if args.merge and args.what != "aggregate":
        parser.error("--merge is for aggregate reports")
    if args.merge and args.output is None:
        parser.error("--merge needs --output, the merged report's path")
    if os.geteuid() != 0 and not (args.report_only or args.merge):
        parser.error("needs root (network namespaces, BPF)")
    if min(args.fms) < 1 or args.seconds < 2 or args.repeats < 1 or args.omit < 0:
        parser.error("FM >= 1, --seconds >= 2, --repeats >= 1, --omit >= 0")
    signal.signal(signal.SIGTERM, _on_sigterm)
    output = args.output or RESULTS / f"tame-cc-{args.what}.md"
    if args.what in ("cycles", "rtt"):
        lines = {"cycles": cycles, "rtt": probe_rtts}[args.what](args)
        runs: list[Run] = []
    elif args.report_only:
        record = json.loads(output.with_suffix(".json").read_text())
        runs, cases = [Run(**r) for r in record["runs"]], record.get("cases")
        args.command = report_command(output)  # the command that measured (or merged) it
        if args.what == "aggregate":
            args.n_star = report_n_star(output)
        lines = _report(args, runs, cases, record.get("measured_by"))
        runs = []  # the .json stays as measured
    elif args.merge:
        runs, measured_by = merged_aggregate_runs(args.merge, args.n_star)
        lines = _report(args, runs, None, measured_by)
        output.with_suffix(".json").write_text(
            json.dumps({"runs": [asdict(r) for r in runs], "cases": None, "measured_by": measured_by}, indent=1) + "\n")
        runs = []  # written with what measured each path
    elif args.what == "plan":
        default = ProbePlan()  # the service's probe plan
        args.probe_seconds, args.probe_max_seconds, args.probe_omit = (
            default.duration_s, default.max_duration_s, default.omit_s)
        with tame_loaded():
            runs, cases = plan_runs(args)
        lines = _report(args, runs, cases)
    else:
        with tame_loaded():
            runs = {"share": share_runs, "hacker": hacker_runs, "aggregate": aggregate_runs}[args.what](args)
        cases = None
        lines = _report(args, runs, cases)
    text = "\n".join(lines) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    if runs:
        record = {"runs": [asdict(r) for r in runs], "cases": cases}
        output.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
