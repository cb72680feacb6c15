"""The service's input limits, each written once: the CLI, the service and the API schema read them here.

Each ``check_*`` takes a value as a user gave it and returns it typed, or raises InvalidRequest
saying what to give instead; the CLI turns that into a usage error, the API into 422.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

from advisor.errors import DuplicateKey, InvalidRequest
from probes.cc_map import MAX_FM as MAX_TAME_FM  # noqa: F401  (an observed tame stream's FM is held to what the map holds)
from probes.cc import NAME as TAME
from probes.controls import MAX_CONTROL_NAME, is_control_name
from probes.iperf import MAX_STREAMS as MAX_PROBE_STREAMS

# A destination as typed (HOST[:PORT]); DNS names are at most 253 characters.
MAX_DEST_LENGTH = 300
# Stream counts a transfer may report or the advice may consider.
MAX_STREAMS = 1024
# How long ago a pushed run's probes may have ended (POST /v1/probe-runs measured_ago_s), seconds: a year.
MAX_MEASURED_AGO_S = 365 * 86400.0
# Throughputs in bits/s: a probe or transfer reports at least 1 bit/s and under 1 Pbit/s, far above any
# single host's link, so that squares of n/throughput (Lu eq. 6) stay well inside floating point.
MIN_THROUGHPUT_BPS = 1.0
MAX_THROUGHPUT_BPS = 1e15
# How long a reported transfer may have run, seconds (30 days).
MAX_OBSERVATION_DURATION_S = 30 * 86400.0
# A path's round-trip time as a user may give it, seconds (an RTT of 10 s is no path a transfer runs on).
MAX_RTT_S = 10.0
# A probe plan: how many levels, and seconds per level.
MAX_PROBE_LEVELS = 8
MIN_PROBE_DURATION_S = 1.0
MAX_PROBE_DURATION_S = 300.0
# How long a probe whose rate has not settled may be extended to, seconds (TAME_PROBE_MAX_DURATION_S, --max-duration),
# its warm-up left out of it (--omit), and how many times a plan may probe each level (--repeats): with the most
# levels, a plan of at most MAX_PROBE_LEVELS * MAX_PROBE_REPEATS * (MAX_PROBE_OMIT_S + MAX_PROBE_MAX_DURATION_S)
# seconds (about 15 hours), where an unbounded one never ended or overflowed.
MAX_PROBE_MAX_DURATION_S = 600.0
MAX_PROBE_OMIT_S = 60.0
MAX_PROBE_REPEATS = 10
# A site (the source end of a link): a name an agent registers, lowercase letters, digits, '.', '_' and '-',
# starting with a letter or digit (a host name fits).
MAX_SITE_LENGTH = 64
_SITE = re.compile(r"[a-z0-9][a-z0-9._-]*")
SITE_RULE = (f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most {MAX_SITE_LENGTH} "
             "characters")
# A site's probe budget (advisor.sites.SiteBudget) and how many links one registration may name. Its probe-seconds
# are counted over BUDGET_WINDOW_S; the most a site may have is every one of its probes running all that time.
BUDGET_WINDOW_S = 3600.0
MAX_SITE_PROBES = 64
MAX_SITE_STREAMS = 4096
MAX_SITE_PROBE_SECONDS_PER_HOUR = BUDGET_WINDOW_S * MAX_SITE_PROBES
# The attempts of one site that end without a run (handed back, failed, lapsed) and start within one such stretch of
# time are kept as one row of spent_attempts (advisor.jobs.charge_attempt_in), so a site's claims and hand-backs in
# a loop add at most BUDGET_WINDOW_S / SPENT_ATTEMPTS_BUCKET_S rows over the window, not one each; the row is dated
# by the latest start among them, so each attempt counts in the budget for at least the window after its own start.
SPENT_ATTEMPTS_BUCKET_S = 60.0
MAX_SITE_LINKS = 2000
# Sites the store holds (TAME_MAX_SITES, default; advisor.links.Links.check_new_site): sites registered, and sites with
# a link or a queued or running probe, the service's own and those of TAME_SITE_TOKENS left out. Each site brings its own TAME_MAX_SITE_LINKS, so
# this and that bound the store together; where writes are open (no TAME_TOKEN) any client names new sites.
MAX_SITES = 1000
# The congestion controls one link keeps probe runs and observations under (advisor.store.Store.check_link_control):
# each has its own current fit, refit window and advice alternative, so a link's store and advice are bounded by it.
# One is counted until retention releases it (advisor/retention.py: nothing under it newer than TAME_RUN_MAX_AGE_S).
MAX_LINK_CONTROLS = 8
# The largest whole number an INTEGER column holds on both stores (PostgreSQL's integer is 4 bytes, SQLite's up to 8):
# every count a write stores in one is held to it where it comes in, so both stores take or refuse it alike (422).
MAX_STORED_INT = 2**31 - 1
# Retransmitted segments of one probe (probe_results.retransmits, an INTEGER column).
MAX_RETRANSMITS = MAX_STORED_INT
# Retransmitted segments of one stream, kept in JSON arrays (exact up to 2**53), not in an INTEGER column.
MAX_STREAM_RETRANSMITS = 2**53
# Probe runs pushed at once (``tame agent --push``): the levels plus adaptive ones and re-runs.
MAX_PROBES_PER_RUN = 16
# An agent's name: its claims' owner, and who set its site's budget (tame agent gives host:pid:boot:start:nonce).
MAX_OWNER_LENGTH = 200


# Numbers as a user types them (the environment, the command line): ASCII digits, a sign, a point, an exponent.
_WHOLE_TEXT = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_number(text: str, kind: type = float) -> Any:
    """``text`` (white space around it ignored) as a ``kind`` (float, or int for a whole number); ValueError when it
    is not one written in ASCII digits. int() and float() also read other scripts' digits ('５'), underscores
    ('1_000'), 'inf' and 'nan', which nobody means as a setting."""
    stripped = text.strip()
    if not (_WHOLE_TEXT if kind is int else _NUMBER_TEXT).fullmatch(stripped):
        raise ValueError(f"{text!r:.80} is not a {'whole ' if kind is int else ''}number")
    return kind(stripped)  # int(): at most sys.int_max_str_digits digits, else ValueError too


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> Any:
    """A value as an error message quotes it: a long text cut to its first 40 characters."""
    return value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "…"


def unique_keys(what: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """json.loads' object_pairs_hook for ``what`` (e.g. "the body"): each object as a dict, DuplicateKey naming a key
    given twice in one."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        doc = dict(pairs)  # at C speed; the pairs are looked through only when one key took two
        if len(doc) < len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise DuplicateKey(f"{what} gives {_shown(key)!r} twice in one object; give each key once")
                seen.add(key)
        return doc

    return hook


