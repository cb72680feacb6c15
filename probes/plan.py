"""A probe plan: idle RTT, then paired probes at fixed stream counts, each run until it settles."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Callable, Literal, Sequence

from models.single_flow import congestion_cycle_s
from probes.base import ProbeDriver
from probes.result import PlanResult, ProbeResult
from probes.settle import assess_series


@dataclass(frozen=True)
class ProbePlan:
    """What to measure and for how long.

    ``levels`` are the paired stream counts (n1, n2); (1, 10) by default, which on the paper's
    own simulator predicts far better than (1, 5). ``extra_levels`` are probed after them.
    Each level is probed ``repeats`` times, levels interleaved (1, 10, 1, 10, …) so a change of
    the path over time does not fall on one level only. A probe lasts ``omit_s`` warm-up seconds
    plus ``duration_s`` measured seconds; one whose interval series has not settled
    (:func:`probes.settle.assess_series` with ``settle_tolerance`` and ``settle_z``), or that saw
    losses but spans fewer than ``settle_cycles`` congestion cycles of its streams
    (:func:`models.single_flow.congestion_cycle_s`), is re-run twice as long, or at once as long as the
    cycles need, up to ``max_duration_s``. A probe may take ``deadline_slack_s`` seconds past
    its nominal length before the driver kills it. A probe in which some streams carried next to
    nothing (:func:`idle_streams`) measured fewer streams than asked: it is run again, at another
    time, up to ``idle_retries`` times, and the attempt with the fewest idle streams is kept.
    ``adaptive_probes`` more probes may follow, each at a level chosen from the results so far by
    the ``next_level`` callable given to :func:`run_plan`, at most ``max_adaptive_streams`` streams
    (None: as many as the chooser picks).
    """

    levels: tuple[int, ...] = (1, 10)
    # 30 s measured after 5 s of warm-up: on the ns-2 accuracy benchmark, 10 s after 2 s (the
    # defaults before) left probes that passed the settling rule off the long transfers often enough to
    # take auto's per-path throughput error from 0.066 to 0.100 (median), and 30 s probes need fewer
    # re-runs, so probing a path costs about the same (161 s either way). Figures and the commands
    # that give them: docs/accuracy.md ("Shorter probes").
    duration_s: float = 30.0
    omit_s: float = 5.0
    repeats: int = 1
    extra_levels: tuple[int, ...] = ()
    settle_tolerance: float = 0.05
    settle_z: float = 2.0
    settle_cycles: float = 8.0
    max_duration_s: float = 60.0
    deadline_slack_s: float = 20.0
    idle_rtt_deadline_s: float = 20.0
    adaptive_probes: int = 0
    max_adaptive_streams: int | None = None
    # On ns-2's 10 Mbit/s held-out scenario 7, 8-28 of 31 streams started together carry nothing
    # for a whole 30 s probe (their first segments lost, their retransmission timers backing off),
    # while the long transfers of the ground truth carry on every stream; a later attempt mostly
    # finds every stream running. Figures: docs/accuracy.md (DropTail lock-out on s1 and s7).
    idle_retries: int = 1
    # The congestion control the probes' streams run under (None: the driver's, else the kernel's default).
    congestion_control: str | None = None

    def __post_init__(self) -> None:
        all_levels = self.levels + self.extra_levels
        if not self.levels:
            raise ValueError("levels must name at least one stream count")
        for n in all_levels:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"levels and extra_levels must be positive integers, got {n!r}")
        if len(set(all_levels)) != len(all_levels):
            raise ValueError(f"levels and extra_levels must not repeat a stream count: {all_levels}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an integer >= 1, got {self.repeats!r}")
        for name in ("adaptive_probes", "idle_retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        cap = self.max_adaptive_streams
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_adaptive_streams must be an integer >= 1 or None, got {cap!r}")
        for name in ("duration_s", "max_duration_s", "deadline_slack_s", "idle_rtt_deadline_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.omit_s) and self.omit_s >= 0):
            raise ValueError(f"omit_s must be a finite number >= 0, got {self.omit_s!r}")
        if self.max_duration_s < self.duration_s:
            raise ValueError(
                f"max_duration_s ({self.max_duration_s:g}) must be at least duration_s ({self.duration_s:g})"
            )
        if not (math.isfinite(self.settle_tolerance) and self.settle_tolerance >= 0):
            raise ValueError(f"settle_tolerance must be >= 0, got {self.settle_tolerance!r}")
        if not (math.isfinite(self.settle_z) and self.settle_z >= 0):
            raise ValueError(f"settle_z must be >= 0, got {self.settle_z!r}")
        if not (math.isfinite(self.settle_cycles) and self.settle_cycles >= 0):
            raise ValueError(f"settle_cycles must be >= 0, got {self.settle_cycles!r}")

    @property
    def worst_case_s(self) -> float:
        """Longest the whole plan may take, seconds: the idle RTT plus every probe, each attempt extended to the cap."""
        durations = [self.duration_s]
        while durations[-1] < self.max_duration_s:
            durations.append(min(2 * durations[-1], self.max_duration_s))
        per_probe = sum(self.omit_s + d + self.deadline_slack_s for d in durations)
        attempts = 1 + self.idle_retries
        return self.idle_rtt_deadline_s + (len(self.schedule) + self.adaptive_probes) * attempts * per_probe

    @property
    def schedule(self) -> tuple[int, ...]:
        """Stream counts in the order they are probed."""
        return tuple(self.levels * self.repeats) + tuple(self.extra_levels * self.repeats)


@dataclass(frozen=True)
class PlanEvent:
    """Progress of a plan, for a display: what is about to run or what just finished.

    ``attempt`` is the level's attempt (0 first; a retry after idle streams is another).
    ``expected_s`` is how long the step about to run should take, warm-up included (``probe``,
    ``retry``, ``extend``: the longer run that follows; ``idle_rtt``: its deadline).
    """

    kind: Literal["idle_rtt", "idle_rtt_done", "probe", "probe_done", "extend", "retry"]
    dest: str
    streams: int | None = None
    duration_s: float | None = None
    index: int = 0  # 1-based position in the schedule (0 for the idle RTT)
    total: int = 0
    result: ProbeResult | None = None
    idle_rtt_s: float | None = None
    attempt: int = 0
    expected_s: float | None = None


Progress = Callable[[PlanEvent], None]
# Chooses the next probe level from the probes so far, or None when no further probe would help.
NextLevel = Callable[[Sequence[ProbeResult]], "int | None"]

_dest_locks: dict[str, threading.Lock] = {}
_dest_locks_guard = threading.Lock()


def _lock_for(dest: str) -> threading.Lock:
    # Process-wide on purpose: two plans to one destination from two threads (an API serving
    # two requests) must queue, since an iperf3 server runs one test at a time and parallel
    # probes would each measure the other's load.
    with _dest_locks_guard:
        return _dest_locks.setdefault(dest, threading.Lock())


def run_plan(
    driver: ProbeDriver,
    dest: str,
    plan: ProbePlan | None = None,
    progress: Progress | None = None,
    next_level: NextLevel | None = None,
) -> PlanResult:
    """Measure ``dest``: idle RTT, then every probe of ``plan`` in turn, never two at once.

    With ``plan.adaptive_probes`` > 0 and a ``next_level`` chooser, up to that many further probes
    follow the schedule, each at the level the chooser picks from the results so far, capped at
    ``plan.max_adaptive_streams``; a level already probed, or None, ends the plan. Progress totals
    count the schedule; an adaptive probe raises the total when it is chosen. A ProbeError from
    the driver propagates and nothing measured so far is returned.
    """
    plan = plan or ProbePlan()
    report = progress or (lambda event: None)
    schedule = plan.schedule
    with _lock_for(dest):
        report(PlanEvent("idle_rtt", dest, total=len(schedule), expected_s=plan.idle_rtt_deadline_s))
        idle_rtt_s = driver.idle_rtt(dest, deadline_s=plan.idle_rtt_deadline_s)
        report(PlanEvent("idle_rtt_done", dest, total=len(schedule), idle_rtt_s=idle_rtt_s))
        probes = []
        for index, streams in enumerate(schedule, start=1):
            probes.append(_probed_level(driver, dest, streams, plan, index, len(schedule), report))
        for _ in range(plan.adaptive_probes if next_level is not None else 0):
            streams = next_level(tuple(probes))
            if streams is None:
                break
            if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
                raise ValueError(f"the adaptive level chooser returned {streams!r}, not a stream count >= 1")
            streams = streams if plan.max_adaptive_streams is None else min(streams, plan.max_adaptive_streams)
            if streams in {p.streams for p in probes}:
                break
            total = len(probes) + 1
            probes.append(_probed_level(driver, dest, streams, plan, total, total, report))
    return PlanResult(dest=dest, idle_rtt_s=idle_rtt_s, probes=tuple(probes))


def _probed_level(
    driver: ProbeDriver,
    dest: str,
    streams: int,
    plan: ProbePlan,
    index: int,
    total: int,
    report: Progress,
) -> ProbeResult:
    """One level of the plan: a settled probe, tried again while some of its streams sat idle."""

    def settled(attempt: int) -> ProbeResult:
        # One attempt, re-run longer while its rate has not settled, up to plan.max_duration_s.
        duration_s = plan.duration_s
        while True:
            deadline_s = plan.omit_s + duration_s + plan.deadline_slack_s
            # Asked for only when set, so drivers (and test doubles) that take no control still run plans.
            control = {} if plan.congestion_control is None else {"congestion_control": plan.congestion_control}
            result = judge(driver.run(dest, streams, duration_s, plan.omit_s, deadline_s, attempt=attempt, **control),
                           plan)
            if result.settled or duration_s >= plan.max_duration_s:
                return result
            duration_s = min(max(2 * duration_s, math.ceil(cycles_needed_s(result, plan))), plan.max_duration_s)
            report(PlanEvent("extend", dest, streams, duration_s, index, total, result, attempt=attempt,
                             expected_s=plan.omit_s + duration_s))

    report(PlanEvent("probe", dest, streams, plan.duration_s, index, total, expected_s=plan.omit_s + plan.duration_s))
    kept = settled(0)
    for attempt in range(1, plan.idle_retries + 1):
        if not idle_streams(kept):
            break
        report(PlanEvent("retry", dest, streams, plan.duration_s, index, total, kept, attempt=attempt,
                         expected_s=plan.omit_s + plan.duration_s))
        again = settled(attempt)
        if idle_streams(again) < idle_streams(kept):
            kept = again
    report(PlanEvent("probe_done", dest, streams, kept.duration_s, index, total, kept))
    return kept


# A stream whose rate over the probe is below this share of the probe's mean per-stream rate
# carried next to nothing: locked out, not merely slower than the others.
IDLE_STREAM_SHARE = 0.01


def idle_streams(result: ProbeResult) -> int:
    """How many of the probe's streams carried under IDLE_STREAM_SHARE of its mean per-stream rate (0 without per-stream rates)."""
    if not result.stream_bps:
        return 0
    mean = sum(result.stream_bps) / len(result.stream_bps)
    return sum(rate < IDLE_STREAM_SHARE * mean for rate in result.stream_bps)


