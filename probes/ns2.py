"""The ns-2 driver: a path simulated on the Qiu/Lu topology (Lu et al. 2004, Fig. 1-2) instead of the network.

Three layers, as for iperf3: ``Ns2Config`` says what to simulate, ``parse_ns2_output`` turns the
simulator's text into numbers (pure, tested on recorded files), and ``simulate`` runs ``ns`` with a
deadline and an on-disk cache keyed by every parameter. ``Ns2Driver`` wraps them in the
ProbeDriver interface; ``long_transfer`` and ``cross_only`` give the benchmark's ground truth.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from probes.errors import ProbeDeadlineExceeded, SimulatorError, ZeroThroughput
from probes.settle import assess_series
from probes.result import ProbeResult, StreamRtt

TEMPLATE = Path(__file__).with_name("ns2_scenario.tcl")
# The same scenario with one fractional stream of ours added (Ns2Config.fractional_multiplier).
FRACTIONAL_TEMPLATE = Path(__file__).with_name("ns2_fractional.tcl")
# The bottleneck queue disciplines the scenario script takes (Lu et al. simulated both).
QUEUES = ("DropTail", "RED")
PACKET_BYTES = 1000
QUEUE_PACKETS = 25
L1_DELAY_S = 0.004
L4_DELAY_S = 0.005
CROSS_START_WINDOW_S = 8.0
TRANSFER_START_S = 10.0
UNTUNED_WINDOW_BYTES = 60_000
# Tuned windows are this multiple of the bandwidth-delay product, so the window never limits.
TUNED_WINDOW_BDP_MULTIPLE = 2.0


@dataclass(frozen=True)
class Scenario:
    """One row of Lu Fig. 2: bottleneck L3 bandwidth (bits/s) and one-way delay (s), access links, window."""

    number: int
    l3_bps: float
    l3_delay_s: float
    access_bps: float
    tuned: bool

    @property
    def idle_rtt_s(self) -> float:
        """Round-trip propagation delay N2 -> N6 -> N2 plus one packet's serialisation per hop, seconds."""
        propagation = 2 * (L1_DELAY_S + self.l3_delay_s + L4_DELAY_S)
        data = PACKET_BYTES * 8 * (2 / self.access_bps + 1 / self.l3_bps)
        ack = 40 * 8 * (2 / self.access_bps + 1 / self.l3_bps)
        return propagation + data + ack

    @property
    def window_packets(self) -> int:
        """Sender window in packets: 2 x BDP when tuned, 60 KB otherwise (Lu Fig. 2)."""
        if not self.tuned:
            return UNTUNED_WINDOW_BYTES // PACKET_BYTES
        bdp = self.l3_bps * self.idle_rtt_s / (8 * PACKET_BYTES)
        return max(int(math.ceil(TUNED_WINDOW_BDP_MULTIPLE * bdp)), 2 * QUEUE_PACKETS)


SCENARIOS: Mapping[int, Scenario] = {
    1: Scenario(1, 1.5e6, 0.020, 10e6, True),
    2: Scenario(2, 100e6, 0.020, 1e9, True),
    3: Scenario(3, 100e6, 0.050, 1e9, True),
    4: Scenario(4, 1e9, 0.050, 10e9, True),
    5: Scenario(5, 1e9, 0.050, 10e9, False),
    6: Scenario(6, 100e6, 0.020, 1e9, False),
    # Held out: not in Lu's Fig. 2, not used to choose a model's form or constants (except that
    # the 'auto' knee's plateau was designed after looking at scenario 10's ground truth too); the
    # accuracy benchmark reports them apart (--holdout) to show how the models generalise.
    7: Scenario(7, 10e6, 0.030, 100e6, True),
    8: Scenario(8, 50e6, 0.040, 1e9, True),
    9: Scenario(9, 200e6, 0.010, 1e9, True),
    10: Scenario(10, 100e6, 0.050, 1e9, False),
}
# Scenarios 1-6 are Lu et al.'s (Fig. 2); these are the held-out ones.
HELD_OUT = (7, 8, 9, 10)


