"""What a finished transfer reports (POST /v1/observations, `tame transfer`), checked, and its stored record.

Policy: an observation whose streams were all standard (no stream under the tame congestion control, no
fractional multiplier) feeds the refit as a point (streams, throughput) of the destination's curve. One with
a tame stream is stored with all its detail but does not feed the refit: a tame stream takes a fraction of a
standard stream's share (about FM^-k, models.tame_share), so its transfer is not a point of the curve of n
standard streams that the models fit, and counting it as one would pull the fit down.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from advisor.errors import InvalidRequest
from advisor.limits import (MAX_TAME_FM, MAX_OBSERVATION_DURATION_S, MAX_STREAM_RETRANSMITS, MAX_STREAMS,
                            MAX_THROUGHPUT_BPS, check_congestion_control, check_streams, check_throughput_bps)
from probes.cc import NAME as TAME
from probes.controls import is_control_name


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional_range(value: Any, name: str, low: float, high: float, what: str) -> float | None:
    if value is None:
        return None
    if not _number(value) or not low < value <= high:
        raise InvalidRequest(f"{name} must be {what}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Observation:
    """One finished transfer: its streams and throughput (bits/s), the congestion control its standard streams
    ran (the curve it belongs to; None: the service's default), and optionally each stream's rate (bits/s),
    retransmitted segments and congestion control (same order), the tame fractional multiplier its tame
    streams ran at, the TCP-equivalent streams it opened (n*) and how long it ran (seconds)."""

    streams: int
    throughput_bps: float
    congestion_control: str | None = None
    stream_bps: tuple[float, ...] = ()
    stream_retransmits: tuple[int, ...] = ()
    stream_congestion_controls: tuple[str, ...] = ()
    fractional_multiplier: float | None = None
    tcp_equivalent_streams: float | None = None
    duration_s: float | None = None

    @classmethod
    def checked(cls, streams: Any, throughput_bps: Any, congestion_control: Any = None, stream_bps: Sequence[Any] = (),
                stream_retransmits: Sequence[Any] = (), stream_congestion_controls: Sequence[Any] = (),
                fractional_multiplier: Any = None, tcp_equivalent_streams: Any = None,
                duration_s: Any = None) -> "Observation":
        """The observation from values as a client gave them; InvalidRequest says what to fix."""
        streams = check_streams(streams)
        throughput_bps = check_throughput_bps(throughput_bps)
        if congestion_control is not None:
            congestion_control = check_congestion_control(congestion_control)
        for name, values in (("stream_bps", stream_bps), ("stream_retransmits", stream_retransmits),
                             ("stream_congestion_controls", stream_congestion_controls)):
            if not isinstance(values, (list, tuple)):
                raise InvalidRequest(f"{name} must be a list, one entry per stream")
            if values and len(values) != streams:
                raise InvalidRequest(f"{name} has {len(values)} entries for {streams} streams: give one per "
                                     "stream, or leave it out")
        if not all(_number(v) and 0 <= v < MAX_THROUGHPUT_BPS for v in stream_bps):
            raise InvalidRequest(f"stream_bps must hold each stream's rate in bits/s, from 0 up to "
                                 f"{MAX_THROUGHPUT_BPS:g}")
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STREAM_RETRANSMITS
                   for v in stream_retransmits):
            raise InvalidRequest("stream_retransmits must hold each stream's retransmitted segments, whole numbers >= 0")
        if stream_retransmits and not stream_bps:
            raise InvalidRequest("stream_retransmits needs stream_bps, in the same order")
        if not all(is_control_name(v) for v in stream_congestion_controls):
            raise InvalidRequest("stream_congestion_controls must hold each stream's congestion control name as the "
                                 "kernel spells it (lowercase letters, digits and '_', at most 15), e.g. \"cubic\" "
                                 "or \"tame\"")
        standard = {c for c in stream_congestion_controls if c != TAME}
        if len(standard) > 1 or (congestion_control is not None and standard - {congestion_control}):
            raise InvalidRequest(f"stream_congestion_controls names {', '.join(sorted(standard))} beside tame: a "
                                 f"transfer's standard streams run one control"
                                 + (f", the congestion_control {congestion_control!r}" if congestion_control else "")
                                 + "; report transfers of different controls as separate observations")
        if congestion_control is None and standard:
            congestion_control = standard.pop()  # what its standard streams ran, as iperf3 reported it
        fm = _optional_range(fractional_multiplier, "fractional_multiplier", 1.0 - 1e-12,
                             MAX_TAME_FM, f"a number from 1 to {MAX_TAME_FM:g}")
        tame = TAME in stream_congestion_controls
        if fm is not None and not tame:
            raise InvalidRequest(f"fractional_multiplier is the setting of {TAME} streams: give "
                                 f"stream_congestion_controls naming which streams ran {TAME!r}")
        if tame and fm is None:
            raise InvalidRequest(f"some streams ran {TAME!r}: give the fractional_multiplier they ran at")
        return cls(
            streams=streams, throughput_bps=throughput_bps, congestion_control=congestion_control,
            stream_bps=tuple(float(v) for v in stream_bps), stream_retransmits=tuple(int(v) for v in stream_retransmits),
            stream_congestion_controls=tuple(stream_congestion_controls), fractional_multiplier=fm,
            tcp_equivalent_streams=_optional_range(tcp_equivalent_streams, "tcp_equivalent_streams", 0.0, MAX_STREAMS,
                                                   f"a number of streams above 0, at most {MAX_STREAMS}"),
            duration_s=_optional_range(duration_s, "duration_s", 0.0, MAX_OBSERVATION_DURATION_S,
                                       f"seconds above 0, at most {MAX_OBSERVATION_DURATION_S:g}"),
        )

    @property
    def tame_streams(self) -> int:
        """How many of its streams ran the tame congestion control."""
        return sum(1 for c in self.stream_congestion_controls if c == TAME)

    @property
    def feeds_fit(self) -> bool:
        """Whether it refits the destination's curve: only when every stream was standard (module docstring)."""
        return self.tame_streams == 0 and self.fractional_multiplier is None

    def to_record(self) -> dict[str, Any]:
        """Its columns in the observations table (per-stream lists as JSON arrays, NULL when not given)."""
        def array(values: tuple) -> str | None:
            return json.dumps(list(values)) if values else None

        return {"streams": self.streams, "throughput_bps": self.throughput_bps,
                "congestion_control": self.congestion_control, "stream_bps": array(self.stream_bps), "stream_retransmits": array(self.stream_retransmits),
                "stream_congestion_controls": array(self.stream_congestion_controls),
                "tame_streams": self.tame_streams, "fractional_multiplier": self.fractional_multiplier,
                "tcp_equivalent_streams": self.tcp_equivalent_streams, "duration_s": self.duration_s}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Observation":
        """Inverse of :meth:`to_record` (tame_streams is derived, not read)."""
        def array(text: str | None) -> tuple:
            return tuple(json.loads(text)) if text else ()

        return cls(streams=record["streams"], throughput_bps=record["throughput_bps"],
                   congestion_control=record["congestion_control"],
                   stream_bps=array(record["stream_bps"]), stream_retransmits=array(record["stream_retransmits"]),
                   stream_congestion_controls=array(record["stream_congestion_controls"]),
                   fractional_multiplier=record["fractional_multiplier"],
                   tcp_equivalent_streams=record["tcp_equivalent_streams"], duration_s=record["duration_s"])

    def to_json(self) -> dict[str, Any]:
        """The fields as POST /v1/observations takes them (without dest)."""
        return {"streams": self.streams, "throughput_bps": self.throughput_bps,
                "congestion_control": self.congestion_control, "stream_bps": list(self.stream_bps),
                "stream_retransmits": list(self.stream_retransmits),
                "stream_congestion_controls": list(self.stream_congestion_controls),
                "fractional_multiplier": self.fractional_multiplier,
                "tcp_equivalent_streams": self.tcp_equivalent_streams, "duration_s": self.duration_s}


RECORD_COLUMNS = tuple(Observation(1, 1.0).to_record())
