"""Parallel TCP throughput and cross-traffic impact vs the number of streams (Lu et al. 2004).

All models here describe p'_n = p_n RTT_n^2 / (C^2 MSS^2) (Lu eq. 6) as a polynomial in the
number of streams n, so that the aggregate throughput is BW_n = n / sqrt(p'_n) (Lu eq. 7) and the
relative throughput change of every competing flow is 1 - sqrt(p'_{n1} / p'_{n2}) (Lu eq. 16).
Throughputs are bits/s; p' is in (s/bit)^2.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np

from models.errors import FitError

CONGESTED = "congested"
UNCONGESTED = "uncongested"
SATURATED = "saturated"

# A model's p'(0) below this fraction of the smallest observed p' is not trusted (the fit
# says competing flows would run almost loss-free without us, which the probes cannot show).
_P0_FLOOR_FRACTION = 0.01
# Probe levels closer than this ratio are too sensitive to noise (Lu section IV.B: "(1, 2)").
MIN_LEVEL_RATIO = 2.0


def validated_streams(streams, flat_beyond_streams: float | None = None) -> np.ndarray:
    """Stream counts as floats (>= 0, finite), capped at ``flat_beyond_streams`` when given."""
    n = np.asarray_chkfinite(streams, dtype=float)
    if np.any(n < 0):
        raise ValueError("streams must be >= 0")
    return n if flat_beyond_streams is None else np.minimum(n, flat_beyond_streams)


@dataclass(frozen=True)
class ProbePoint:
    """One probe as the models see it: streams n and the receiver throughput in bits/s.

    Optional evidence: mean RTT (seconds), retransmitted segments, probe duration (seconds),
    the throughput's standard error (bits/s), the sender-side rate (bits/s), the segment
    size (bytes), and each stream's rate (bits/s) and retransmitted segments, in the same order.
    """

    streams: float
    throughput_bps: float
    rtt_s: float | None = None
    retransmits: int | None = None
    duration_s: float | None = None
    throughput_stderr_bps: float | None = None
    sender_bps: float | None = None
    mss_bytes: float | None = None
    stream_bps: tuple[float, ...] = ()
    stream_retransmits: tuple[int, ...] = ()


# The version of the stored record of a fit (ParallelFit.to_record); a new one when a form's fields change.
RECORD_VERSION = 1
# Each fit class by the form its record names (filled as the classes are defined).
_RECORD_FORMS: dict[str, type["ParallelFit"]] = {}


@dataclass(frozen=True)
class ParallelFit:
    """A fitted throughput/impact curve. Subclasses implement the two curves.

    ``regime`` is "congested" (normal), "uncongested" (no congestion seen up to the highest
    probe: impact 0, throughput held flat beyond it) or "saturated" (more streams did not
    raise throughput: the path was already full at the lowest probe).

    A fit is stored as its record (:meth:`to_record`, read back by :func:`fit_from_record`): the form its
    class names in ``record_form``, the record's version and the class's own fields, typed.
    """

    record_form = "parallel"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("record_form") is None:
            raise TypeError(f"{cls.__name__} must name its record_form")
        _RECORD_FORMS[cls.record_form] = cls

    def to_record(self) -> dict[str, Any]:
        """This fit as stored: ``form``, ``version`` and every field (JSON-able; a fit inside, as its record)."""
        return {"form": self.record_form, "version": RECORD_VERSION,
                **{f.name: _to_plain(getattr(self, f.name)) for f in fields(self)}}

    model: str
    params: Mapping[str, float]
    regime: str
    probe_streams: tuple[float, ...]
    warnings: tuple[str, ...] = ()
    residuals: tuple[float, ...] = ()

    def throughput_bps(self, streams):
        """Predicted aggregate throughput of `streams` parallel streams, bits/s."""
        raise NotImplementedError

    def impact(self, streams):
        """Predicted relative throughput loss of each competing flow vs no transfer (fraction 0-1)."""
        raise NotImplementedError

    @property
    def capacity_bps(self) -> float | None:
        """The model's throughput asymptote as n grows, bits/s (None if unbounded)."""
        return None

    @property
    def max_probed_streams(self) -> float:
        return max(self.probe_streams)


