"""Request and response bodies of the HTTP API (the advice fields are advisor.advice.Advice's)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Header
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from advisor import limits
from advisor.errors import InvalidRequest
from advisor.jobs import MAX_LOOKUP_WAITS
from advisor.sites import BUDGET_HOLD_S
from advisor.terminal import visible
from probes.controls import CONTROL_NAME, MAX_CONTROL_NAME
from probes.iperf_parse import RAW_MAX_CHARS


def _checked(check, before: bool = False):
    """A pydantic validator running one of advisor.limits' checks (the one place a rule is written), its message
    as the 422's detail; ``before``: on the value as sent, before pydantic converts it (true would be 1.0)."""
    def validate(value: Any) -> Any:
        try:
            return check(value)
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None

    return (BeforeValidator if before else AfterValidator)(validate)


# max_length here only bounds what is parsed; check_congestion_control says what a name may be.
Control = Annotated[str, Field(max_length=64, description="TCP congestion control, e.g. cubic, bbr or reno "
                                                           "(default: the service's, its host's default)"),
                    _checked(limits.check_congestion_control)]
# A link's source site; max_length here only bounds what is parsed, check_site says what a name may be.
Site = Annotated[str, Field(max_length=256, description="the source site of the link (default: the service's own "
                                                        "site, TAME_SITE)"),
                 _checked(limits.check_site)]

# What the write routes' src says about a site's token (api/boundary.py).
SITE_TOKEN_SRC = "; a site's token (TAME_SITE_TOKENS) must give its own site here"

# An agent's name; max_length here only bounds what is parsed, check_owner says what a name may be.
Owner = Annotated[str, Field(max_length=limits.MAX_OWNER_LENGTH), _checked(limits.check_owner)]

# Free text an agent sends about a probe (its error), stored and shown to others: a terminal, a scheduler's screen.
# Taken as sent and stored on one line, each character a terminal would act on (a newline, ESC, a bidi override) as a
# visible escape (advisor/terminal.py), not refused: it is the agent's report of a failure, its text often a foreign
# program's or a remote peer's, and refusing it would leave the probe held until its lease ran out, unexplained.
# Up to AGENT_TEXT_CHARS characters as sent, and as stored: escapes make up to ten characters of one, and what they
# make past it is cut (a job's error is bounded whatever characters it holds).
AGENT_TEXT_CHARS = 1000
AgentText = Annotated[str, Field(min_length=1, max_length=AGENT_TEXT_CHARS),
                      AfterValidator(lambda text: visible(text)[:AGENT_TEXT_CHARS])]

Dest = Field(min_length=1, max_length=limits.MAX_DEST_LENGTH, description="HOST or HOST:PORT (default port 5201), IPv6 as [ADDR]:PORT")


class OpenOut(BaseModel):
    """advisor.opening.how_to_open: the sockets the advice opens and, for a fractional stream, its setting."""

    form: Literal["fractional", "standard", "none"] = Field(
        description="fractional: standard_streams plus one tame stream; standard: standard_streams alone; none: "
                    "n* is below the smallest fractional stream, nothing opened keeps the budget (see note)")
    standard_streams: int
    tame_streams: int
    congestion_control: str | None = Field(description="\"tame\" for the fractional stream; null without one")
    standard_control: str | None = Field(description="the control the FM is calibrated against; null: theory here, "
                                                     "the sending host's default for the command")
    fractional_multiplier: float | None
    tcp_equivalent_streams: float
    rtt_s: float | None = Field(description="the fit's RTT the FM is computed for, seconds")
    address: str | None = Field(description="the address the setting is kept for; null for a host name")
    command: str | None = Field(description="run as root on the sending host to set the FM (tame cc apply); "
                                            "null when no tame stream is needed")
    note: str | None
    max_aggregate_streams: int | None = Field(
        description="the most streams of one control (tame transfer --streams N, tame cc apply --streams N) that can "
                    "be scaled to n*'s share at this RTT: more streams' 2-segment windows alone send more than n* "
                    "takes; the aggregate form needs N >= ceil(n*), so below that only the fractional form holds; "
                    "null when the RTT is unknown")