def check_max_impact(value: Any) -> float:
    """An impact budget: a fraction 0-1."""
    if not _is_number(value) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidRequest(f"max_impact must be a fraction between 0 and 1 (e.g. 0.1 for 10 %), got {value!r}")
    return float(value) + 0.0  # -0.0 is 0.0: one budget, one cache key, one answer


def check_streams(value: Any, name: str = "streams") -> int:
    """A whole number of streams, 1 to MAX_STREAMS."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_STREAMS:
        raise InvalidRequest(f"{name} must be a whole number between 1 and {MAX_STREAMS}, got {value!r}")
    return value


def check_throughput_bps(value: Any, name: str = "throughput_bps") -> float:
    """A measured throughput in bits/s, MIN_THROUGHPUT_BPS up to (not including) MAX_THROUGHPUT_BPS."""
    if not _is_number(value) or not math.isfinite(value) \
            or not MIN_THROUGHPUT_BPS <= value < MAX_THROUGHPUT_BPS:
        raise InvalidRequest(f"{name} must be a number of bits/s from {MIN_THROUGHPUT_BPS:g} up to "
                             f"{MAX_THROUGHPUT_BPS:g} (e.g. 88e6 for 88 Mbit/s), got {value!r}")
    return float(value)


def usable_rtt_s(value: Any) -> float | None:
    """``value`` when it is an RTT check_rtt_s accepts, else None (unknown): what the FM is computed at."""
    try:
        return check_rtt_s(value)
    except InvalidRequest:
        return None


def check_rtt_s(value: Any) -> float:
    """A round-trip time in seconds, above 0 up to MAX_RTT_S."""
    if not _is_number(value) or not math.isfinite(value) or not 0.0 < value <= MAX_RTT_S:
        raise InvalidRequest(f"the RTT must be a number of seconds above 0 and at most {MAX_RTT_S:g} "
                             f"(e.g. 0.04 for 40 ms), got {value!r}")
    return float(value)


def check_probe_levels(levels: Any, needed: int, model: str) -> list[int]:
    """Stream counts to probe: ``needed`` (the model's minimum) to MAX_PROBE_LEVELS different ones in
    1..MAX_PROBE_STREAMS, returned sorted without repeats."""
    if not isinstance(levels, (list, tuple)) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in levels):
        raise InvalidRequest("levels must be a list of whole stream counts, e.g. [1, 10]")
    distinct = sorted(set(levels))
    if not needed <= len(distinct) <= MAX_PROBE_LEVELS or distinct[0] < 1 or distinct[-1] > MAX_PROBE_STREAMS:
        raise InvalidRequest(
            f"levels must hold {needed} to {MAX_PROBE_LEVELS} different stream counts between 1 and "
            f"{MAX_PROBE_STREAMS} (model {model} needs {needed}), e.g. [1, 10]; got {list(levels)}"
        )
    return distinct


def check_probe_duration_s(value: Any) -> float:
    """Seconds per probe level."""
    if not _is_number(value) or not math.isfinite(value) \
            or not MIN_PROBE_DURATION_S <= value <= MAX_PROBE_DURATION_S:
        raise InvalidRequest(f"duration_s must be between {MIN_PROBE_DURATION_S:g} and {MAX_PROBE_DURATION_S:g} "
                             f"seconds, got {value!r}")
    return float(value)


TOKEN_RULE = "printable ASCII without white space"


def is_token(value: Any) -> bool:
    """Whether ``value`` can be a bearer token: non-empty printable ASCII without white space. A header carries
    printable ASCII (other bytes reach the boundary as Latin-1, and a client cannot send them at all), so a token
    breaking this rule never matches."""
    return isinstance(value, str) and bool(value) and value.isascii() and value.isprintable() \
        and not any(c.isspace() for c in value)


def check_token(value: Any, name: str) -> str:
    """A bearer token from ``name`` (TAME_TOKEN, ...): InvalidRequest names the variable, never the value (a secret)."""
    if not is_token(value):
        raise InvalidRequest(f"{name} is not a usable token: a token is {TOKEN_RULE} (a newline or a non-ASCII "
                             f"character cannot go in an Authorization header); set {name} to the token as it was "
                             "given, e.g. one made with `openssl rand -hex 32`")
    return value


def check_congestion_control(value: Any, name: str = "congestion_control") -> str:
    """A standard streams' TCP congestion control, named as the kernel does: a lowercase letter, then lowercase
    letters, digits or underscores, at most MAX_CONTROL_NAME characters in all (e.g. "cubic", "bbr", "reno");
    not the tame control, which only ever carries a fraction of a standard stream."""
    if not is_control_name(value):
        raise InvalidRequest(f"{name} must name a TCP congestion control as the kernel does (lowercase letters, "
                             f"digits and underscores, starting with a letter, at most {MAX_CONTROL_NAME} "
                             f"characters), e.g. cubic, bbr or reno; got {_shown(value)!r}")
    if value == TAME:
        # Advice counts standard streams; a tame stream is a fraction of one of them, never the unit.
        raise InvalidRequest(f"{name} {TAME!r} is the fractional stream's control, not a standard one: name the "
                             "control the standard streams run (e.g. cubic, bbr or reno)")
    return value


def check_available_control(value: str, available: Sequence[str], name: str = "congestion_control") -> str:
    """A control this kernel offers (``available``: net.ipv4.tcp_available_congestion_control), for a probe
    run here."""
    control = check_congestion_control(value, name)
    if control not in available:
        raise InvalidRequest(f"{name} {control!r} is not available in this kernel; choose one of "
                             f"{', '.join(available)} (net.ipv4.tcp_available_congestion_control), or load "
                             f"its module first (modprobe tcp_{control})")
    return control


def check_site(value: Any, name: str = "src") -> str:
    """A site's name as it becomes a key: lowercased; letters, digits, '.', '_' and '-', starting with a letter or
    digit, at most MAX_SITE_LENGTH characters (a host name fits)."""
    text = value.lower() if isinstance(value, str) else value
    if not isinstance(text, str) or len(text) > MAX_SITE_LENGTH or not _SITE.fullmatch(text):
        raise InvalidRequest(f"{name} must name a site: {SITE_RULE} (e.g. a host name such as dtn1.example.org); "
                             f"got {_shown(value)!r}")
    return text


def check_owner(value: Any, name: str = "owner") -> str:
    """An agent's name: 1 to MAX_OWNER_LENGTH printable characters (other agents of its site are shown it)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_OWNER_LENGTH or not value.isprintable():
        raise InvalidRequest(f"{name} must name the agent: 1 to {MAX_OWNER_LENGTH} printable characters, unique to it "
                             f"(tame agent gives host:pid:boot:start:nonce); got {_shown(value)!r}")
    return value