@dataclass(frozen=True)
class Ns2Config:
    """Everything that decides one simulator run (and so its cache key).

    ``m`` cross flows start uniformly in the first 8 s; ``n`` of ours start at 10 s; throughput is
    measured from ``TRANSFER_START_S + omit_s`` for ``duration_s`` seconds. ``seed`` >= 1 (ns-2
    treats 0 as "seed from the clock"). ``fractional_multiplier`` FM >= 1 adds one more flow of ours
    whose window grows by 1/FM segments a round trip (a fractional stream, Hacker et al. 2004), as
    the advice's ``fractional_multiplier`` asks for; None adds none.
    """

    scenario: int
    m: int
    n: int
    seed: int
    duration_s: float
    omit_s: float
    queue: str = "DropTail"
    interval_s: float = 1.0
    fractional_multiplier: float | None = None

    def __post_init__(self):
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {sorted(SCENARIOS)}, got {self.scenario!r}")
        if self.m < 0 or self.n < 0 or self.m + self.n == 0:
            raise ValueError(f"m and n must be >= 0 and not both 0, got m={self.m}, n={self.n}")
        if not (isinstance(self.seed, int) and self.seed >= 1):
            raise ValueError(f"seed must be an integer >= 1, got {self.seed!r}")
        if not (self.duration_s > 0 and self.omit_s >= 0 and self.interval_s > 0):
            raise ValueError("duration_s and interval_s must be > 0 and omit_s >= 0")
        if self.queue not in QUEUES:
            raise ValueError(f"queue must be {' or '.join(map(repr, QUEUES))}, got {self.queue!r}")
        fm = self.fractional_multiplier
        if fm is not None and not (isinstance(fm, (int, float)) and math.isfinite(fm) and fm >= 1):
            raise ValueError(f"fractional_multiplier must be a number >= 1 or None, got {fm!r}")

    @property
    def template(self) -> Path:
        """The Tcl script that runs this config."""
        return TEMPLATE if self.fractional_multiplier is None else FRACTIONAL_TEMPLATE

    @property
    def measure_from_s(self) -> float:
        return TRANSFER_START_S + self.omit_s

    @property
    def measure_to_s(self) -> float:
        return self.measure_from_s + self.duration_s

    def argv(self) -> list[str]:
        """The simulator's key/value arguments for the Tcl template."""
        s = SCENARIOS[self.scenario]
        window = s.window_packets
        values = {
            "seed": self.seed,
            "l3_bw": f"{s.l3_bps:.0f}",
            "l3_delay": f"{s.l3_delay_s:g}",
            "access_bw": f"{s.access_bps:.0f}",
            "l1_delay": f"{L1_DELAY_S:g}",
            "l4_delay": f"{L4_DELAY_S:g}",
            "queue_pkts": QUEUE_PACKETS,
            "queue": self.queue,
            "window_pkts": window,
            "cross_window_pkts": window,
            "packet_bytes": PACKET_BYTES,
            "m": self.m,
            "n": self.n,
            "cross_start_s": f"{CROSS_START_WINDOW_S:g}",
            "start_s": f"{TRANSFER_START_S:g}",
            "measure_from_s": f"{self.measure_from_s:g}",
            "measure_to_s": f"{self.measure_to_s:g}",
            "interval_s": f"{self.interval_s:g}",
        }
        if self.fractional_multiplier is not None:
            values = {"fractional_increase": f"{1.0 / self.fractional_multiplier:.12g}", **values}
        return [str(x) for kv in values.items() for x in kv]


@dataclass(frozen=True)
class FlowStats:
    """One flow over the measurement window: bits/s, retransmitted packets, mean smoothed RTT (s)."""

    group: str
    index: int
    throughput_bps: float
    retransmits: int
    rtt_mean_s: float | None
    rtt_min_s: float | None
    rtt_max_s: float | None


@dataclass(frozen=True)
class Ns2Run:
    """A parsed simulator run: per-flow stats and each group's per-interval throughput (bits/s)."""

    duration_s: float
    flows: tuple[FlowStats, ...]
    ours_interval_bps: tuple[float, ...]
    cross_interval_bps: tuple[float, ...]

    def group(self, name: str) -> tuple[FlowStats, ...]:
        return tuple(f for f in self.flows if f.group == name)

    @property
    def ours_bps(self) -> float:
        return sum(f.throughput_bps for f in self.group("ours"))

    @property
    def cross_bps(self) -> float:
        return sum(f.throughput_bps for f in self.group("cross"))


