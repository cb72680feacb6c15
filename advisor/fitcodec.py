"""A fitted model to and from what the store keeps: the fit's own record, and plain columns to show.

A fit is read back from its record (models.parallel.ParallelFit.to_record, which names its form and
version). Fits stored before records were kept have only the plain values (model, params, regime,
probe levels); :func:`fit_from_legacy_record` rebuilds those by the params they hold.

The advice for any budget is recomputed from the rebuilt fit rather than searched in the
stored curve, so n*, the fractional multiplier and the throughput are exact (the stored curve
has integer n only); the curve is kept for plotting and for schedulers reading plain SQL.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from models.auto import LEVEL_RATE_PREFIX, KneeFit, split_flow_rates, with_flow_rates, with_levels
from models.auto import MODEL as AUTO, WEIGHTED_MODEL as AUTO_WEIGHTED
from models.fair_share import FairShareFit
from models.parallel import UNCONGESTED, ParallelFit, PolynomialFit, fit_from_record

# The exponent of n that each named coefficient multiplies in p'(n), per model (Lu eq. 5, 12, 13).
_EXPONENTS = {
    "lu": {"a_prime": 2, "b_prime": 0},
    "linear": {"a_prime": 1, "b_prime": 0},
    "full2": {"a_prime": 2, "b_prime": 1, "c_prime": 0},
}


def fit_to_record(fitted: ParallelFit) -> dict[str, Any]:
    """What the store keeps of a fit, which :func:`fit_from_stored` turns back into it: the plain columns
    (model, params, regime, probe levels, warnings) and ``fit``, the fit's own record."""
    return {
        "model": fitted.model,
        "params": {k: float(v) for k, v in fitted.params.items()},
        "regime": fitted.regime,
        "probe_streams": [float(x) for x in fitted.probe_streams],
        "warnings": list(fitted.warnings),
        "fit": fitted.to_record(),
    }


def fit_from_stored(model: str, params: Mapping[str, float], regime: str, probe_streams: Sequence[float],
                    warnings: Sequence[str] = (), fit: Mapping[str, Any] | None = None) -> ParallelFit:
    """The stored fit: from its record when it has one, else from the plain values (stored before records)."""
    if fit is not None:
        return fit_from_record(fit)
    return fit_from_legacy_record(model, params, regime, probe_streams, warnings)


def fit_from_legacy_record(model: str, params: Mapping[str, float], regime: str,
                           probe_streams: Sequence[float], warnings: Sequence[str] = ()) -> ParallelFit:
    """Rebuild a fit stored before records from the params it holds; ValueError for an unknown model or parameter."""
    if model == "fair_share":
        return _fair_share_from_record(model, params, regime, probe_streams, warnings)
    if model in (AUTO, AUTO_WEIGHTED):
        return _auto_from_record(model, params, regime, probe_streams, warnings)
    if model == "yildirim" and set(params) == {"a_prime", "b_prime", "exponent"}:
        # Yildirim's a' n^c + b' keeps its fitted exponent c among the parameters.
        streams = tuple(float(x) for x in probe_streams)
        return PolynomialFit(model=model, params={k: float(v) for k, v in params.items()}, regime=regime,
                             probe_streams=streams, warnings=tuple(warnings),
                             exponents=(float(params["exponent"]), 0),
                             coefficients=(float(params["a_prime"]), float(params["b_prime"])))
    if model in ("full2", "yildirim") and set(params) == {"a_prime", "b_prime"}:
        # full2 and yildirim fall back to Lu's partial order-2 form when their own fit is not physical.
        table = _EXPONENTS["lu"]
    elif model in _EXPONENTS:
        table = _EXPONENTS[model]
    else:
        raise ValueError(f"stored fit has unknown model {model!r}")
    names = sorted(params, key=lambda name: -table[name]) if set(params) <= set(table) else None
    if not names:
        raise ValueError(f"stored fit of model {model!r} has unexpected parameters {sorted(params)}")
    streams = tuple(float(x) for x in probe_streams)
    return PolynomialFit(
        model=model,
        params={name: float(params[name]) for name in names},
        regime=regime,
        probe_streams=streams,
        warnings=tuple(warnings),
        exponents=tuple(table[name] for name in names),
        coefficients=tuple(float(params[name]) for name in names),
        flat_beyond_streams=max(streams) if regime == UNCONGESTED else None,
    )


def _auto_from_record(model: str, params: Mapping[str, float], regime: str, probe_streams: Sequence[float],
                      warnings: Sequence[str]) -> ParallelFit:
    # The evidence-driven model stores one of fair_share's forms, or a knee: its own two
    # parameters plus its congested part's, prefixed "congested_" (models.auto.knee_params).
    # A fair share through its probes also stores each probe level's throughput, and in the timeout
    # regime the Mathis rate measured at each probe; the record's params keep both.
    rest, level_streams, level_bps = split_flow_rates(params, LEVEL_RATE_PREFIX)
    if level_streams:
        base = _auto_from_record(model, rest, regime, probe_streams, warnings)
        if not isinstance(base, FairShareFit) or len(level_streams) < 2:
            raise ValueError(f"stored fit of model {model!r} has unexpected parameters {sorted(params)}")
        return replace(with_levels(base, level_streams, level_bps), params={k: float(v) for k, v in params.items()})
    rest, rate_streams, rates_bps = split_flow_rates(params)
    if rate_streams:
        # The timeout regime: fair_share's form plus the Mathis rate measured at each probe.
        base = _fair_share_from_record(model, rest, regime, probe_streams, warnings)
        return with_flow_rates(base, rate_streams, rates_bps)
    if "linear_until_streams" not in params:
        return _fair_share_from_record(model, params, regime, probe_streams, warnings)
    prefix = "congested_"
    congested = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
    own = {k for k in params if not k.startswith(prefix)}
    # Knees stored before the plateau (models.auto) lack plateau_until_streams: no plateau.
    if own - {"plateau_until_streams"} != {"per_stream_bps", "linear_until_streams"} or not congested:
        raise ValueError(f"stored fit of model {model!r} has unexpected parameters {sorted(params)}")
    return KneeFit(model=model, params={k: float(v) for k, v in params.items()}, regime=regime,
                   probe_streams=tuple(float(x) for x in probe_streams), warnings=tuple(warnings),
                   per_stream_bps=float(params["per_stream_bps"]),
                   linear_until_streams=float(params["linear_until_streams"]),
                   plateau_until_streams=float(params.get("plateau_until_streams", 0.0)),
                   congested=_fair_share_from_record(model, congested, regime, probe_streams, ()))


def _fair_share_from_record(model: str, params: Mapping[str, float], regime: str, probe_streams: Sequence[float],
                            warnings: Sequence[str]) -> FairShareFit:
    streams = tuple(float(x) for x in probe_streams)
    common = dict(model=model, params={k: float(v) for k, v in params.items()}, regime=regime,
                  probe_streams=streams, warnings=tuple(warnings))
    if set(params) == {"per_stream_bps"}:
        return FairShareFit(per_stream_bps=float(params["per_stream_bps"]), flat_beyond_streams=max(streams), **common)
    if set(params) == {"capacity_bps", "competing_flows"}:
        return FairShareFit(link_capacity_bps=float(params["capacity_bps"]),
                            competing_flows=float(params["competing_flows"]), **common)
    raise ValueError(f"stored fit of model {model!r} has unexpected parameters {sorted(params)}")