class AdviceOut(BaseModel):
    """Advice.to_json() plus where and when it comes from."""

    model_config = ConfigDict(extra="allow")
    src: str = Field(description="the link's source site")
    dest: str
    num_flows: int = Field(description="standard streams, max(1, floor(n*)); when n* < 1 and fractional_multiplier "
                                       "is set, the transfer opens that fractional stream alone instead")
    fractional_multiplier: float | None = Field(
        description="FM >= 1 of one fractional stream carrying n*'s remainder (its window grows by 1/FM segments a "
                    "round trip, about 1/sqrt(FM) of a stream: Hacker et al. 2004), opened beside floor(n*) standard "
                    "streams, or alone when n* < 1; null when the remainder is negligible")
    tcp_equivalent_streams: float = Field(description="n*: the parallelism, in standard streams, the advice carries "
                                                      "as opened; floor(n*) whole streams fit the budget with the "
                                                      "margin for the impact's error, the fractional stream with a "
                                                      "wider one")
    max_nondisruptive_throughput_bps: float
    cross_traffic_impact: float
    max_impact: float
    per_stream_buffer_bytes: int | None
    model: str
    params: dict[str, float]
    regime: str
    warnings: list[str]
    probes: list[dict[str, float]]
    fitted_at: float = Field(description="Unix seconds when the fit was made")
    probed_at: float = Field(description="Unix seconds when the probes behind it ran")
    age_s: float = Field(description="seconds since the newest evidence behind it: probes, or transfers that refitted it")
    stale: bool = Field(description="true when the newest evidence (probes, or transfers that refitted it) is older "
                                    "than the TTL (age_s says; a re-probe has been queued), or when this replica is "
                                    "still re-reading it from a slow store more than 1 s after its last read, so it "
                                    "may miss a write committed since")
    observations_used: int
    open: OpenOut = Field(description="how to open the advice: its streams, and the tame stream's setting")
    congestion_control: str = Field(description="the congestion control the streams are counted in: the probes' "
                                                "(advice is kept per destination and control)")
    alternatives: list[dict] = Field(description="when even one stream of this control exceeds the budget: other "
                                                 "controls measured on this destination and whether they meet it, "
                                                 "the tame control at n*, and the probes that would tell for "
                                                 "controls not measured; empty when the budget is met")


class AdviceQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    src: Site | None = None
    dest: str = Dest
    max_impact: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, description="impact budget, fraction 0-1"),
                          _checked(limits.check_max_impact, before=True)]
    cc: Control | None = None


class BatchItemError(BaseModel):
    kind: str
    message: str


class BatchItem(BaseModel):
    src: str | None = None
    dest: str
    max_impact: float
    cc: str | None = None
    advice: AdviceOut | None = None
    error: BatchItemError | None = None


class BatchOut(BaseModel):
    results: list[BatchItem]


class ProbeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    src: Site | None = Field(default=None, description="the site to probe from (default: the service's own, probed "
                                                      "here; another site's probes wait for its agent)"
                                                      f"{SITE_TOKEN_SRC}")
    dest: str = Dest
    levels: list[int] | None = Field(default=None, max_length=limits.MAX_PROBE_LEVELS,
                                     description="stream counts to probe (default: the service's, e.g. [1, 10])")
    duration_s: float | None = Field(default=None, ge=limits.MIN_PROBE_DURATION_S, le=limits.MAX_PROBE_DURATION_S, allow_inf_nan=False,
                                     description="seconds per level")
    congestion_control: Control | None = None


class ProbeAccepted(BaseModel):
    id: str
    src: str
    dest: str
    congestion_control: str | None
    status: Literal["queued", "running", "done", "failed"]
    created: bool = Field(description="false when the link already had a probe queued or running")


