"""What would meet a budget the probed congestion control cannot: other controls' measurements, or the probe to run.

Advice can only warn when even one stream of the probed control takes more than the budget (n* < 1:
on a test-bed path a single BBR stream took 84 % of three CUBIC flows' throughput). What would meet
it is said from a measurement, never a guess:

* another control probed on the same destination whose stored fit meets the budget (n* >= 1), named
  with its n*; one probed that does not meet it is named too, so nobody probes it again for nothing;
* a control not probed there yet (of those whose tame share law is calibrated, models.tame_share.LAWS,
  and that this kernel offers when that is known): the probe that would tell;
* the tame control at the probed control's n*, when n* >= MIN_FRACTION: one fractional stream whose
  FM the advice already computed from the share law beside that control.

Pure: the service gives it the advice under each stored control; no I/O here.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterable, Mapping

from advisor.advice import Advice
from advisor.tame import MIN_FRACTION
from models.tame_share import LAWS, law_for
from probes.cc import NAME as TAME


def budget_met(advice: Advice) -> bool:
    """Whether at least one standard stream fits the budget with the margin kept for the prediction's error."""
    return advice.tcp_equivalent_streams >= 1


def alternatives(dest: str, max_impact: float, control: str, advice: Advice,
                 measured: Mapping[str, tuple[Advice, float]],
                 available: Iterable[str] | None = None, src: str | None = None) -> list[dict[str, Any]]:
    """What would meet ``max_impact`` on ``dest`` when ``advice`` (under ``control``) cannot; [] when it does.

    ``measured``: {other control: (its advice for the same budget from its stored fit, probed_at Unix s)}.
    ``available``: the controls a probe here could use (None: not known, every calibrated one is named).
    ``src``: the link's source site, named in the probes to run (None: the service's own, left out).
    Ordered: measured controls that meet the budget (most n* first), the tame control, probes to run,
    measured controls that do not meet it.
    """
    if budget_met(advice):
        return []
    meeting, failing = [], []
    for other, (other_advice, probed_at) in measured.items():
        if other == control:
            continue
        entry = {"congestion_control": other, "kind": "measured", "meets_budget": budget_met(other_advice),
                 "tcp_equivalent_streams": other_advice.tcp_equivalent_streams,
                 "num_flows": other_advice.num_flows,
                 "max_nondisruptive_throughput_bps": other_advice.max_nondisruptive_throughput_bps,
                 "cross_traffic_impact": other_advice.cross_traffic_impact, "probed_at": probed_at}
        (meeting if entry["meets_budget"] else failing).append(entry)
    meeting.sort(key=lambda e: -e["tcp_equivalent_streams"])
    out = meeting
    n_star = advice.tcp_equivalent_streams
    if n_star >= MIN_FRACTION and advice.fractional_multiplier is not None:
        law = law_for(control)
        out.append({
            "congestion_control": TAME, "kind": "tame", "meets_budget": True,
            "tcp_equivalent_streams": n_star, "fractional_multiplier": advice.fractional_multiplier,
            "beside": control, "share_law": "measured" if law.measured else "theory",
            # How to set it up is the advice's own `open` (advisor.opening), one place for that command.
            "note": f"one stream under the tame control at FM {advice.fractional_multiplier:g} carries n* = "
                    f"{n_star:g} of a {control} stream ({law.source}); the advice's open says how",
        })
    offered = None if available is None else set(available)
    for other in sorted(LAWS):
        if other == control or other in measured or (offered is not None and other not in offered):
            continue
        command = ["tame", "advise", dest, "--max-impact", f"{max_impact:g}", "--congestion-control", other,
                   *(["--src", src] if src is not None else [])]
        out.append({
            "congestion_control": other, "kind": "probe", "meets_budget": None,
            "command": shlex.join(command),
            "request": {"method": "POST", "path": "/v1/probes",
                        "body": {"dest": dest, "congestion_control": other, **({"src": src} if src is not None else {})}},
            "note": f"{dest} has not been probed under {other}; this probe says whether it meets the budget",
        })
    return out + failing
