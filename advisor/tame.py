"""TameParallelTCP (Lu et al. 2004, section V.C): the most streams whose predicted impact fits the budget."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from advisor.advice import Advice, CurvePoint
from advisor.limits import MAX_STREAMS, usable_rtt_s
from models.buffer import per_stream_buffer_bytes
from models.tame_share import MIN_WINDOW_SEGMENTS, TYPICAL_MSS_BYTES, aggregate_law_for, law_for, window_floor_bps
from models.parallel import UNCONGESTED, ParallelFit, ProbePoint
from models.registry import MODELS, fit
from probes.result import PlanResult, ProbeResult, reported_controls

DEFAULT_MODEL = "auto"
DEFAULT_N_MAX = 64
# A remainder below this is not worth a fractional stream; one needing FM above the cap is not offered.
MIN_FRACTION = 0.05
MAX_FRACTIONAL_MULTIPLIER = 1000.0
# Resolution of the search for n*: impact is evaluated every 1/_GRID_PER_STREAM streams, then the step where the
# bound crosses the budget is cut in _SECTIONS until it is at most _ROOT_XTOL streams long.
_GRID_PER_STREAM = 100
_SECTIONS = 1000
_ROOT_XTOL = 1e-12
# Decimals n* is published with (the FM is the one for n* as published).
_PUBLISHED_DECIMALS = 4
# Decimals n*'s fractional remainder is taken to (fractional_multiplier_for): far below what n* is published with,
# far above the error of subtracting its whole streams.
_REMAINDER_DECIMALS = 12


# A predicted impact below this is rounding, not a prediction: the margin leaves it as it is.
NO_IMPACT = 1e-9


@dataclass(frozen=True)
class ImpactMargin:
    """Room kept for the error of an impact prediction: a predicted impact i > 0 counts as
    min(1, i (1 + relative) + absolute); a prediction of 0 (no congestion seen) stays 0, and so does one
    below NO_IMPACT, which is floating-point rounding (a knee's clean line reads 2.2e-16 at 1.52 streams)."""

    relative: float = 0.0
    absolute: float = 0.0

    def __post_init__(self) -> None:
        for name in ("relative", "absolute"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"impact margin {name} must be a finite number >= 0, got {value!r}")

    def bound(self, impact):
        """The impact the budget is held against (fraction 0-1), for a scalar or an array."""
        i = np.asarray(impact, dtype=float)
        result = np.where(i > NO_IMPACT, np.minimum(1.0, i * (1 + self.relative) + self.absolute), i)
        return result if result.ndim else float(result)


NO_MARGIN = ImpactMargin()
# Calibrated on ns-2 (python -m benchmarks.accuracy, Lu's scenarios 1-6): with the 'auto' model the
# true impact exceeded the prediction by more than this in about one case in ten. It costs
# throughput only where the prediction is close to the budget.
DEFAULT_MARGIN = ImpactMargin(relative=0.15, absolute=0.02)
# The fractional stream for n*'s remainder is held against a margin of its own. Rounding n* down to
# whole streams leaves slack that DEFAULT_MARGIN's calibration counted on; the fractional stream
# spends it (held to DEFAULT_MARGIN, the advice as opened exceeded the budget in 15 % of cases on
# Lu's scenarios 1-6). Chosen on that run (`python -m benchmarks.studies.margin_sweep --fractional`): of the
# margins meeting both advice goals there (0.98 of the best, 9 % over budget), the one whose grid
# neighbours meet them most often; scenarios 7-10 were not looked at to choose it.
DEFAULT_FRACTIONAL_MARGIN = ImpactMargin(relative=0.20, absolute=0.03)


def validate_request(max_impact: float, n_max: int, model: str) -> None:
    """Raise ValueError saying what to fix for an out-of-range budget, cap or model name."""
    if not (isinstance(max_impact, (int, float)) and math.isfinite(max_impact) and 0.0 <= max_impact <= 1.0):
        raise ValueError(f"max_impact must be a fraction between 0 and 1 (e.g. 0.1 for 10 %), got {max_impact!r}")
    if not (isinstance(n_max, int) and 1 <= n_max <= MAX_STREAMS):
        raise ValueError(f"n_max must be an integer between 1 and {MAX_STREAMS}, got {n_max!r}")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of: {', '.join(sorted(MODELS))}")


def search_grid(n_max: float) -> np.ndarray:
    """Stream counts 0, 0.01, ... up to n_max: the grid n* is searched on, with every whole n exactly on it."""
    return np.arange(0, int(math.floor(n_max * _GRID_PER_STREAM + 1e-9)) + 1) / _GRID_PER_STREAM


def held_impact(fitted: ParallelFit, streams):
    """The predicted impact (fraction 0-1) as the advice reads it: never falling as streams are added.

    A fit's own impact may dip (a knee's equal shares hand over to link conservation at its plateau);
    an extra stream cannot give competing flows back what fewer took, so the impact at n is the most
    predicted at any count up to n on the search grid (and at n itself). The advice, the stored curve
    and the schedulers' SQL view all read this, so they agree for every budget.
    """
    n = np.asarray(streams, dtype=float)
    top = float(np.max(n)) if n.size else 0.0
    grid = search_grid(top)
    running = np.maximum.accumulate(np.asarray(fitted.impact(grid), dtype=float))
    below = running[np.clip(np.searchsorted(grid, n, side="right") - 1, 0, len(grid) - 1)]
    result = np.maximum(below, np.asarray(fitted.impact(n), dtype=float))
    return result if result.ndim else float(result)


def largest_parallelism_within(fitted: ParallelFit, max_impact: float, n_max: float,
                               margin: ImpactMargin = NO_MARGIN) -> float:
    """n*: the largest real n in [0, n_max] with margin.bound(held_impact(n)) <= max_impact, stopping at the
    throughput peak.

    The held impact never falls, so this is the binary search of section V.C, done as a grid plus root
    refinement. Beyond the predicted throughput peak extra streams only add impact, so n* never goes past it.
    """
    grid = search_grid(n_max)
    throughput = np.asarray(fitted.throughput_bps(grid[1:]))
    peak = grid[1:][int(np.argmax(throughput >= throughput.max() * (1 - 1e-9)))]
    grid = grid[grid <= peak]
    running = np.maximum.accumulate(np.asarray(fitted.impact(grid), dtype=float))
    within = np.asarray(margin.bound(running)) <= max_impact
    if within.all():
        return float(grid[-1])
    last_ok = int(np.argmin(within)) - 1
    if last_ok < 0:
        return 0.0
    lo, hi, held_below = float(grid[last_ok]), float(grid[last_ok + 1]), running[last_ok]
    # Multisection keeping lo within the budget and hi over it: the answer is never on the far side of the
    # crossing, where a root finder's may land (up to its tolerance past it).
    while hi - lo > _ROOT_XTOL:
        points = np.linspace(lo, hi, _SECTIONS + 1)
        held = np.maximum(held_below, np.asarray(fitted.impact(points), dtype=float))
        within = np.asarray(margin.bound(held)) <= max_impact
        if not within[0] or within[-1]:
            # The bound jumps across the budget inside one grid step (a margin switching on at impact 0).
            break
        first_over = int(np.argmin(within))
        lo, hi = float(points[first_over - 1]), float(points[first_over])
    return lo


def streams_cap(fitted: ParallelFit, n_max: int) -> float:
    """The most streams advice on this fit may reach: ``n_max``, or the highest probe when no congestion was seen
    (the fit says nothing past it)."""
    if fitted.regime == UNCONGESTED and fitted.max_probed_streams < n_max:
        return float(fitted.max_probed_streams)
    return float(n_max)


def advisable_limit(fitted: ParallelFit, n_max: int) -> float:
    """The largest n TameParallelTCP may choose on this fit whatever the budget (see advise()): the throughput
    peak, or the highest probe when no congestion was seen."""
    return largest_parallelism_within(fitted, 1.0, streams_cap(fitted, n_max))


def opened_parallelism(whole: int, n_star_whole: float, n_star_fractional: float) -> float:
    """n* as opened (TCP-equivalent streams): ``whole`` streams (:func:`whole_streams_within`, 0 when not even
    one is) plus the part of n_star_fractional above them, never more than n_star_whole and always below
    whole + 1, the first whole count over the budget.

    Below one stream the fractional stream is the whole transfer; it is kept to at least
    MIN_FRACTION there (FM 400), since opening nothing is not advice and one standard stream is more.
    """
    below_next = math.nextafter(whole + 1.0, 0.0)
    if whole >= 1:
        return float(max(whole, min(n_star_fractional, n_star_whole, below_next)))
    if n_star_whole < MIN_FRACTION:
        return float(min(n_star_whole, below_next))
    return float(min(n_star_whole, below_next, max(n_star_fractional, MIN_FRACTION)))


def published_streams(n: float) -> float:
    """n to the decimals the advice publishes it with, never above n: rounding up could pass the budget."""
    rounded = round(n, _PUBLISHED_DECIMALS)
    return rounded if rounded <= n else round(rounded - 10.0 ** -_PUBLISHED_DECIMALS, _PUBLISHED_DECIMALS)


def fractional_multiplier_for(tcp_equivalent_streams: float, rtt_s: float | None = None,
                              standard_control: str | None = None) -> float | None:
    """FM of one tame stream carrying n*'s remainder r (r = n* when n* < 1), or None when r < MIN_FRACTION
    or it would need FM > MAX_FRACTIONAL_MULTIPLIER.

    The FM comes from the share law measured for tame beside ``standard_control`` streams at ``rtt_s``
    (models.tame_share: s1 x FM^-k; the FM^-1/2 theory for a control not measured)."""
    whole = math.floor(tcp_equivalent_streams)
    # The remainder as n* is written, not as binary floating point leaves it (2.05 - 2 is 0.04999999999999982):
    # otherwise n* = 2.05 opened no fractional stream where 1.05 opened one at FM 400. Subtracting a whole number
    # errs by under 1e-13 for any n* up to MAX_STREAMS.
    remainder = round(tcp_equivalent_streams - whole, _REMAINDER_DECIMALS) if whole >= 1 else tcp_equivalent_streams
    if remainder < MIN_FRACTION:
        return None
    # An RTT no path has (above MAX_RTT_S) is taken as unknown, as `tame cc apply --rtt` would refuse it.
    multiplier = law_for(standard_control).multiplier_for(remainder, usable_rtt_s(rtt_s))
    return round(multiplier, 3) if multiplier <= MAX_FRACTIONAL_MULTIPLIER else None


def calibration_warnings(fractional_multiplier: float | None, standard_control: str | None, rtt_s: float | None,
                         aggregate: bool = False) -> list[str]:
    """Warnings when a tame FM, or the RTT (seconds) it was set for, lies past what its share law
    (models.tame_share: the aggregate form's with ``aggregate``) was measured over."""
    law = aggregate_law_for(standard_control) if aggregate else law_for(standard_control)
    if fractional_multiplier is None or not law.measured:
        return []
    warnings = []
    if fractional_multiplier > law.max_calibrated_fm:
        warnings.append(f"the tame stream's FM {fractional_multiplier:g} is past the FM {law.max_calibrated_fm:g} its "
                        f"share beside {standard_control} was measured to, so it may take more than the share asked "
                        "of it")
    if rtt_s is not None and rtt_s > 0 and math.isfinite(rtt_s) and not law.covers_rtt(rtt_s):
        measured = "/".join(f"{r * 1000:.0f}" for r, _ in law.base_share)
        warnings.append(f"the path's RTT {rtt_s * 1000:.1f} ms is outside the RTTs ({measured} ms) the tame stream's "
                        f"share beside {standard_control} was measured at, so it may take more or less than the share "
                        "asked of it")
    return warnings


WINDOW_FLOOR_REACH = 0.8
"""The aggregate form holds n*'s share while its N streams' window floor (models.tame_share.window_floor_bps) stays
below this fraction of n*'s throughput; past it the floor, not the FM, sets what they take. A heuristic from few
runs (benchmarks/results/): at 18.3 ms, N = 8 (floor 0.78 of the 2 cubic streams' goodput) took 1.02 of it and
N = 16 (1.56) took 1.35 (tame-cc-aggregate-10ms.md); N = 32 at 66.7 ms (0.84) took 1.12 (tame-cc-aggregate.md,
at FM 88.6, past the FM 2.1-58.6 of tame-cc-aggregate-fit.md), while N = 32 at 78.2 ms (0.70) took 1.25 and is kept in the
fit (tame-cc-aggregate-fit.md). The validation runs (tame-cc-aggregate-check.md): N = 8 at 17.1 ms (0.80) took
0.92, N = 16 (1.60) took 1.28, N = 32 at 66.6 ms (0.83) took 1.06."""


def fewest_aggregate_streams(n_star: float) -> int:
    """The fewest streams the aggregate form opens for n* (tame only slows a stream down): ceil(n*), at least 1."""
    return max(1, math.ceil(n_star))


def most_aggregate_streams(rtt_s: float | None, n_star_bps: float) -> int | None:
    """The most tame streams the aggregate form can scale to n*'s throughput ``n_star_bps`` (bits/s) at ``rtt_s``
    (seconds): those whose window floor stays below WINDOW_FLOOR_REACH of it; None when either is unknown."""
    if (rtt_s is None or not rtt_s > 0 or not math.isfinite(rtt_s) or not n_star_bps > 0
            or not math.isfinite(n_star_bps)):
        return None
    return max(0, math.ceil(WINDOW_FLOOR_REACH * n_star_bps / window_floor_bps(1, rtt_s)) - 1)


def window_floor_warning(streams: int, rtt_s: float | None, n_star: float, n_star_bps: float) -> str | None:
    """A warning when ``streams`` tame streams cannot go as low as n*'s throughput ``n_star_bps`` (bits/s) at
    ``rtt_s`` (seconds) asks, saying what can; None when they can or the RTT or throughput is unknown."""
    most = most_aggregate_streams(rtt_s, n_star_bps)
    if most is None or streams <= most:
        return None
    floor = window_floor_bps(streams, rtt_s)
    if most >= fewest_aggregate_streams(n_star):
        instead = f"open at most {most} streams"
    elif most >= 1:
        instead = "open the fractional form (no --streams)"
    else:  # one tame stream's floor alone is past it, and the fractional form opens one too
        instead = (f"not even one stream goes that low at this RTT: any TCP transfer here sends at least "
                   f"{window_floor_bps(1, rtt_s) / n_star_bps:.2f} of n*'s share")
    return (f"{streams} tame streams at RTT {rtt_s * 1000:.1f} ms send at least about {floor / 1e6:.3g} Mbit/s "
            f"({MIN_WINDOW_SEGMENTS} segments of {TYPICAL_MSS_BYTES} bytes a round trip each), "
            f"{floor / n_star_bps:.2f} of the {n_star_bps / 1e6:.3g} Mbit/s n* streams are advised to take, so they "
            f"take more than n*'s share whatever the FM: {instead}")


def advise(
    fitted: ParallelFit,
    max_impact: float,
    n_max: int = DEFAULT_N_MAX,
    rtt_s: float | None = None,
    probes: Sequence[ProbePoint] = (),
    margin: ImpactMargin = DEFAULT_MARGIN,
    fractional_margin: ImpactMargin = DEFAULT_FRACTIONAL_MARGIN,
    standard_control: str | None = None,
) -> Advice:
    """Advice from a fitted curve: n*, the streams to open, their throughput (bits/s) and impact.

    The whole streams are the most whose stored bound (:func:`stored_curve`, the predicted impact raised by
    ``margin``) is within the budget, the schedulers' view's answer; the fractional stream carries the
    remainder of n* held against ``fractional_margin``, below the next whole stream (the advice's
    ``tcp_equivalent_streams`` is what is opened, to 4 decimals rounded down). The impact reported is the
    prediction itself, at the whole streams.
    """
    validate_request(max_impact, n_max, fitted.model)
    warnings = list(fitted.warnings)
    cap = streams_cap(fitted, n_max)
    if cap < n_max:
        warnings.append(f"advice capped at the highest probed level ({cap:g} streams) because no congestion was seen")
    # The whole streams are the schedulers' answer from the curve the store keeps (the current_advice view's
    # test, on the same numbers), so the API and the view agree for every budget, however close to a bound.
    curve = stored_curve(fitted, n_max, margin)
    whole = whole_streams_within(curve, max_impact)
    num_flows = max(1, whole)
    n_star_whole = largest_parallelism_within(fitted, max_impact, cap, margin)
    # Under the same margin the fractional stream's search would repeat the whole streams' one.
    n_star_fractional = (n_star_whole if fractional_margin == margin
                         else largest_parallelism_within(fitted, max_impact, cap, fractional_margin))
    n_star = opened_parallelism(whole, n_star_whole, n_star_fractional)
    impact = curve[num_flows - 1][0].impact
    if impact > max_impact:
        warnings.append(
            f"even one stream is predicted to cost competing flows {impact:.1%}, above the {max_impact:.1%} budget"
        )
    elif float(margin.bound(impact)) > max_impact:
        warnings.append(
            f"one stream is predicted to cost competing flows {impact:.1%}, within the {max_impact:.1%} budget but "
            f"not with the margin kept for the prediction's error (up to {float(margin.bound(impact)):.1%})"
        )
    throughput = float(fitted.throughput_bps(num_flows))
    buffer_bytes = None
    capacity = fitted.capacity_bps
    if rtt_s is not None and rtt_s > 0:
        capacity = capacity if capacity is not None else max(float(fitted.throughput_bps(fitted.max_probed_streams)), throughput)
        buffer_bytes = per_stream_buffer_bytes(capacity, rtt_s, num_flows)
    # The FM is the one for n* as published (4 decimals, rounded down), so `tame cc apply --tcp-equivalent N*`
    # sets it too.
    n_star = published_streams(n_star)
    fractional_multiplier = fractional_multiplier_for(n_star, rtt_s, standard_control)
    warnings += calibration_warnings(fractional_multiplier, standard_control, rtt_s)
    return Advice(
        num_flows=num_flows,
        fractional_multiplier=fractional_multiplier,
        tcp_equivalent_streams=n_star,
        max_nondisruptive_throughput_bps=throughput,
        cross_traffic_impact=impact,
        max_impact=float(max_impact),
        per_stream_buffer_bytes=buffer_bytes,
        model=fitted.model,
        params=dict(fitted.params),
        regime=fitted.regime,
        warnings=warnings,
        probes=[{"streams": p.streams, "throughput_bps": p.throughput_bps} for p in probes],
        congestion_control=standard_control,
    )


def representative_rtt_s(probes: Sequence[ProbePoint], idle_rtt_s: float | None) -> float | None:
    """The RTT for buffer sizing: the idle RTT when measured, else the smallest probe RTT (seconds)."""
    if idle_rtt_s is not None and idle_rtt_s > 0:
        return idle_rtt_s
    rtts = [p.rtt_s for p in probes if p.rtt_s is not None and p.rtt_s > 0]
    return min(rtts) if rtts else None


def tame_parallel_tcp(
    probes: Sequence[ProbePoint],
    max_impact: float,
    n_max: int = DEFAULT_N_MAX,
    model: str = DEFAULT_MODEL,
    idle_rtt_s: float | None = None,
    margin: ImpactMargin = DEFAULT_MARGIN,
    fractional_margin: ImpactMargin = DEFAULT_FRACTIONAL_MARGIN,
    standard_control: str | None = None,
) -> Advice:
    """TameParallelTCP(dest, max_impact) from probe results: fit `model`, then advise (``standard_control``:
    the probes' congestion control, which the fractional stream's FM is calibrated against)."""
    validate_request(max_impact, n_max, model)
    fitted = fit(model, probes)
    return advise(fitted, max_impact, n_max, representative_rtt_s(probes, idle_rtt_s), probes, margin,
                  fractional_margin, standard_control)


def predicted_curve(fitted: ParallelFit, n_max: int = DEFAULT_N_MAX,
                    margin: ImpactMargin = DEFAULT_MARGIN) -> list[CurvePoint]:
    """Predicted throughput (bits/s), held impact (:func:`held_impact`) and its bound (0-1) for n = 1 .. n_max."""
    n = np.arange(1, n_max + 1, dtype=float)
    throughput = np.asarray(fitted.throughput_bps(n))
    impact = np.asarray(held_impact(fitted, n))
    bound = np.asarray(margin.bound(impact))
    return [CurvePoint(int(k), float(t), float(i), float(b)) for k, t, i, b in zip(n, throughput, impact, bound)]


# The version of what stored_curve returns for a fit. Bump it with any change to that (the margin, the held impact,
# the advisable limit, NO_IMPACT): a store opened by this program then writes its current fits' older curves again
# (advisor.curves), so the schedulers' view goes on giving the advice's stream count. tests/advisor/test_curves.py
# pins stored_curve's output to this number, and fails when one changes without the other.
CURVE_VERSION = 1


def stored_curve(fitted: ParallelFit, n_max: int,
                 margin: ImpactMargin = DEFAULT_MARGIN) -> list[tuple[CurvePoint, bool]]:
    """The curve the store keeps of a fit, n = 1 .. n_max, each point with whether the advice may choose it
    (up to :func:`advisable_limit`): what the schedulers' view reads, and what :func:`advise` takes its
    whole streams from (:func:`whole_streams_within`)."""
    limit = advisable_limit(fitted, n_max)
    return [(point, point.streams <= limit + 1e-9) for point in predicted_curve(fitted, n_max, margin)]


def within_budget(impact_bound: float, max_impact: float) -> bool:
    """The schedulers' test of one curve point against a budget (fraction 0-1): the current_advice view's
    ``impact_bound <= B``, exactly, with no tolerance either way."""
    return impact_bound <= max_impact


def whole_streams_within(curve: Sequence[tuple[CurvePoint, bool]], max_impact: float) -> int:
    """The most streams of ``curve`` (:func:`stored_curve`) advisable and :func:`within_budget`, 0 when none:
    the view's ``max(streams) ... WHERE impact_bound <= B`` (its coalesce(..., 1) is the advice's max(1, ...))."""
    return max((point.streams for point, advisable in curve
                if advisable and within_budget(point.impact_bound, max_impact)), default=0)


def point_from_probe(probe: ProbeResult) -> ProbePoint:
    """What the models need from one probe result."""
    return ProbePoint(
        streams=probe.streams,
        throughput_bps=probe.throughput_bps,
        rtt_s=probe.rtt_mean_s,
        retransmits=probe.retransmits,
        duration_s=probe.duration_s,
        throughput_stderr_bps=probe.throughput_stderr_bps,
        sender_bps=probe.sender_bps,
        mss_bytes=probe.mss_bytes,
        stream_bps=tuple(probe.stream_bps),
        stream_retransmits=tuple(probe.stream_retransmits),
    )


def stored_point(probe: Mapping[str, Any]) -> ProbePoint:
    """What the models need from a stored probe (as advisor.store.Store.latest_run_points gives them)."""
    return ProbePoint(streams=probe["streams"], throughput_bps=probe["throughput_bps"], rtt_s=probe["rtt_mean_s"],
                      retransmits=probe["retransmits"], duration_s=probe["duration_s"], mss_bytes=probe["mss_bytes"],
                      stream_bps=probe["stream_bps"], stream_retransmits=probe["stream_retransmits"])


def plan_control(probes: Sequence[ProbeResult], asked: str | None = None) -> str | None:
    """The congestion control a run's probes used, as the driver reported it (``asked`` when none reported one).

    Raises ValueError when the probes report different controls: such a run measured no one control."""
    reported = reported_controls(probes)
    if len(reported) > 1:
        raise ValueError(f"the probes report different congestion controls ({', '.join(sorted(reported))}); "
                         "probe again under one")
    return reported.pop() if reported else asked


def advise_from_plan(
    plan: PlanResult, max_impact: float, n_max: int = DEFAULT_N_MAX, model: str = DEFAULT_MODEL,
    margin: ImpactMargin = DEFAULT_MARGIN, fractional_margin: ImpactMargin = DEFAULT_FRACTIONAL_MARGIN,
    standard_control: str | None = None,
) -> Advice:
    """TameParallelTCP(dest, max_impact) from a finished probe plan, under the control its probes report
    (``standard_control`` when they report none)."""
    return tame_parallel_tcp([point_from_probe(p) for p in plan.probes], max_impact, n_max, model, plan.idle_rtt_s,
                             margin, fractional_margin, plan_control(plan.probes, standard_control))