class ProbeStatus(BaseModel):
    id: str
    src: str | None
    dest: str
    congestion_control: str | None
    status: Literal["queued", "running", "done", "failed"]
    progress: float
    # While running: {"phase", "level", "index", "of", "attempt", "elapsed_s", "expected_s"}.
    progress_detail: dict | None = None
    levels: list[int]
    duration_s: float
    requested_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    retry_at: float | None = Field(description="Unix seconds: while the job is queued waiting because its "
                                               "destination's name lookup did not finish, when it may be claimed "
                                               "again; null when it does not wait")
    lookup_waits: int = Field(description="how many times the job's name lookup did not finish since an attempt got "
                                          f"past it; the {MAX_LOOKUP_WAITS}th time fails the job")
    error: str | None
    reuses_probe: int | None = Field(None, description="the stored probe of the link's last probing (its adaptive "
                                                       "level) this probe re-uses instead of measuring that level "
                                                       "again (TAME_PROBE_REUSE_MAX_AGE_S); null: the whole plan")
    result: dict | None


class PathOut(BaseModel):
    src: str
    dest: str
    congestion_control: str | None = Field(description="null for fits stored before controls were recorded")
    model: str
    regime: str
    params: dict[str, float]
    fitted_at: float
    probed_at: float = Field(description="Unix seconds when its newest probes ran")
    age_s: float = Field(description="seconds since its newest evidence: probes, or transfers that refitted it")
    stale: bool = Field(description="true when its newest evidence is older than the TTL (TAME_TTL_S)")
    reprobe_due: Literal["stale", "probe_max_age"] | None = Field(
        description="why the link is due for a probe under this control: 'stale', or 'probe_max_age' when its newest "
                    "probe is older than TAME_PROBE_MAX_AGE_S though transfers keep its advice fresh (its advice is "
                    "served, not stale, until the probe is stored); null when none is due")
    observations_used: int


class PathsOut(BaseModel):
    paths: list[PathOut]


class CurvePointOut(BaseModel):
    streams: int
    throughput_bps: float
    impact: float
    impact_bound: float = Field(description="impact raised by the margin for the prediction's error; "
                                            "advice holds this to the budget")
    advisable: bool


class CurveOut(BaseModel):
    src: str
    dest: str
    congestion_control: str
    model: str
    params: dict[str, float]
    regime: str
    warnings: list[str]
    probes: list[dict[str, float]]
    fitted_at: float
    probed_at: float
    age_s: float = Field(description="seconds since the newest evidence behind the fit: probes, or transfers that "
                                     "refitted it")
    stale: bool = Field(description="true when that evidence is older than the TTL (TAME_TTL_S); reading a curve "
                                    "queues no probe, asking for its advice does")
    curve: list[CurvePointOut]


# A client's name for one write, sent again unchanged when it does not know whether the first send was stored
# (advisor/idempotency.py): the second stores nothing and gets the first's answer, with Idempotent-Replayed: true.
IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", description="a key of the client's (a UUID, say) that names this write: sent again "
    "with it, the request stores nothing and is answered as the first time (header Idempotent-Replayed: true); "
    "refused (422) with another body")]