def parse_ns2_output(text: str) -> Ns2Run:
    """Parse the Tcl template's output into per-flow throughput, retransmissions and RTT.

    Lines are ``config ...``, then ``begin|tick|end <time_s> <group> <index> <acked_pkts>
    <retransmitted_pkts> <srtt_s>`` and ``done``. Raises SimulatorError for truncated or
    malformed output.
    """
    config: dict[str, str] = {}
    snapshots: dict[str, dict[tuple[str, int], tuple[float, int, int, float]]] = {"begin": {}, "end": {}}
    ticks: dict[float, dict[tuple[str, int], int]] = {}
    rtts: dict[tuple[str, int], list[float]] = {}
    done = False
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            if fields[0] == "config":
                config = dict(zip(fields[1::2], fields[2::2]))
            elif fields[0] in ("begin", "tick", "end"):
                label, time_s, group, index, acked, rexmit, srtt = fields
                key = (group, int(index))
                row = (float(time_s), int(acked), int(rexmit), float(srtt))
                if label == "tick":
                    ticks.setdefault(row[0], {})[key] = row[1]
                    if row[3] > 0:
                        rtts.setdefault(key, []).append(row[3])
                else:
                    snapshots[label][key] = row
            elif fields[0] == "done":
                done = True
        except ValueError as exc:
            raise SimulatorError(f"ns-2 output line {number} is malformed: {line!r}") from exc
    if not done or "packet_bytes" not in config:
        raise SimulatorError("ns-2 output is truncated (no 'config' or 'done' line)")
    begin, end = snapshots["begin"], snapshots["end"]
    if set(begin) != set(end):
        raise SimulatorError("ns-2 output has flows without both a begin and an end snapshot")
    packet_bits = 8 * int(config["packet_bytes"])
    duration_s = float(config["to"]) - float(config["from"])
    flows = []
    for key in sorted(begin):
        t0, acked0, rexmit0, _ = begin[key]
        t1, acked1, rexmit1, srtt_end = end[key]
        samples = rtts.get(key, []) + ([srtt_end] if srtt_end > 0 else [])
        flows.append(
            FlowStats(
                group=key[0],
                index=key[1],
                throughput_bps=max(acked1 - acked0, 0) * packet_bits / (t1 - t0),
                retransmits=rexmit1 - rexmit0,
                rtt_mean_s=sum(samples) / len(samples) if samples else None,
                rtt_min_s=min(samples) if samples else None,
                rtt_max_s=max(samples) if samples else None,
            )
        )
    end_time = max((row[0] for row in end.values()), default=float(config["to"]))
    ticks.setdefault(end_time, {key: row[1] for key, row in end.items()})
    times = sorted(ticks)
    series: dict[str, list[float]] = {"ours": [], "cross": []}
    for t_a, t_b in zip(times, times[1:]):
        for group in series:
            delta = sum(ticks[t_b].get(k, 0) - ticks[t_a].get(k, 0) for k in begin if k[0] == group)
            series[group].append(delta * packet_bits / (t_b - t_a))
    return Ns2Run(duration_s, tuple(flows), tuple(series["ours"]), tuple(series["cross"]))


def _ns_version(ns_binary: str) -> str:
    found = shutil.which(ns_binary)
    return os.path.realpath(found) if found else ns_binary


