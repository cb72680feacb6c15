"""Options and parsing shared by the sub-commands that take probe numbers or print advice."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Any

from advisor.advice import Advice
from advisor.cli import UsageError
from advisor.errors import ConfigError, InvalidRequest
from advisor.opening import opening_text
from advisor.limits import MAX_STREAMS, check_site, check_streams, check_throughput_bps, parse_number
from advisor.tame import (DEFAULT_FRACTIONAL_MARGIN, DEFAULT_MARGIN, DEFAULT_MODEL, DEFAULT_N_MAX, NO_MARGIN,
                          ImpactMargin, fewest_aggregate_streams)
from models.parallel import ProbePoint
from models.registry import MODELS, MIN_LEVELS

_SUFFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_PROBE = re.compile(r"^\s*([^:]+):\s*([-+0-9.eE]+)\s*([kKMGT]?)(?:bps|bit/s|b/s)?\s*$")


def parse_probe(text: str) -> ProbePoint:
    """`N:BPS` (e.g. `10:88e6` or `10:88M`) into a ProbePoint; UsageError says what is wrong."""
    match = _PROBE.match(text)
    if not match:
        raise UsageError(f"--probe {text!r}: write STREAMS:BITS_PER_SECOND, e.g. --probe 10:88e6 or --probe 10:88M")
    streams_text, rate_text, suffix = match.groups()
    try:
        streams = parse_number(streams_text, int)
    except ValueError:
        raise UsageError(f"--probe {text!r}: the stream count {streams_text!r} must be a whole number >= 1") from None
    try:
        rate = parse_number(rate_text) * _SUFFIX[suffix]
    except ValueError:
        raise UsageError(f"--probe {text!r}: the throughput {rate_text!r} is not a number") from None
    try:
        # The limits the API holds probes and observations to.
        return ProbePoint(streams=check_streams(streams, "the stream count"),
                          throughput_bps=check_throughput_bps(rate, "the throughput"))
    except InvalidRequest as exc:
        raise UsageError(f"--probe {text!r}: {exc}") from None


def fraction(text: str) -> float:
    try:
        value = parse_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a fraction such as 0.1 for 10 %") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"{text} is outside [0, 1]; give a fraction such as 0.1 for 10 %")
    return value


def site_name(text: str) -> str:
    """A --src value: a site's name (advisor.limits.check_site)."""
    try:
        return check_site(text, "--src")
    except InvalidRequest as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_src_option(parser: argparse.ArgumentParser, what: str) -> None:
    """--src SITE: the source site of the link (default: the service's own site, TAME_SITE, else local)."""
    parser.add_argument("--src", type=site_name, metavar="SITE", default=None,
                        help=f"the site {what} (default: the service's own: TAME_SITE, else local)")


def whole_number(low: int, high: int, what: str = "a whole number", why: str = ""):
    """An argparse type: a whole number in low..high (``what`` names it, ``why`` explains the bound)."""
    def parse(text: str) -> int:
        try:
            value = parse_number(text, int)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}{why}")
        return value
    return parse


def number_between(low: float, high: float, what: str = "a number"):
    """An argparse type: a finite number in low..high, written in ASCII (``what`` names it)."""
    def parse(text: str) -> float:
        try:
            value = parse_number(text)
        except ValueError:
            value = math.nan  # 'inf', 'nan', '1_0': parse_number refuses them all
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} from {low:g} to {high:g}")
        return value
    return parse


positive_int = whole_number(1, MAX_STREAMS)
port_number = whole_number(1, 65535, "a port number (give 1-65535)", why=" (a TCP port: give 1-65535)")


def service_url(url: str | None, source: str = "TAME_URL") -> str | None:
    """The advice service's URL ``url`` from ``source`` (TAME_URL or a flag), checked before any work starts; None
    when unset or empty (no service). UsageError says what to give, the URL's password shown as ***."""
    if not url:
        return None
    from api.client import InvalidServiceURL, check_url  # the CLI is where the layers are wired together

    try:
        check_url(url, source)
    except InvalidServiceURL as exc:
        raise UsageError(str(exc)) from None
    return url