class ObservationIn(BaseModel):
    """A finished transfer. Only one whose streams were all standard refits the curve; one with a stream
    under the tame congestion control is stored with its detail but does not (advisor/observations.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    src: Site | None = Field(default=None, description="the site the transfer ran from (default: the service's own)"
                                                      f"{SITE_TOKEN_SRC}")
    dest: str = Dest
    streams: int = Field(ge=1, le=limits.MAX_STREAMS)
    throughput_bps: float = Field(ge=limits.MIN_THROUGHPUT_BPS, lt=limits.MAX_THROUGHPUT_BPS, allow_inf_nan=False, description="achieved throughput, bits/s")
    congestion_control: Control | None = Field(
        default=None, description="the control the transfer's standard streams ran (default: the service's)")
    stream_bps: list[Annotated[float, Field(ge=0, lt=limits.MAX_THROUGHPUT_BPS, allow_inf_nan=False)]] = Field(
        default_factory=list, max_length=limits.MAX_STREAMS, description="each stream's rate, bits/s")
    stream_retransmits: list[Annotated[int, Field(ge=0, le=limits.MAX_STREAM_RETRANSMITS)]] = Field(
        default_factory=list, max_length=limits.MAX_STREAMS,
        description="each stream's retransmitted segments, in stream_bps's order")
    stream_congestion_controls: list[Annotated[str, Field(max_length=MAX_CONTROL_NAME,
                                                          pattern=f"^{CONTROL_NAME.pattern}$")]] = Field(
        default_factory=list, max_length=limits.MAX_STREAMS,
        description="each stream's congestion control (e.g. \"cubic\", \"tame\"), in the same order")
    fractional_multiplier: float | None = Field(
        default=None, ge=1, le=limits.MAX_TAME_FM, allow_inf_nan=False,
        description="the FM the tame streams ran at; given exactly when some stream ran \"tame\"")
    tcp_equivalent_streams: float | None = Field(default=None, gt=0, le=limits.MAX_STREAMS, allow_inf_nan=False,
                                                 description="n*: the standard streams' share the transfer opened")
    duration_s: float | None = Field(default=None, gt=0, le=limits.MAX_OBSERVATION_DURATION_S, allow_inf_nan=False)

    def detail(self) -> dict:
        """The fields beyond dest, streams and throughput_bps (src among them), as AdviceService.observe takes them."""
        return self.model_dump(exclude={"dest", "streams", "throughput_bps"})


class ObservationOut(BaseModel):
    src: str
    dest: str
    congestion_control: str
    accepted: bool
    refit: bool
    id: int = Field(description="the stored observation's id")
    feeds_fit: bool = Field(description="false for a transfer with a tame stream: stored, not used to refit")


class ProbeResultIn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    streams: int = Field(ge=1, le=limits.MAX_PROBE_STREAMS, description="streams of the probe (iperf3 opens at most 128)")
    throughput_bps: float = Field(ge=limits.MIN_THROUGHPUT_BPS, lt=limits.MAX_THROUGHPUT_BPS, allow_inf_nan=False)
    sender_bps: float | None = Field(default=None, ge=0, lt=limits.MAX_THROUGHPUT_BPS, allow_inf_nan=False)
    retransmits: int | None = Field(default=None, ge=0, le=limits.MAX_RETRANSMITS)
    rtt_mean_s: float | None = Field(default=None, gt=0, lt=1e4, allow_inf_nan=False)
    duration_s: float = Field(default=10.0, gt=0, le=3600, allow_inf_nan=False)
    omit_s: float = Field(default=0.0, ge=0, le=3600, allow_inf_nan=False)
    throughput_stderr_bps: float | None = Field(default=None, ge=0, lt=limits.MAX_THROUGHPUT_BPS, allow_inf_nan=False)
    started_at: float = Field(default=0.0, ge=0, lt=1e11, allow_inf_nan=False)
    mss_bytes: int | None = Field(default=None, ge=1, le=65535)
    stream_bps: list[Annotated[float, Field(ge=0, lt=limits.MAX_THROUGHPUT_BPS, allow_inf_nan=False)]] = Field(
        default_factory=list, max_length=limits.MAX_PROBE_STREAMS, description="each stream's rate over the window, bits/s")
    stream_retransmits: list[Annotated[int, Field(ge=0, le=limits.MAX_STREAM_RETRANSMITS)]] = Field(
        default_factory=list, max_length=limits.MAX_PROBE_STREAMS,
        description="each stream's retransmitted segments over the window, in stream_bps's order")
    raw: str = Field(default="", max_length=RAW_MAX_CHARS)

    @model_validator(mode="after")
    def _streams_agree(self) -> "ProbeResultIn":
        if len(self.stream_bps) > self.streams:
            raise ValueError(f"stream_bps has {len(self.stream_bps)} entries for {self.streams} streams")
        if self.stream_retransmits and len(self.stream_retransmits) != len(self.stream_bps):
            raise ValueError(f"stream_retransmits has {len(self.stream_retransmits)} entries, stream_bps "
                             f"{len(self.stream_bps)}: give one per stream in the same order, or leave it out")
        return self

    def result_fields(self) -> dict:
        """The fields as probes.result.ProbeResult takes them (per-stream lists as tuples)."""
        return {**self.model_dump(), "stream_bps": tuple(self.stream_bps),
                "stream_retransmits": tuple(self.stream_retransmits)}


class ProbeRunIn(BaseModel):
    """A probe run measured elsewhere (``tame agent --push``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    src: Site | None = Field(default=None, description="the site the probes ran from (default: the service's own)"
                                                      f"{SITE_TOKEN_SRC}")
    dest: str = Dest
    idle_rtt_s: float | None = Field(default=None, gt=0, lt=1e4, allow_inf_nan=False)
    started_at: float = Field(default=0.0, ge=0, lt=1e11, allow_inf_nan=False)
    measured_ago_s: float = Field(default=0.0, ge=0, le=limits.MAX_MEASURED_AGO_S, allow_inf_nan=False,
                                  description="seconds from the end of the probes to this request, by the sender's "
                                              "clock (a run kept while the service was unreachable): the advice's "
                                              "age counts from then, whatever the two clocks say")
    congestion_control: Control | None = Field(default=None, description="the control the probes' streams used; "
                                               "without it the run is kept as not recorded")
    probes: list[ProbeResultIn] = Field(min_length=1, max_length=limits.MAX_PROBES_PER_RUN)
    job_id: str | None = Field(default=None, max_length=64, description="the claimed probe job this run completes "
                                                                       "(POST /v1/sites/NAME/claims); with owner")
    owner: Owner | None = Field(default=None, description="the agent that claimed job_id; a run whose lease went to "
                                                          "another agent is stored without closing the job")

    @model_validator(mode="after")
    def _job_with_owner(self) -> "ProbeRunIn":
        if (self.job_id is None) != (self.owner is None):
            raise ValueError("give job_id and owner together (the claim's), or neither")
        return self


class ProbeRunOut(BaseModel):
    src: str
    dest: str
    probe_run_id: int
    congestion_control: str | None = Field(description="the control the run is kept under (null: not recorded)")
    fitted: bool
    error: str | None
    current: bool = Field(description="its fit is the link's advice under its control now; false without a fit, or "
                                      "when the link's current fit rests on newer probes (a run delivered late: "
                                      "see history)")
    history: str | None = Field(description="why its fit was kept as history rather than made the advice; null "
                                            "when it is the advice or has no fit")


class LinkOut(BaseModel):
    """A link (source site, destination) the store holds advice for."""

    src: str
    dest: str
    congestion_controls: list[str | None] = Field(description="the controls it has advice under (null: not recorded)")
    evidence_at: float = Field(description="Unix seconds of its newest evidence: probes, or transfers that refitted it")
    age_s: float
    stale: bool = Field(description="true when even its newest evidence is older than the TTL")


class LinksOut(BaseModel):
    site: str = Field(description="this service's own site: the src of requests that name none")
    links: list[LinkOut]


class SiteIn(BaseModel):
    """An agent's site: its probe budget and the destinations it probes (each one a link from the site)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    dests: list[Annotated[str, Dest]] = Field(max_length=limits.MAX_SITE_LINKS)
    max_probes: int = Field(default=1, ge=1, le=limits.MAX_SITE_PROBES, description="probes at once")
    max_streams: int = Field(default=64, ge=1, le=limits.MAX_SITE_STREAMS, description="probe streams at once")
    probe_seconds_per_hour: float = Field(default=1800.0, ge=1.0, le=limits.MAX_SITE_PROBE_SECONDS_PER_HOUR,
                                          allow_inf_nan=False, description="probe-seconds in any hour")
    congestion_control: Control | None = Field(default=None, description="the control its probes run under")
    owner: Owner | None = Field(default=None, description=(
        "the agent registering (tame agent gives its claims' owner). The site keeps one budget: a different one is "
        f"taken from the agent that set it, or once the site's agents have been quiet for {BUDGET_HOLD_S:.0f} s and "
        "hold no probe; otherwise 409. Without an owner the budget in force can be confirmed but not changed while "
        "they are alive"))


class RefusedDest(BaseModel):
    dest: str
    error: str


class SiteOut(BaseModel):
    site: str
    links: int
    queued: int = Field(description="probes queued now for its links whose advice is missing or due")
    deferred: int = Field(description="due links left for the next registration: the probe queue is full")
    refused: list[RefusedDest] = Field(description="destinations left out: outside the allow-list, not resolving, or "
                                                    "past the site's link cap (TAME_MAX_SITE_LINKS)")
    budget: dict[str, float]


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    owner: Owner = Field(description="the agent claiming (a name unique to it)")
    max_streams: int = Field(default=64, ge=1, le=limits.MAX_SITE_STREAMS,
                             description="the most streams this agent lets a probe's adaptive level open (its "
                                         "fixed levels are the job's, held to the site's budget)")
    holding: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None, max_length=limits.MAX_SITE_PROBES,
        description="the ids of the probes this agent is running now: a running probe claimed in its name and not "
                    "listed (the claim's answer never reached it) is given to it again first, with a fresh lease")


class ClaimFailureIn(BaseModel):
    """A claimed probe its agent could not run (the destination refused it, say)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    owner: Owner = Field(description="the agent that claimed it")
    error: AgentText = Field(description="what went wrong, as the agent saw it (kept on one line, control and bidi "
                                         "characters as escapes such as \\x1b)")


class ClaimReleaseIn(BaseModel):
    """A claimed probe its agent hands back unfinished: it is stopping, or its lookup of the destination's name did not
    finish."""

    model_config = ConfigDict(extra="forbid", strict=True)
    owner: Owner = Field(description="the agent that claimed it")
    lookup_error: AgentText | None = Field(
        default=None,
        description="the probe could not start: the agent's lookup of the destination's name did not finish (its "
                    "message, as the agent saw it, kept as a failure's error is); the job waits before it is claimed "
                    "again, longer each such time, and fails the 12th. Left out: the agent is stopping, and the job "
                    "is queued again at once")


class ClaimOut(BaseModel):
    site: str
    job: ProbeStatus | None = Field(description="the claimed probe; null when none is due or the budget is spent")
    max_streams: int | None = Field(description="the most streams the claimed probe may open, its adaptive one too")
    lease_until: float | None = Field(description="Unix seconds: the job goes back to the queue if not done by then")
    lease_s: float | None = Field(default=None, description="the lease's length from the claim, seconds (whatever the "
                                                            "agent's clock says): its plan must end within it")
    waiting: str | None = Field(description="why nothing was claimed")
    budget: dict[str, float] = Field(description="the site's budget in force: as registered, held to the operator's "
                                                 "ceiling (TAME_MAX_SITE_PROBES, _STREAMS, _PROBE_SECONDS_PER_HOUR)")
    use: dict[str, float] = Field(description="what the site's probes hold of its budget now")
    plan_settings: dict[str, str | float] | None = Field(
        default=None, description="this service's settings the lease is worked out from, beside the job's levels and "
                                  "duration_s: model (TAME_MODEL), max_probe_duration_s (TAME_PROBE_MAX_DURATION_S) "
                                  "and omit_s (TAME_PROBE_OMIT_S), seconds; an agent whose own differ may outlast it")


class Health(BaseModel):
    status: str
    database: str


class ErrorOut(BaseModel):
    detail: str