def cycles_needed_s(result: ProbeResult, plan: ProbePlan) -> float:
    """Measured seconds the probe needs to span ``plan.settle_cycles`` congestion cycles (0 if not loss-limited).

    A probe that saw no retransmissions is not loss-limited (window-, receiver- or
    application-limited): it has no sawtooth to average over. So is a driver that does not
    report retransmissions, RTT or MSS.
    """
    if not result.retransmits or not result.rtt_mean_s or not result.mss_bytes or result.throughput_bps <= 0:
        return 0.0
    cycle_s = congestion_cycle_s(result.throughput_bps / result.streams, result.rtt_mean_s, result.mss_bytes)
    return plan.settle_cycles * cycle_s


def judge(result: ProbeResult, plan: ProbePlan) -> ProbeResult:
    """``result`` judged by the plan's settle rule: settled, its rate and that rate's standard error.

    The rate is the receiver's, scaled by the interval series to the part after the start-up
    ramp (:func:`probes.settle.assess_series`); the whole window's rate stays in
    ``window_throughput_bps``. The series is the receiver's where the driver has it; a sender's
    series (``interval_side``) can dip while the link stays full, and scaling by it can read
    above the link's rate. A driver without an interval series keeps its own verdict and rate.
    """
    if not result.interval_bps:
        return result
    verdict = assess_series(result.interval_bps, tolerance=plan.settle_tolerance, z=plan.settle_z)
    window_mean = sum(result.interval_bps) / len(result.interval_bps)
    # With no ramp dropped the receiver's own figure stands as it is.
    scale = verdict.mean_bps / window_mean if verdict.start > 0 and window_mean > 0 else 1.0
    judged = replace(result, throughput_bps=result.throughput_bps * scale,
                     throughput_stderr_bps=None if verdict.stderr_bps is None else verdict.stderr_bps * (
                         result.throughput_bps / window_mean if window_mean > 0 else 1.0),
                     window_throughput_bps=result.throughput_bps)
    settled = verdict.settled and result.duration_s >= cycles_needed_s(judged, plan)
    return replace(judged, settled=settled)


# Named plans (`python -m benchmarks.accuracy --plan NAME`): "standard" is the service's default.
PLANS: dict[str, ProbePlan] = {
    "standard": ProbePlan(),
}