def cache_key(config: Ns2Config, ns_binary: str = "ns") -> str:
    """Hash of every parameter, the Tcl scripts and the simulator binary: equal keys, equal runs.

    A config without a fractional stream hashes as it did before that option existed (the field left out,
    the scenario script alone), so runs cached then are found again.
    """
    parameters = asdict(config)
    material = {"template": TEMPLATE.read_text(), "ns": _ns_version(ns_binary)}
    if config.fractional_multiplier is None:
        del parameters["fractional_multiplier"]
    else:
        material["fractional_template"] = FRACTIONAL_TEMPLATE.read_text()
    material = json.dumps({"config": parameters, **material}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def run_ns2(config: Ns2Config, deadline_s: float, ns_binary: str = "ns") -> str:
    """Run the simulator once and return its stdout; killed and ProbeDeadlineExceeded after deadline_s."""
    argv = [ns_binary, str(config.template), *config.argv()]
    try:
        completed = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ProbeDeadlineExceeded(f"ns-2 did not finish within {deadline_s:g} s") from exc
    except OSError as exc:
        raise SimulatorError(f"cannot run ns-2 ({ns_binary}): {exc}") from exc
    if completed.returncode != 0:
        raise SimulatorError(f"ns-2 exited with status {completed.returncode}: {completed.stderr.strip()[-500:]}")
    return completed.stdout


def simulate(
    config: Ns2Config,
    deadline_s: float = 3600.0,
    cache_dir: Path | None = None,
    ns_binary: str = "ns",
) -> tuple[Ns2Run, str]:
    """Parsed run and raw output for ``config``, from ``cache_dir`` when it was run before."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{cache_key(config, ns_binary)}.out"
        if path.exists():
            raw = path.read_text()
            return parse_ns2_output(raw), raw
    raw = run_ns2(config, deadline_s, ns_binary)
    parsed = parse_ns2_output(raw)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written then renamed, so parallel workers never read half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            handle.write(raw)
        os.replace(tmp, path)
    return parsed, raw


def probe_result(run: Ns2Run, dest: str, streams: int, omit_s: float, raw: str = "") -> ProbeResult:
    """The ProbeResult of our flows in a parsed run (the fields the iperf3 driver fills)."""
    ours = run.group("ours")
    total = run.ours_bps
    if total <= 0:
        raise ZeroThroughput(f"ns-2 run moved no data for {streams} streams")
    stream_rtts = tuple(
        StreamRtt(f.rtt_mean_s, f.rtt_min_s, f.rtt_max_s) for f in ours if f.rtt_mean_s is not None
    )
    # The same settle rule as iperf3 probes (probes.settle), on the simulator's 1 s series.
    verdict = assess_series(run.ours_interval_bps)
    return ProbeResult(
        dest=dest,
        streams=streams,
        duration_s=run.duration_s,
        omit_s=omit_s,
        throughput_bps=total,
        sender_bps=total,
        retransmits=sum(f.retransmits for f in ours),
        rtt_mean_s=sum(r.mean_s for r in stream_rtts) / len(stream_rtts) if stream_rtts else None,
        rtt_min_s=min(r.min_s for r in stream_rtts) if stream_rtts else None,
        rtt_max_s=max(r.max_s for r in stream_rtts) if stream_rtts else None,
        stream_rtts=stream_rtts,
        mss_bytes=PACKET_BYTES,
        congestion_control="reno",
        throughput_stderr_bps=verdict.stderr_bps,
        settled=verdict.settled,
        interval_bps=run.ours_interval_bps,
        stream_bps=tuple(f.throughput_bps for f in ours),
        stream_retransmits=tuple(f.retransmits for f in ours),
        raw=raw,
    )


# Seeds of a probe's later attempts (Ns2Driver.run): far from the seeds the benchmark gives its
# ground truth (1, 2, ...) and its probes (1000 x seed + 7).
ATTEMPT_SEED_STRIDE = 1_000_000


@dataclass
class Ns2Driver:
    """ProbeDriver over a simulated path: scenario, m cross flows, queue policy and seed fix the path.

    ``dest`` is only a label. Each probe uses the seed it is given at construction, so two
    drivers with different seeds see different cross-traffic start times. A probe asked again at
    another time (``attempt`` > 0) runs with seed + ATTEMPT_SEED_STRIDE x attempt: the same path,
    its cross traffic started at other times, as a real re-run some minutes later would meet it.
    """

    scenario: int
    m: int
    seed: int = 1
    queue: str = "DropTail"
    cache_dir: Path | None = None
    ns_binary: str = "ns"

    def run(self, dest: str, streams: int, duration_s: float, omit_s: float, deadline_s: float,
            attempt: int = 0, congestion_control: str | None = None) -> ProbeResult:
        if congestion_control not in (None, "reno"):
            raise SimulatorError(f"the ns-2 scenarios simulate reno streams only, not {congestion_control!r}")
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams!r}")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise ValueError(f"attempt must be an integer >= 0, got {attempt!r}")
        seed = self.seed + ATTEMPT_SEED_STRIDE * attempt
        config = Ns2Config(self.scenario, self.m, streams, seed, duration_s, omit_s, self.queue)
        run, raw = simulate(config, deadline_s, self.cache_dir, self.ns_binary)
        return probe_result(run, dest, streams, omit_s, raw)

    def idle_rtt(self, dest: str, deadline_s: float) -> float | None:
        return SCENARIOS[self.scenario].idle_rtt_s


@dataclass(frozen=True)
class Transfer:
    """Ground truth at n streams: our aggregate and the cross traffic's aggregate, bits/s."""

    n: int
    ours_bps: float
    cross_bps: float
    retransmits: int
    rtt_mean_s: float | None


def long_transfer(
    scenario: int, m: int, n: int, seed: int, duration_s: float = 80.0, omit_s: float = 10.0,
    queue: str = "DropTail", cache_dir: Path | None = None, deadline_s: float = 3600.0, ns_binary: str = "ns",
    fractional_multiplier: float | None = None,
) -> Transfer:
    """A long transfer at n streams (n = 0: cross traffic alone), plus one fractional stream of multiplier
    ``fractional_multiplier`` if given (counted in ``ours_bps``, not in ``n``), measured after omit_s of warm-up."""
    config = Ns2Config(scenario, m, n, seed, duration_s, omit_s, queue, fractional_multiplier=fractional_multiplier)
    run, _ = simulate(config, deadline_s, cache_dir, ns_binary)
    ours = run.group("ours")
    rtts = [f.rtt_mean_s for f in ours if f.rtt_mean_s is not None]
    return Transfer(
        n=n,
        ours_bps=run.ours_bps,
        cross_bps=run.cross_bps,
        retransmits=sum(f.retransmits for f in ours),
        rtt_mean_s=sum(rtts) / len(rtts) if rtts else None,
    )


def cross_only(scenario: int, m: int, seed: int, **kwargs) -> float:
    """Cross traffic throughput (bits/s) with no transfer of ours at all."""
    return long_transfer(scenario, m, 0, seed, **kwargs).cross_bps
