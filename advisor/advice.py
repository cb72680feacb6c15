"""The advice the service gives and the curve it is read from, with their JSON shapes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CurvePoint:
    """Predicted aggregate throughput (bits/s) and cross-traffic impact (fraction 0-1) at `streams`.

    ``impact_bound`` is the impact raised by the advisor's margin for the prediction's error
    (:class:`advisor.tame.ImpactMargin`): what the advice compares with the budget.
    """

    streams: int
    throughput_bps: float
    impact: float
    impact_bound: float


@dataclass(frozen=True)
class Advice:
    """TameParallelTCP's answer for one path and impact budget (field names are the JSON names).

    ``tcp_equivalent_streams`` is n* as opened, in standard streams: ``num_flows`` = max(1, floor(n))
    standard streams for the largest n whose predicted impact, raised by the margin for the prediction's
    error, is within ``max_impact``, plus the remainder up to the largest n within it under the fractional
    stream's wider margin (:func:`advisor.tame.advise`). ``fractional_multiplier`` is the FM of one extra
    fractional stream carrying that remainder (None when it is negligible or would need FM > 1000); below
    one TCP-equivalent stream (n* < 1) that fractional stream is the whole transfer (:meth:`opened_streams`).
    ``congestion_control`` is the control the streams are counted in (the probes'); ``alternatives`` what
    would meet a budget it cannot (:func:`advisor.alternatives.alternatives`).
    """

    num_flows: int
    fractional_multiplier: float | None
    tcp_equivalent_streams: float
    max_nondisruptive_throughput_bps: float
    cross_traffic_impact: float
    max_impact: float
    per_stream_buffer_bytes: int | None
    model: str
    params: dict[str, float]
    regime: str
    warnings: list[str] = field(default_factory=list)
    probes: list[dict[str, float]] = field(default_factory=list)
    congestion_control: str | None = None
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def tcp_equivalent_throughput_bps(self) -> float:
        """What n* standard streams are predicted to take (bits/s): the whole streams' prediction, per stream."""
        return self.max_nondisruptive_throughput_bps * self.tcp_equivalent_streams / self.num_flows

    def opened_streams(self) -> tuple[int, float | None]:
        """What the transfer opens to carry n*: (standard streams, FM of one more fractional stream or None).

        n* = 2.4 opens 2 standard streams and one fractional stream carrying 0.4; n* = 0.45 opens the
        fractional stream alone, since one standard stream is already more than n* (its FM: advisor.tame).
        """
        if self.fractional_multiplier is None:
            return self.num_flows, None
        return (0 if self.tcp_equivalent_streams < 1 else self.num_flows), self.fractional_multiplier


def curve_to_json(model: str, params: dict[str, float], curve: list[CurvePoint]) -> dict[str, Any]:
    """The `tame curve --json` / API curve object."""
    return {"model": model, "params": dict(params), "curve": [asdict(point) for point in curve]}
