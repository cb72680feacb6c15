"""The evidence-driven model: per path, the form the probes' own measurements support.

Each probe is first judged by :func:`models.evidence.loss_limited` (RTT, retransmissions and
segment size against the Reno rate, Lu 2004 eq. 1-2), then:

* no probe loss-limited and the per-stream rate held: the path is not congested up to the
  highest probe: n x the per-stream rate, no impact on anyone, held flat beyond that probe
  ("uncongested"). Streams limited by latent losses, a loss rate that did not grow with our
  streams (Hacker et al. 2004, section II), count as not congested too, when the evidence
  spans two probes above the lowest or the next probe finds the link full (:func:`_clean_prefix`);
* the lowest probes not loss-limited, the higher ones loss-limited ("knee"): n x the
  per-stream rate up to the highest clean probe; beyond it the fair share of the loss-limited
  probes (:mod:`models.fair_share`), held at the lowest loss-limited probe's throughput below
  that probe (the link filled somewhere between the two probes, and a full link's aggregate
  does not fall back along the fair-share curve), never more than n x the clean per-stream
  rate. Between the knee and the lowest loss-limited probe a competing flow loses what each
  of our streams lost against the clean rate, 1 - (BW_n / n) / r0, by Lu's equal-share
  assumption (section V.A). From that probe on, the link is full and carries a fixed total,
  the fair share's capacity C, so the cross traffic keeps what we leave of it: it carried
  C - BW_l alone (BW_l our aggregate where the link filled, the plateau) and loses
  (BW_n - BW_l) / (C - BW_l) ("link conservation"; equal shares again when the fair share
  sees no finite capacity above the plateau);
* otherwise, or when the probes carry no such evidence: the fair-share model on all probes
  (least squares with three) for the impact; the throughput follows the fair share through each
  adjacent pair of probes, exact at every probe (:func:`through_probes`). With fewer competing
  flows than the second probe's streams, the impact's M comes from the lowest two probes, which
  span the flows over which few flows on a small buffer hold the link's total flat
  (:func:`few_flows_impact`). When even the lowest probe's loss rate keeps a Reno window under
  :data:`TIMEOUT_REGIME_WINDOW_SEGMENTS` ("timeout regime": a small, crowded bottleneck), flows
  recover from losses by timeouts, DropTail locks some out, and our per-stream rate stops being
  a fair proxy for a competing flow's; the impact is then the mean of the fair share's and Lu's
  eq. 15 with the loss rate and RTT the probes measured (:class:`TimeoutRegimeFit`).

Where the probes show random drops (:func:`random_drops`: the loss counts of the lowest probe of
several streams spread over its streams at least as much as Poisson counts, as a RED queue's do;
a small drop-tail buffer hits each of a few flows about once per congestion event and spreads
them less), the fair share counts each of three or more probes by its loss count, as
:data:`WEIGHTED_MODEL` always does (:func:`models.fair_share.loss_count_weights`).

Throughputs are bits/s, impacts fractions 0-1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from models.evidence import loss_dispersion, loss_limited, loss_rate
from models.fair_share import FairShareFit, fit_fair_share, probe_levels
from models.parallel import CONGESTED, UNCONGESTED, ParallelFit, ProbePoint, _validated, _with_residuals, validated_streams
from models.single_flow import mathis_throughput_bps

MODEL = "auto"
# The same evidence and forms, with the fair share's probes weighted by their loss counts
# (models.fair_share.loss_count_weights): for bottlenecks where every flow sees the same loss rate (RED).
WEIGHTED_MODEL = "auto_weighted"
# A clean (not loss-limited) probe still counts as uncongested only if its per-stream rate is
# within this fraction of the lowest probe's: a rate that falls without losses is a queue
# filling (a buffer large enough to hold the excess), which is congestion too.
PER_STREAM_TOLERANCE = 0.10


# A Reno stream's window at loss rate p is about sqrt(3/2) / sqrt(p) segments (Mathis, Lu eq. 1);
# below this many, three duplicate ACKs rarely follow a loss, so losses end in timeouts. The lowest
# probe's loss rate above (sqrt(3/2) / 8)^2 = 0.023 marks the timeout regime. On ns-2 the lowest
# probe loses 3.5-39 % on scenario 1 and at most 1.1 % on scenarios 2-6 (the accuracy reports' probe tables).
TIMEOUT_REGIME_WINDOW_SEGMENTS = 8.0
TIMEOUT_REGIME_LOSS_RATE = 1.5 / TIMEOUT_REGIME_WINDOW_SEGMENTS ** 2
FLOW_RATE_PREFIX = "flow_rate_bps_at_"
LEVEL_RATE_PREFIX = "probe_bps_at_"
# A fitted fair share that misses a probe by more than this fraction says so in its warnings.
FAIR_SHARE_MISS = 0.10
# How many standard errors of the probes' loss counts a loss rate may rise by and still count as not grown.
LOSS_COUNT_SIGMAS = 2.0
# Loss counts spread over a probe's streams at least as much as Poisson counts (index of dispersion 1)
# say drops are random, so the fair share weights its probes by their loss counts.
RANDOM_DROP_DISPERSION = 1.0


@dataclass(frozen=True)
class TimeoutRegimeFit(FairShareFit):
    """The fair share's throughput; impact from both the fair share and the probes' loss rates and RTTs.

    ``flow_rates_bps`` are the Mathis rates (Lu eq. 1) of the loss rate and RTT measured at each of
    ``flow_rate_streams``, made non-increasing in n: what a competing flow on the same queue gets.
    Between probes they are interpolated linearly; below the lowest probe, extrapolated to n = 0 along
    the first two (never below the lowest probe's); beyond the highest, held. The impact is the mean
    of 1 - rate(n) / rate(0) (Lu eq. 15 with measured p and RTT) and the fair share's n / (n + M):
    on ns-2's scenario 1 the first over-predicts what the competing traffic keeps as often as the
    second under-predicts it.
    """

    record_form = "timeout_regime"

    flow_rate_streams: tuple[float, ...] = ()
    flow_rates_bps: tuple[float, ...] = ()

    def impact(self, streams):
        """Relative throughput loss of each competing flow, 0-1."""
        n = validated_streams(streams)
        xs, rates = np.asarray(self.flow_rate_streams), np.asarray(self.flow_rates_bps)
        at_zero = max(rates[0] + (rates[0] - rates[1]) * xs[0] / (xs[1] - xs[0]), rates[0])
        rate = np.interp(n, np.concatenate([[0.0], xs]), np.concatenate([[at_zero], rates]))
        measured = np.clip(1.0 - rate / at_zero, 0.0, 1.0)
        result = 0.5 * (measured + np.asarray(super().impact(n), dtype=float))
        return result if result.ndim else float(result)


def flow_rates(points: Sequence[ProbePoint]) -> tuple[float, ...] | None:
    """Mathis rate of each probe's loss rate and RTT, bits/s, non-increasing; None if a probe lacks them."""
    rates = []
    for point in points:
        p = loss_rate(point)
        if not p or not point.rtt_s or not point.mss_bytes:
            return None
        rates.append(mathis_throughput_bps(point.mss_bytes, point.rtt_s, p))
    return tuple(float(r) for r in np.minimum.accumulate(rates))


def with_flow_rates(fit: FairShareFit, streams: Sequence[float], rates_bps: Sequence[float],
                    warnings: Sequence[str] = ()) -> TimeoutRegimeFit:
    """``fit`` in the timeout-regime form with the Mathis rates (bits/s) measured at ``streams``, stored in its params."""
    params = {**fit.params, **{f"{FLOW_RATE_PREFIX}{n:g}": float(r) for n, r in zip(streams, rates_bps)}}
    return TimeoutRegimeFit(**{**fit.__dict__, "params": params, "warnings": fit.warnings + tuple(warnings),
                               "flow_rate_streams": tuple(float(n) for n in streams),
                               "flow_rates_bps": tuple(float(r) for r in rates_bps)})


def split_flow_rates(params: Mapping[str, float],
                     prefix: str = FLOW_RATE_PREFIX) -> tuple[dict[str, float], list[float], list[float]]:
    """Stored params split into the rest and the per-level rates stored under ``prefix``: (rest, streams, bits/s), by streams.

    The prefix is :data:`FLOW_RATE_PREFIX` for :func:`with_flow_rates`, :data:`LEVEL_RATE_PREFIX` for
    :func:`with_levels`.
    """
    rest = {k: v for k, v in params.items() if not k.startswith(prefix)}
    measured = sorted((float(k[len(prefix):]), float(v)) for k, v in params.items() if k not in rest)
    return rest, [n for n, _ in measured], [r for _, r in measured]


def with_levels(fit: FairShareFit, streams: Sequence[float], rates_bps: Sequence[float],
                warnings: Sequence[str] = ()) -> FairShareFit:
    """``fit`` with its throughput through the measured (streams, bits/s) levels, stored in its params."""
    params = {**fit.params, **{f"{LEVEL_RATE_PREFIX}{n:g}": float(r) for n, r in zip(streams, rates_bps)}}
    return replace(fit, params=params, warnings=fit.warnings + tuple(warnings),
                   level_streams=tuple(float(n) for n in streams), level_bps=tuple(float(r) for r in rates_bps))


def through_probes(fit: FairShareFit, points: Sequence[ProbePoint]) -> FairShareFit:
    """A congested fair-share ``fit`` of three or more probe levels whose throughput passes through each; others unchanged.

    (Through two levels the fair share is exact already.)

    One curve of two parameters fitted to three probes can miss one of them by a lot (on ns-2 the
    fair share lies 15-24 % above the 10-stream probe of scenario 4's busiest paths); the fair share
    through each adjacent pair keeps its shape between probes and is exact at each, and the
    impact stays the one curve's, which all the probes inform.
    """
    streams, rates = probe_levels(points)
    if fit.regime != CONGESTED or len(streams) < 3:
        return fit
    missed = [(n, r) for n, r in zip(streams, np.asarray(fit.throughput_bps(np.array(streams))) / rates - 1.0)
              if abs(r) > FAIR_SHARE_MISS]
    warnings = [f"one fair-share curve misses the probe at {n:g} stream{'' if n == 1 else 's'} by {r:+.0%}; "
                "throughput follows the fair share between adjacent probes" for n, r in missed]
    return with_levels(fit, streams, rates, warnings)


def few_flows_impact(fit: FairShareFit, points: Sequence[ProbePoint]) -> FairShareFit:
    """A congested fair-share ``fit`` of three or more probe levels with its impact's M taken from the
    lowest two levels when the fit's M is below the second level's streams and the pair's M is the
    smaller; otherwise ``fit`` unchanged.

    Few Reno flows on a small drop-tail buffer keep in step and use a fixed part of the link: the
    link's total holds flat as flows are added, up to a number of flows well above a handful, and
    only then rises (ns-2: s2 and s3 with 5 cross flows hold 72-77 Mbit/s of 100 from 6 to 28 flows
    in all, then reach 84 at 36; ``python -m benchmarks.studies.explain_path 2:5``). A flat total gives every
    flow an equal share of it, the fair share with M = m, which the lowest two probes (1 and 10
    streams: 6 to 15 flows there) measure; the top probe reads the later rise as more competing
    flows and one curve through all three puts M above m (6.3 for m = 5), under-predicting the
    impact. When the three probes' M is below the second probe's streams, the pair covers the
    flat part, and its M, when smaller, is what the impact rests on; a pair's M above the three
    probes' is not that rise (the total did not hold flat) and is left alone. With more competing
    flows the pair's M is too noisy to use (1 % in the ratio of its two rates moves M = 30 by about
    5 %), and the three probes' stays. Throughput is unchanged (it follows the probes).
    """
    streams, rates = probe_levels(points)
    if fit.regime != CONGESTED or len(streams) < 3 or fit.competing_flows >= streams[1]:
        return fit
    pair = fit_fair_share([ProbePoint(n, r) for n, r in zip(streams[:2], rates[:2])])
    if pair.regime != CONGESTED or pair.competing_flows >= fit.competing_flows:
        return fit
    warning = (f"few competing flows (M = {fit.competing_flows:.1f} from all probes, under {streams[1]:g}): "
               f"the impact takes M = {pair.competing_flows:.1f} from the probes at {streams[0]:g} and "
               f"{streams[1]:g} streams")
    return replace(fit, competing_flows=pair.competing_flows,
                   params={**fit.params, "competing_flows": pair.competing_flows},
                   warnings=fit.warnings + (warning,))


def in_timeout_regime(points: Sequence[ProbePoint]) -> bool:
    """True if the lowest probe (points sorted by streams) lost more than :data:`TIMEOUT_REGIME_LOSS_RATE`."""
    low = loss_rate(points[0])
    return low is not None and low > TIMEOUT_REGIME_LOSS_RATE


def timeout_regime_fit(fit: FairShareFit, points: Sequence[ProbePoint]) -> FairShareFit:
    """``fit`` as a TimeoutRegimeFit when the probes (sorted by streams) show the timeout regime, else unchanged."""
    if fit.regime == UNCONGESTED or not in_timeout_regime(points):
        return fit
    low = loss_rate(points[0])
    rates = flow_rates(points)
    if rates is None:
        return fit
    streams = [float(p.streams) for p in points]
    return with_flow_rates(fit, streams, rates, (f"losses of {low:.0%} at {streams[0]:g} stream(s): flows recover "
                                                 "by timeouts; impact also from the measured loss rates and RTTs",))


@dataclass(frozen=True)
class KneeFit(ParallelFit):
    """n x ``per_stream_bps`` up to ``linear_until_streams``; beyond, ``congested`` capped by that line.

    Below ``plateau_until_streams`` (the lowest loss-limited probe) the congested part is held at
    its value there; a fit stored without it has no plateau.
    """

    record_form = "knee"

    per_stream_bps: float = 0.0
    linear_until_streams: float = 0.0
    congested: FairShareFit | None = field(default=None)
    plateau_until_streams: float = 0.0

    def throughput_bps(self, streams):
        """Aggregate throughput, bits/s: the clean line, then the congested fit (held flat below its lowest probe) under it."""
        n = validated_streams(streams)
        line = n * self.per_stream_bps
        beyond = np.asarray(self.congested.throughput_bps(np.maximum(n, max(self.plateau_until_streams, 1e-9))),
                            dtype=float)
        result = np.where(n <= self.linear_until_streams, line, np.minimum(line, beyond))
        return result if result.ndim else float(result)

    def impact(self, streams):
        """Relative loss of each competing flow, 0-1 (module docstring).

        0 on the clean line; then 1 - (BW_n / n) / per_stream_bps (equal shares); from the lowest
        loss-limited probe on, (BW_n - BW_l) / (C - BW_l) (link conservation) when the congested
        fit's capacity C is finite and above the plateau BW_l.
        """
        n = validated_streams(streams)
        safe = np.maximum(n, 1e-9)
        throughput = np.asarray(self.throughput_bps(safe), dtype=float)
        equal_share = np.clip(1.0 - throughput / safe / self.per_stream_bps, 0.0, 1.0)
        result = np.where(n <= self.linear_until_streams, 0.0, equal_share)
        if self.plateau_until_streams:
            capacity = self.congested.link_capacity_bps
            plateau = float(self.throughput_bps(self.plateau_until_streams))
            if np.isfinite(capacity) and capacity > plateau:
                conserved = np.clip((throughput - plateau) / (capacity - plateau), 0.0, 1.0)
                result = np.where(n >= self.plateau_until_streams, conserved, result)
        return result if result.ndim else float(result)

    @property
    def capacity_bps(self) -> float | None:
        return self.congested.capacity_bps


def knee_params(fit: KneeFit) -> dict[str, float]:
    """The stored parameters of a knee fit: its own two plus its congested part's, prefixed."""
    return {"per_stream_bps": fit.per_stream_bps, "linear_until_streams": fit.linear_until_streams,
            "plateau_until_streams": fit.plateau_until_streams,
            **{f"congested_{k}": float(v) for k, v in fit.congested.params.items()}}


def _losses_did_not_grow(point: ProbePoint, lowest: ProbePoint) -> bool:
    """True if ``point`` ran more streams than ``lowest`` at no higher a loss rate than per-stream rates
    within :data:`PER_STREAM_TOLERANCE` allow (Mathis: rate ~ 1/sqrt(p), so p at most (1 - tolerance)^-2 x),
    give or take :data:`LOSS_COUNT_SIGMAS` standard errors of the two loss counts (Poisson: a count k
    is known to 1/sqrt(k); a one-stream probe of 30 s at 12 Mbit/s and 0.08 % loses only about 26 segments).

    Only below the timeout regime (:data:`TIMEOUT_REGIME_LOSS_RATE`): heavier losses end in timeouts
    and their measured rate saturates (ns-2 scenario 1 loses 33-46 % at 1 to 31 streams while each
    stream's rate falls fivefold), so it cannot show growth.
    """
    p, p_lowest = loss_rate(point), loss_rate(lowest)
    if (p is None or p_lowest is None or not 0 < p_lowest <= TIMEOUT_REGIME_LOSS_RATE
            or point.streams <= lowest.streams):
        return False
    counting_error = math.sqrt(1 / lowest.retransmits + 1 / max(point.retransmits, 1))
    return p <= p_lowest / (1 - PER_STREAM_TOLERANCE) ** 2 * math.exp(LOSS_COUNT_SIGMAS * counting_error)


def _clean_prefix(points: Sequence[ProbePoint]) -> tuple[int, bool]:
    """How many of the lowest probes (sorted by streams) ran uncongested, and whether latent losses made them so.

    A probe ran uncongested when its per-stream rate held (within :data:`PER_STREAM_TOLERANCE` of
    the lowest probe's) and its streams were either not loss-limited or loss-limited by latent
    losses: a loss rate that did not grow with our streams (:func:`_losses_did_not_grow`). Losses
    that do not grow with the load are not congestion; streams limited by them "do not affect the
    latent packet loss rate of the other streams, as long as the bandwidth capacity of the network
    bottleneck is not reached" (Hacker et al. 2004, section II, the first scenario). The lowest
    probe alone cannot tell latent from congestion losses; the next probe's loss rate does.

    A probe with latent losses after which the next probe found the link full (an aggregate within
    the tolerance of its own) need not have held its per-stream rate: the link, not other flows,
    capped it (the test bed's random-loss path: ten streams at 95.5 Mbit/s, 9.55 each, one 10.6).

    One probe above the lowest is weak evidence of latent losses: a lowest probe whose one stream
    drew a small share of a congested link also drew a high loss rate (Mathis), so both tests pass
    by chance (ns-2 scenario 6, 30 cross flows). The reading is kept when a second probe above the
    lowest shows latent losses too, or when the next probe found the link full, which is what
    latent losses predict and a fair share among competing flows does not (its aggregate keeps
    growing while our per-stream rate falls).
    """
    lowest = points[0]
    first_rate = lowest.throughput_bps / lowest.streams

    def holds(point: ProbePoint) -> bool:
        return point.throughput_bps / point.streams >= (1 - PER_STREAM_TOLERANCE) * first_rate

    def link_full_after(i: int) -> bool:
        return (i + 1 < len(points)
                and points[i + 1].throughput_bps <= (1 + PER_STREAM_TOLERANCE) * points[i].throughput_bps)

    def latent(i: int) -> bool:
        point = points[i]
        return (loss_limited(point) is True and _losses_did_not_grow(point, lowest)
                and (holds(point) or link_full_after(i)))

    def prefix(flags: list[bool]) -> int:
        return next((i for i, ok in enumerate(flags) if not ok), len(flags))

    clean = [holds(p) and loss_limited(p) is False for p in points]
    is_latent = [latent(i) for i in range(len(points))]
    with_latent = [ok or lat for ok, lat in zip(clean, is_latent)]
    if len(points) > 1 and loss_limited(lowest) is True and is_latent[1]:
        with_latent[0] = True
    count = prefix(with_latent)
    latent_above = sum(is_latent[1:count])
    if latent_above and (latent_above >= 2 or link_full_after(count - 1)):
        return count, True
    return prefix(clean), False


def _per_stream_rate(points: Sequence[ProbePoint]) -> float:
    """Geometric mean of the probes' per-stream rates, bits/s."""
    return float(np.exp(np.mean([np.log(p.throughput_bps / p.streams) for p in points])))


def random_drops(points: Sequence[ProbePoint]) -> tuple[bool, str | None]:
    """Whether the probes (sorted by streams) show random drops, and why, for the fit's warnings.

    Read at the lowest probe of two or more streams (:func:`models.evidence.loss_dispersion`): its
    streams' loss counts spread at least as much as Poisson counts (:data:`RANDOM_DROP_DISPERSION`).
    A higher probe is not asked: with many flows even a drop-tail queue's losses fall out of step.
    Never in the timeout regime, where lock-out scatters a drop-tail queue's losses too. None for
    the reason when the probes cannot tell.
    """
    if in_timeout_regime(points):
        return False, None
    shared = next((p for p in points if p.streams >= 2), None)
    index = loss_dispersion(shared) if shared is not None else None
    if index is None:
        return False, None
    random = bool(index >= RANDOM_DROP_DISPERSION)
    return random, (f"losses spread over the {shared.streams:g} streams "
                    f"{'like random drops' if random else 'more evenly than random drops'} "
                    f"(index of dispersion {index:.2f})")


def fit_auto(points: Sequence[ProbePoint], weighted: bool | None = None) -> ParallelFit:
    """The evidence-driven fit (see the module docstring) from two or more probes.

    ``weighted``: the fair share of three or more probes counts each by its loss count
    (:func:`models.fair_share.fit_fair_share`); True: always, and the fit is named
    :data:`WEIGHTED_MODEL`; None: when the probes show random drops (:func:`random_drops`);
    False: never.
    """
    model = WEIGHTED_MODEL if weighted else MODEL
    _validated(points, 2, model)
    ordered = sorted(points, key=lambda p: p.streams)
    evidence = ()
    if weighted is None:
        weighted, why_weighted = random_drops(ordered)
        if weighted:
            evidence = (f"{why_weighted}: the fair share counts each probe by its loss count where three or more "
                        "probes all lost segments",)
    # Residuals follow probe_streams, which is sorted.
    n, bw = (np.array([getattr(p, k) for p in ordered], dtype=float) for k in ("streams", "throughput_bps"))
    clean, latent = _clean_prefix(ordered)
    why = ("their losses did not grow with the streams: latent losses, not congestion" if latent
           else "no loss-limited streams")
    if clean == len(ordered):
        return _with_residuals(_uncongested(ordered, why, model), n, bw)
    if clean == 0:
        shared = few_flows_impact(through_probes(replace(fit_fair_share(ordered, weighted), model=model), ordered),
                                  ordered)
        shared = timeout_regime_fit(shared, ordered)
        return _with_residuals(replace(shared, warnings=evidence + shared.warnings), n, bw)
    loss_side = ordered[clean:]
    anchor = ordered[clean - 1]
    congested = fit_fair_share(loss_side if len(loss_side) >= 2 else [anchor, *loss_side], weighted)
    rate = _per_stream_rate(ordered[:clean])
    knee = KneeFit(model=model, params={}, regime=CONGESTED, probe_streams=tuple(float(p.streams) for p in ordered),
                   warnings=evidence + congested.warnings + (
                       f"not congested up to {anchor.streams:g} streams ({why}); "
                       f"congested from {loss_side[0].streams:g}",),
                   per_stream_bps=rate, linear_until_streams=float(anchor.streams), congested=congested,
                   plateau_until_streams=float(loss_side[0].streams))
    return _with_residuals(replace(knee, params=knee_params(knee)), n, bw)


def fit_auto_weighted(points: Sequence[ProbePoint]) -> ParallelFit:
    """:func:`fit_auto` with the fair share's probes weighted by their loss counts (:data:`WEIGHTED_MODEL`)."""
    return fit_auto(points, weighted=True)


def _uncongested(points: Sequence[ProbePoint], why: str, model: str = MODEL) -> FairShareFit:
    """n x the geometric-mean per-stream rate up to the highest probe, flat beyond, impact 0 (``why``: for the warning)."""
    rate = _per_stream_rate(points)
    high = float(points[-1].streams)
    warning = (f"the path is not congested up to {high:g} streams ({why}); "
               f"predictions are held flat beyond {high:g} streams")
    return FairShareFit(model=model, params={"per_stream_bps": rate}, regime=UNCONGESTED,
                        probe_streams=tuple(float(p.streams) for p in points), warnings=(warning,),
                        per_stream_bps=rate, flat_beyond_streams=high)


# The adaptive probe never goes beyond this multiple of the highest probe so far: a probe is
# itself a transfer that takes from the other traffic.
ADAPTIVE_REACH = 4


def next_level(points: Sequence[ProbePoint], n_max: int) -> int | None:
    """The third probe's stream count: where the two-probe fit is least certain, or None.

    A curve through two probes is exact at their levels and its error grows with the distance
    it extrapolates, so the least certain place within the advice's range is its top: n_max,
    or ADAPTIVE_REACH x the highest probe if that is lower. When no probe so far was congested,
    that is also where congestion would first show. None when the probes already reach it.
    """
    if not points:
        return None
    highest = max(p.streams for p in points)
    level = int(min(n_max, ADAPTIVE_REACH * highest))
    return level if level > highest else None