def _to_plain(value):
    if isinstance(value, ParallelFit):
        return value.to_record()
    if isinstance(value, Mapping):
        return {str(k): float(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    return value


def _from_plain(name: str, value):
    if isinstance(value, dict) and "form" in value:
        return fit_from_record(value)
    if isinstance(value, list):
        return tuple(_from_plain(name, v) for v in value)
    return value


def fit_from_record(record: Mapping[str, Any]) -> ParallelFit:
    """The fit a record of :meth:`ParallelFit.to_record` describes; ValueError saying what is wrong with it."""
    form, version = record.get("form"), record.get("version")
    cls = _RECORD_FORMS.get(form)
    if cls is None:
        raise ValueError(f"stored fit record has unknown form {form!r}; known: {', '.join(sorted(_RECORD_FORMS))}")
    if version != RECORD_VERSION:
        raise ValueError(f"stored {form} fit record has version {version!r}; this program reads {RECORD_VERSION}")
    names = {f.name for f in fields(cls)}
    unknown = set(record) - names - {"form", "version"}
    if unknown:
        raise ValueError(f"stored {form} fit record has unknown fields {sorted(unknown)}")
    values = {name: _from_plain(name, record[name]) for name in names if name in record}
    values["params"] = dict(record.get("params", {}))
    return cls(**values)


@dataclass(frozen=True)
class PolynomialFit(ParallelFit):
    """p'(n) = sum_k coefficients[k] * n ** exponents[k] (Lu eq. 5, 12 or 13)."""

    record_form = "polynomial"

    exponents: tuple[int, ...] = ()
    coefficients: tuple[float, ...] = ()
    flat_beyond_streams: float | None = field(default=None)

    def p_prime(self, streams):
        """p'(n) of Lu eq. 6, (s/bit)^2."""
        n = np.asarray(streams, dtype=float)
        return sum(c * n**e for c, e in zip(self.coefficients, self.exponents))

    def throughput_bps(self, streams):
        n = validated_streams(streams, self.flat_beyond_streams)
        result = n / np.sqrt(self.p_prime(n))
        return result if result.ndim else float(result)

    def impact(self, streams):
        n = validated_streams(streams)
        ratio = self.p_prime(0.0) / self.p_prime(n)
        result = np.clip(1.0 - np.sqrt(np.clip(ratio, 0.0, None)), 0.0, 1.0)
        return result if result.ndim else float(result)

    @property
    def capacity_bps(self) -> float | None:
        top = max(self.exponents)
        lead = self.coefficients[self.exponents.index(top)]
        if top == 2 and lead > 0:
            return float(1.0 / np.sqrt(lead))
        if self.flat_beyond_streams is not None:
            return float(self.throughput_bps(self.flat_beyond_streams))
        return None


def relative_throughput_change(p_prime_before, p_prime_after):
    """Relative throughput change of each competing flow going from n1 to n2 streams; Lu eq. (15)-(16).

    relc = 1 - RTT_n1 sqrt(p_n1) / (RTT_n2 sqrt(p_n2)) = 1 - sqrt(p'_n1 / p'_n2).

    Parameters
    ----------
    p_prime_before, p_prime_after : p' at n1 and n2, (s/bit)^2, > 0

    Returns
    -------
    float or ndarray, fraction (positive = competing flows lose throughput)
    """
    before = np.asarray_chkfinite(p_prime_before, dtype=float)
    after = np.asarray_chkfinite(p_prime_after, dtype=float)
    if np.any(before <= 0) or np.any(after <= 0):
        raise ValueError("p' values must be > 0")
    result = 1.0 - np.sqrt(before / after)
    return result if result.ndim else float(result)


def lu_partial_order2_params(n1: float, bw1_bps: float, n2: float, bw2_bps: float) -> tuple[float, float]:
    """a', b' of p'_n = a' n^2 + b' from two probes, in closed form; Lu eq. (10)-(11).

    a' = (n2^2/BW2^2 - n1^2/BW1^2) / (n2^2 - n1^2),  b' = n1^2/BW1^2 - a' n1^2.

    Parameters
    ----------
    n1, n2 : probe parallelism levels (distinct, > 0)
    bw1_bps, bw2_bps : measured aggregate throughputs, bits/s (> 0)

    Returns
    -------
    (a', b') in (s/bit)^2; either may be <= 0 for degenerate probes.
    """
    for name, value in (("n1", n1), ("n2", n2), ("bw1_bps", bw1_bps), ("bw2_bps", bw2_bps)):
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    if n1 == n2:
        raise FitError("the two probes must use different numbers of streams")
    y1, y2 = (n1 / bw1_bps) ** 2, (n2 / bw2_bps) ** 2
    a = (y2 - y1) / (n2**2 - n1**2)
    return a, y1 - a * n1**2


def _validated(points: Sequence[ProbePoint], parameters: int, model: str) -> tuple[np.ndarray, np.ndarray]:
    if not points:
        raise FitError(f"model {model!r} needs probes; none were given")
    n = np.array([p.streams for p in points], dtype=float)
    bw = np.array([p.throughput_bps for p in points], dtype=float)
    if not (np.all(np.isfinite(n)) and np.all(n > 0)):
        raise ValueError("every probe needs streams > 0")
    if not (np.all(np.isfinite(bw)) and np.all(bw > 0)):
        raise ValueError("every probe needs a throughput > 0 bits/s")
    levels = np.unique(n)
    if levels.size < parameters:
        raise FitError(
            f"model {model!r} needs probes at {parameters} different stream counts, got {levels.size} "
            f"({', '.join(f'{x:g}' for x in levels)}); add a probe at another level"
        )
    return n, bw


def _weighted_design(n: np.ndarray, y: np.ndarray, exponents: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    # Residuals relative to each observed p' (≈ twice the relative throughput error), with
    # columns normalised so NNLS is well conditioned whatever the units.
    design = np.stack([n**e for e in exponents], axis=1) / y[:, None]
    scale = np.linalg.norm(design, axis=0)
    return design / scale, scale


def _least_squares(n, y, exponents, nonnegative: bool) -> np.ndarray:
    design, scale = _weighted_design(n, y, exponents)
    rhs = np.ones_like(y)
    if nonnegative:
        from scipy.optimize import nnls  # here, not at the top: its 0.3 s import would slow every CLI command

        solution, _ = nnls(design, rhs)
    else:
        solution, *_ = np.linalg.lstsq(design, rhs, rcond=None)
    return solution / scale


def _level_warnings(n: np.ndarray) -> list[str]:
    levels = np.unique(n)
    if levels.max() / levels.min() < MIN_LEVEL_RATIO:
        return [
            f"probe levels {levels.min():g} and {levels.max():g} are too close together to separate the "
            f"model's terms (keep a ratio of at least {MIN_LEVEL_RATIO:g}, e.g. 1 and 10)"
        ]
    return []


def _fit_two_term(points: Sequence[ProbePoint], exponent: int, model: str) -> PolynomialFit:
    """p' = a' n^exponent + b', regime-aware (exponent 2: Lu eq. 5; exponent 1: Lu eq. 12)."""
    n, bw = _validated(points, 2, model)
    y = (n / bw) ** 2
    exponents = (exponent, 0)
    free_a, free_b = _least_squares(n, y, exponents, nonnegative=False)
    warnings = _level_warnings(n)
    flat_beyond = None
    low, high = n.min(), n.max()
    if free_a <= 0:
        regime = UNCONGESTED
        a, b = 0.0, float(np.exp(np.mean(np.log(y))))
        flat_beyond = float(high)
        warnings.append(
            f"no congestion seen up to {high:g} streams (throughput grew at least in proportion to the "
            f"streams): predictions are held flat beyond {high:g} streams; probe at a higher level to see further"
        )
    elif free_b <= 0:
        regime = SATURATED
        a, b = (float(v) for v in _least_squares(n, y, exponents, nonnegative=True))
        a = max(a, float(np.min(y / n**exponent)) * (1 - _P0_FLOOR_FRACTION))
        b = max(b, _P0_FLOOR_FRACTION * float(np.min(y)))
        warnings.append(
            f"more streams did not raise throughput ({high:g} streams were no faster than {low:g}): the path "
            f"is already full at {low:g} streams, so extra streams only take from other traffic"
        )
    else:
        regime = CONGESTED
        a, b = float(free_a), float(free_b)
    fit = PolynomialFit(
        model=model,
        params={"a_prime": a, "b_prime": b},
        regime=regime,
        probe_streams=tuple(float(x) for x in n),
        warnings=tuple(warnings),
        exponents=exponents,
        coefficients=(a, b),
        flat_beyond_streams=flat_beyond,
    )
    return _with_residuals(fit, n, bw)


def _with_residuals(fit: ParallelFit, n: np.ndarray, bw: np.ndarray) -> ParallelFit:
    """``fit`` with its relative error at each probe (streams n, measured bits/s bw)."""
    residuals = tuple(float(r) for r in np.asarray(fit.throughput_bps(n)) / bw - 1.0)
    return replace(fit, residuals=residuals)


def fit_lu(points: Sequence[ProbePoint]) -> PolynomialFit:
    """Lu's partial order-2 model p'_n = a' n^2 + b'; Lu eq. (5)-(11).

    Two probes give a', b' exactly (eq. 10-11); more probes give a least-squares fit on the
    relative error of p'. Degenerate probes are flagged in ``regime`` and ``warnings``.
    """
    return _fit_two_term(points, 2, "lu")


def fit_linear(points: Sequence[ProbePoint]) -> PolynomialFit:
    """Lu's linear alternative p'_n = a' n + b'; Lu eq. (12)."""
    return _fit_two_term(points, 1, "linear")


def fit_full_order2(points: Sequence[ProbePoint]) -> PolynomialFit:
    """Lu's full order-2 model p'_n = a' n^2 + b' n + c' from three or more probes; Lu eq. (13).

    If the fitted p' is not positive and non-decreasing over 0 .. 4x the highest probe (the fit
    is not physical), falls back to the partial order-2 fit and says so in ``warnings``.
    """
    n, bw = _validated(points, 3, "full2")
    y = (n / bw) ** 2
    exponents = (2, 1, 0)
    coefficients = tuple(float(v) for v in _least_squares(n, y, exponents, nonnegative=False))
    grid = np.linspace(0.0, 4.0 * n.max(), 400)
    p_grid = sum(c * grid**e for c, e in zip(coefficients, exponents))
    if np.any(p_grid <= 0) or np.any(np.diff(p_grid) < -1e-12 * np.abs(p_grid[:-1])):
        lu = fit_lu(points)
        return PolynomialFit(
            **{
                **lu.__dict__,
                "model": "full2",
                "warnings": lu.warnings
                + ("the full order-2 fit is not physical for these probes (p' falls or turns negative); "
                   "used the partial order-2 fit instead",),
            }
        )
    fit = PolynomialFit(
        model="full2",
        params=dict(zip(("a_prime", "b_prime", "c_prime"), coefficients)),
        regime=CONGESTED,
        probe_streams=tuple(float(x) for x in n),
        warnings=tuple(_level_warnings(n)),
        exponents=exponents,
        coefficients=coefficients,
    )
    return _with_residuals(fit, n, bw)
