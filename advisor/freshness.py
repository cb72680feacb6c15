"""When a link's advice is stale, and when the link is due for a probe: the one rule every decision path reads
(GET /v1/advice's re-probe, /v1/paths, a site's registration, `tame agent`)."""

from __future__ import annotations

from dataclasses import dataclass

# Why a link is due for a probe (GET /v1/paths' "reprobe_due").
STALE = "stale"
PROBE_MAX_AGE = "probe_max_age"
# TAME_PROBE_MAX_AGE_S when unset, in TTLs: a day at the default TTL of an hour.
PROBE_MAX_AGE_TTLS = 24
# TAME_PROBE_REUSE_MAX_AGE_S when unset, in TTLs: a refresh due at one TTL re-uses the probing before's adaptive probe.
REUSE_MAX_AGE_TTLS = 2


def evidence_at(probed_at: float, fitted_at: float, observations_used: int) -> float:
    """Unix seconds of the newest evidence behind a fit, which its freshness is judged by: its probes' time, or for a
    fit refitted on finished transfers (``observations_used``) the newest transfer's, its ``fitted_at``."""
    return max(probed_at, fitted_at) if observations_used else probed_at


@dataclass(frozen=True)
class Freshness:
    """``ttl_s``: advice whose newest evidence (FitRow.evidence_at: probes, or transfers that refitted the fit) is
    older is stale. ``probe_max_age_s``: a link whose newest probe is older is due for one even while transfers
    keep its advice fresh, since transfers see only the stream counts they used and never their impact on cross
    traffic, which only a probe measures."""

    ttl_s: float
    probe_max_age_s: float

    @staticmethod
    def age_s(evidence_at: float, now: float) -> float:
        """Seconds since the newest evidence (advice's ``age_s``), never below 0 (a clock behind the store's)."""
        return max(0.0, now - evidence_at)

    def stale(self, evidence_at: float, now: float) -> bool:
        """True when the newest evidence is older than the TTL (the advice is served ``stale: true``)."""
        return now - evidence_at > self.ttl_s

    def due(self, evidence_at: float, probed_at: float, now: float) -> str | None:
        """Why a link is due for a probe, STALE or PROBE_MAX_AGE, or None when it is not: its advice is stale, or its
        newest probe (``probed_at``, Unix seconds) is older than ``probe_max_age_s``. Advice due for the second
        reason alone is still fresh: it is served as it is while the probe is queued."""
        if self.stale(evidence_at, now):
            return STALE
        if now - probed_at > self.probe_max_age_s:
            return PROBE_MAX_AGE
        return None