def service_token(read_first: bool = False) -> str | None:
    """The token to send the advice service: TAME_TOKEN, else TAME_READ_TOKEN (the other way round with
    ``read_first``), None when neither is set. Both are checked, before any work starts (advisor.settings.service_token):
    UsageError names the variable, never the token."""
    from advisor.settings import service_token as checked  # deferred: settings reads the probe and site layers

    names = ("TAME_READ_TOKEN", "TAME_TOKEN") if read_first else ("TAME_TOKEN", "TAME_READ_TOKEN")
    try:
        tokens = [checked(os.environ, name) for name in names]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return next((token for token in tokens if token), None)


def hold_defaults(parser: argparse.ArgumentParser, options: dict[str, str]) -> None:
    """Leave the ``options`` (attribute: flag) None unless given, so that a command can refuse those it cannot honour
    (refuse_given); put_back_defaults gives the others their defaults."""
    held = {name: parser.get_default(name) for name in options}
    parser.set_defaults(held_defaults=held, **dict.fromkeys(options))


def refuse_given(args: argparse.Namespace, options: dict[str, str], why: str) -> None:
    """UsageError naming those of the ``options`` (held by hold_defaults) that were given, and ``why`` they cannot be."""
    given = [flag for name, flag in options.items() if getattr(args, name) is not None]
    if given:
        raise UsageError(f"{', '.join(given)}: {why}; leave {'it' if len(given) == 1 else 'them'} out")


def put_back_defaults(args: argparse.Namespace) -> None:
    """The options hold_defaults held, not given, get their defaults."""
    for name, value in args.held_defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def add_probe_options(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--probe", action="append", default=[], metavar="N:BPS", required=required,
        help="a probe result: streams and measured throughput in bits/s (repeat; at least two levels)",
    )
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULT_MODEL,
                        help=f"throughput model (default: {DEFAULT_MODEL}; lu = Lu et al. partial order-2, eq. 5-11)")
    parser.add_argument("--n-max", type=positive_int, default=DEFAULT_N_MAX, help="largest stream count considered")
    add_margin_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_margin_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-margin", action="store_true",
        help="hold the budget to the bare predicted impact (Lu's rule) instead of the prediction raised by "
             # argparse %-formats help strings: the percent sign is doubled.
             f"{DEFAULT_MARGIN.relative:.0%}% + {DEFAULT_MARGIN.absolute:g} for its error (whole streams) and by "
             f"{DEFAULT_FRACTIONAL_MARGIN.relative:.0%}% + {DEFAULT_FRACTIONAL_MARGIN.absolute:g} (the fractional stream)",
    )


def margin_from_args(args: argparse.Namespace) -> ImpactMargin:
    """The margin whole streams are held against: none with --no-margin, else the service's."""
    return NO_MARGIN if args.no_margin else DEFAULT_MARGIN


def fractional_margin_from_args(args: argparse.Namespace) -> ImpactMargin:
    """The margin the fractional stream is held against: none with --no-margin, else the service's."""
    return NO_MARGIN if args.no_margin else DEFAULT_FRACTIONAL_MARGIN


# Example probes for a message, one more level for each a model needs (every model fits these).
_EXAMPLE_PROBES = ("1:40e6", "10:90e6", "40:95e6")


def probes_from_args(args: argparse.Namespace) -> list[ProbePoint]:
    points = [parse_probe(text) for text in args.probe]
    needed = MIN_LEVELS[args.model]
    levels = sorted({p.streams for p in points})
    if len(levels) < needed:
        example = " ".join(f"--probe {p}" for p in _EXAMPLE_PROBES[:max(needed, 2)])
        raise UsageError(
            f"model {args.model} needs probes at {needed} different stream counts; got "
            f"{', '.join(str(n) for n in levels) or 'none'} (e.g. {example})"
        )
    return points


def print_json(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2)
    sys.stdout.write("\n")


def format_bps(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.2f} {unit}"
    return f"{bps:.0f} bit/s"


def streams_text(count: int) -> str:
    return f"{count} stream{'' if count == 1 else 's'}"


def n_star_text(n_star: float) -> str:
    """n* for people as the advice gives it (to 4 decimals, rounded down: advisor.tame.published_streams), never
    rounded up: 2.9961 shown as 3.00 read as three whole streams, and copied into `tame cc apply --tcp-equivalent`
    it passes the budget."""
    return f"{n_star:.4f}".rstrip("0").rstrip(".")


# Why advice GET /v1/advice (or the service in this process) serves is stale: its TTL, or its cache lagging the store.
STALE_ADVICE = ("its evidence is older than the service's TAME_TTL_S and a probe is queued, or the service could not "
                "read its store in time; ask again later")


