"""How to open the advice: the one place that turns n* into sockets, a congestion control and its setting.

The HTTP advice (GET /v1/advice, batch items), `tame advise` and `tame fit` all carry the ``open`` object
built here, and `tame transfer` opens what it says; the schedulers' SQL view is about whole streams and is
not affected.
"""

from __future__ import annotations

import shlex
from typing import Any

from advisor.advice import Advice
from advisor.destinations import parse_destination
from advisor.limits import usable_rtt_s
from advisor.tame import MIN_FRACTION, fractional_multiplier_for, most_aggregate_streams
from probes import cc

# Stands in for the address in the command line when the destination is a host name: the tame control's
# setting is kept per address, and which address a name should mean is the user's to say.
ADDRESS_PLACEHOLDER = "ADDRESS"


def how_to_open(advice: Advice, dest: str | None, rtt_s: float | None = None) -> dict[str, Any]:
    """The ``open`` object of an advice for ``dest`` (HOST[:PORT]; None when the advice is for no destination,
    as `tame fit`'s).

    ``form`` is "fractional" when the advice opens a fractional stream: ``standard_streams`` (floor(n*), 0
    below one stream) of the standard control plus one stream (``tame_streams`` 1) under the tame congestion
    control (``congestion_control`` "tame") at ``fractional_multiplier``, which ``command`` (`tame cc apply`,
    run as root on the sending host) sets for the destination's address. When n* is below one stream and
    no fractional stream is offered (below advisor.tame.MIN_FRACTION), ``form`` is "none": nothing opened
    keeps the budget, and ``note`` says so. Otherwise ``form`` is "standard": ``standard_streams`` plain
    streams, and the tame fields and ``command`` are null. ``max_aggregate_streams`` is the most streams a tool
    that opens N streams of one control can scale to n*'s share (`tame transfer --streams N`; advisor.tame.
    most_aggregate_streams: past it their 2-segment windows alone send more), null when the RTT is unknown.

    The FM is the share law's for tame beside streams of the advice's congestion control (the probes') at
    ``rtt_s`` (models.tame_share; the FM^-1/2 theory when the control is None or not measured). When the
    control is known the command names it and sets exactly this FM; when it is not, the command leaves it out
    and `tame cc apply` calibrates against the sending host's default control, the one that host's standard
    streams run, so the FM it sets may differ from the theory's here.
    """
    rtt = usable_rtt_s(rtt_s)  # as advisor.tame.fractional_multiplier_for reads it, so the FMs agree
    standard_control = advice.congestion_control
    standard, advised_fm = advice.opened_streams()
    n_star = float(advice.tcp_equivalent_streams)
    fm = fractional_multiplier_for(n_star, rtt, standard_control) if advised_fm is not None else None
    host = parse_destination(dest).host if dest is not None else None
    try:
        address = str(cc.canonical_address(host)) if host is not None else None
    except ValueError:
        address = None
    opening: dict[str, Any] = {
        "form": "standard", "standard_streams": advice.num_flows, "tame_streams": 0,
        "congestion_control": None, "standard_control": standard_control, "fractional_multiplier": None,
        "tcp_equivalent_streams": n_star, "rtt_s": rtt, "address": address, "command": None, "note": None,
        "max_aggregate_streams": most_aggregate_streams(rtt, advice.tcp_equivalent_throughput_bps()),
    }
    if fm is None:
        if n_star < 1:  # below one stream, and no tame stream can be made small enough
            opening.update(form="none", standard_streams=0, note=(
                f"n* {n_star:g} is below the smallest fractional stream ({MIN_FRACTION:g}): even one tame stream is "
                "predicted to cost competing flows more than the budget; raise the budget, or see alternatives"))
        return opening
    argv = ["tame", "cc", "apply", address or ADDRESS_PLACEHOLDER, "--tcp-equivalent", repr(n_star)]
    if rtt is not None:
        argv += ["--rtt", repr(rtt)]
    if standard_control is not None:
        argv += ["--standard-control", standard_control]
    opening.update(form="fractional", standard_streams=standard, tame_streams=1, congestion_control=cc.NAME,
                   fractional_multiplier=fm, command=shlex.join(argv))
    if address is None:
        whose = f"resolve {host} and give the address" if host is not None else "give the destination's address"
        opening["note"] = f"the setting is kept per address: {whose} in place of {ADDRESS_PLACEHOLDER}"
    return opening


def opening_text(opening: dict[str, Any]) -> str:
    """One line for people: what to run and open, from :func:`how_to_open`'s object."""
    if opening["form"] == "none":
        return f"nothing: {opening['note']}"
    if opening["form"] != "fractional":
        n = opening["standard_streams"]
        return f"{n} standard stream{'' if n == 1 else 's'}; no tame stream needed"
    standard = opening["standard_streams"]
    what = (f"{standard} standard + 1 tame stream" if standard else "1 tame stream alone")
    line = f"{what} at FM {opening['fractional_multiplier']:g}: as root, {opening['command']}"
    return line + (f" ({opening['note']})" if opening["note"] else "")