def link_text(src: str | None, dest: str, age_s: float | None = None, stale: bool | None = None,
              why: str = STALE_ADVICE, what: str = "advice") -> str:
    """A link for people, as every command that shows advice names it: ``SRC -> DEST`` (DEST alone without a source),
    then, when the age is known, ``(advice N s old, fresh)`` or ``(advice N s old, STALE: why)``; ``age_s`` and
    ``stale`` are GET /v1/advice's (the newest evidence's age, advisor.freshness), ``what`` names what is that old."""
    link = f"{src} -> {dest}" if src else dest
    if age_s is None:
        return link
    return f"{link} ({what} {age_s:.0f} s old, {f'STALE: {why}' if stale else 'fresh'})"


def opened_text(advice: Advice, with_fm: bool = True) -> str:
    """How many sockets to open, once and plainly: the standard and fractional streams that carry n*
    (Advice.opened_streams), and what to open instead when the tool cannot open a fractional stream.
    ``with_fm`` False leaves the fractional stream's FM to the "how to open" line, which gives the FM the
    tame control is set to."""
    standard, fm = advice.opened_streams()
    if fm is None and advice.tcp_equivalent_streams < 1:
        # Below the smallest fractional stream: nothing fits the budget (tame transfer opens nothing).
        return f"none within the budget (n* {n_star_text(advice.tcp_equivalent_streams)}); 1 standard stream is the fewest, over it"
    if fm is None:
        return f"open {streams_text(standard)}" + (" (standard)" if standard == 1 else " (all standard)")
    fractional = f"1 fractional at FM {fm:g}" if with_fm else "1 fractional"
    opened = f"{standard} standard + {fractional}" if standard else fractional
    return (f"open {streams_text(standard + 1)}: {opened}, or {advice.num_flows} standard "
            f"stream{'' if advice.num_flows == 1 else 's'} if your tool cannot open a fractional stream")


def alternative_text(alternative: dict[str, Any]) -> str:
    """One line for an entry of Advice.alternatives (advisor/alternatives.py)."""
    name, kind = alternative["congestion_control"], alternative["kind"]
    if kind == "measured":
        verdict = "meets the budget" if alternative["meets_budget"] else "does not meet it either"
        return (f"{name} (measured here) {verdict}: n* {n_star_text(alternative['tcp_equivalent_streams'])}, "
                f"{streams_text(alternative['num_flows'])}, {format_bps(alternative['max_nondisruptive_throughput_bps'])}")
    if kind == "tame":
        return alternative["note"]
    return f"{name} not measured here; probe it: {alternative['command']}"


def print_advice(advice: Advice, opening: dict[str, Any] | None = None) -> None:
    """The advice in a few lines; ``opening`` (advisor.opening.how_to_open) adds how to open it."""
    lines = [
        f"streams:                    {opened_text(advice, with_fm=opening is None)}",
        f"predicted throughput:       {format_bps(advice.max_nondisruptive_throughput_bps)} "
        f"on {advice.num_flows} standard stream{'' if advice.num_flows == 1 else 's'}",
        f"predicted impact on others: {advice.cross_traffic_impact:.1%} (budget {advice.max_impact:.1%})",
        f"TCP-equivalent streams n*:  {n_star_text(advice.tcp_equivalent_streams)}",
    ]
    if advice.per_stream_buffer_bytes is not None:
        lines.append(f"per-stream socket buffer:   {advice.per_stream_buffer_bytes} bytes")
    if advice.congestion_control:
        lines.append(f"congestion control:         {advice.congestion_control}")
    lines.append(f"model:                      {advice.model} ({advice.regime}) "
                 + " ".join(f"{k}={v:.4g}" for k, v in advice.params.items()))
    if opening is not None:
        lines.append(f"how to open:                {opening_text(opening)}")
        most = opening.get("max_aggregate_streams")
        if most is not None and most >= fewest_aggregate_streams(opening["tcp_equivalent_streams"]):
            lines.append(f"N streams of one control:   at most {most} scale to n* (tame transfer --streams N)")
        elif most is not None:  # fewer than the aggregate form opens
            lines.append("N streams of one control:   none scale to n* at this RTT (their 2-segment windows "
                         "alone send more)")
    lines += [f"warning: {w}" for w in advice.warnings]
    lines += [f"instead: {alternative_text(a)}" for a in advice.alternatives]
    print("\n".join(lines))
