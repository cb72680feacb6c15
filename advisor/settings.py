"""The service's configuration, read once from the environment at start-up and validated."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import shlex
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

from advisor.allowlist import DEFAULT_ALLOWED, AllowList
from advisor.db import DEFAULT_POOL_SIZE, check_database_url, redact_url
from advisor.errors import ConfigError, InvalidRequest, StoreError
from advisor.files import FileTooLarge, NotARegularFile, read_capped
from advisor.freshness import PROBE_MAX_AGE_TTLS, REUSE_MAX_AGE_TTLS, Freshness
from advisor.limits import MAX_PROBE_MAX_DURATION_S, MAX_PROBE_OMIT_S, MAX_SITE_LINKS, MAX_SITES, SITE_RULE, TOKEN_RULE, check_congestion_control, check_site, check_token, \
    is_token, parse_number
from advisor.retention import Retention
from advisor.sites import SITE_CEILING_VARIABLES, SITE_HARD_CAPS, SiteBudget
from advisor.store import REFIT_OBSERVATIONS
from advisor.tame import DEFAULT_MODEL, DEFAULT_N_MAX
from models.registry import MODELS
from probes.controls import host_default_control
from probes.plan import ProbePlan

DEFAULT_LEVELS = ProbePlan.levels


def default_database_url(env: Mapping[str, str]) -> str:
    """sqlite:///$XDG_DATA_HOME/tame/tame.sqlite3 when XDG_DATA_HOME is set, else ./tame.sqlite3."""
    base = env.get("XDG_DATA_HOME")
    path = Path(base) / "tame" / "tame.sqlite3" if base else Path("tame.sqlite3")
    return f"sqlite:///{path}"


# The site of a service, agent or store that names none. A fixed name, not the host's: processes sharing one
# store (an API and an agent in two containers) must agree on it, and a container's host name changes.
DEFAULT_SITE = "local"


def default_site(env: Mapping[str, str]) -> str:
    """The site this process speaks for: TAME_SITE, else DEFAULT_SITE (checked: advisor.limits.check_site)."""
    try:
        return check_site(env.get("TAME_SITE") or DEFAULT_SITE, "TAME_SITE")
    except InvalidRequest as exc:
        raise ConfigError(str(exc)) from None


def run_max_age_s(env: Mapping[str, str], ttl_s: float, number: Callable[..., Any]) -> float:
    """TAME_RUN_MAX_AGE_S in seconds (0: no age limit): default 30 days, or twice TAME_TTL_S when that is longer.
    A link with nothing newer goes, fits and all (advisor.retention), and a link in use gets new evidence only
    once its advice is TTL old (its re-probe is queued then), so a limit under two TTLs would remove links in use:
    ConfigError."""
    given = number("TAME_RUN_MAX_AGE_S", max(30 * 86400.0, 2 * ttl_s), 0.0, 100 * 365 * 86400.0)
    if 0 < given < 2 * ttl_s:
        raise ConfigError(f"TAME_RUN_MAX_AGE_S={env['TAME_RUN_MAX_AGE_S']!r} must be 0 (no age limit) or at least "
                          f"twice TAME_TTL_S ({2 * ttl_s:g} s): links with nothing newer are removed, fits and all, "
                          "and a link in use is re-probed only once its advice is TAME_TTL_S old")
    return given


def default_control(env: Mapping[str, str]) -> str:
    """The congestion control probes and advice use when a request names none: TAME_CONGESTION_CONTROL, else
    this host's (checked: advisor.limits.check_congestion_control)."""
    control = env.get("TAME_CONGESTION_CONTROL") or host_default_control()
    try:
        return check_congestion_control(control, "TAME_CONGESTION_CONTROL")
    except InvalidRequest as exc:
        raise ConfigError(str(exc)) from None


def check_site_ceiling(settings: Settings, env: Mapping[str, str]) -> None:
    """ConfigError when a ceiling the operator set leaves no room for one probe of the configured plan: every
    site's registration would be refused, whatever its agents asked for."""
    from advisor.plan_runner import plan_need_text, plan_needs  # deferred: plan_runner builds its plans from Settings

    for name, need, _ in settings.site_ceiling.shortfalls(*plan_needs(settings)):
        variable = SITE_CEILING_VARIABLES[name]
        if env.get(variable):
            raise ConfigError(f"{variable}={env[variable]!r} is below {plan_need_text(name, need)}: no site's probe "
                              f"would fit, so every registration would be refused; give at least {math.ceil(need)}, "
                              f"or a smaller plan")


SITE_TOKENS_EXAMPLE = "site-a:TOKEN1,site-b:TOKEN2"
# The fewest characters a site token may have. TAME_TOKEN and TAME_READ_TOKEN have no minimum: deployments run with
# the short ones they were given, and a new rule for them would stop those services at their next start.
MIN_SITE_TOKEN_LENGTH = 16
# A secrets file is read whole at start-up: lines of site:token, far below this (bytes).
MAX_SECRET_FILE_BYTES = 1 << 20
MAKE_TOKEN = "make one with `openssl rand -hex 32`"


def read_secret_file(variable: str, path: str) -> str:
    """The text of the file of secrets ``variable`` names. As ssh does with keys, ConfigError refuses a file that is
    not a regular file, or that group or others may use (mode & 0o077: others could read the secrets, or write their
    own), saying to chmod 600 it."""
    where = f"{variable}={path!r}"

    def private(info: os.stat_result) -> None:
        mode = info.st_mode
        if mode & 0o077:
            raise ConfigError(f"{where} is open to group or others (mode {stat.S_IMODE(mode):04o}), and it holds "
                              f"secrets: chmod 600 {shlex.quote(path)}, owned by the service's user")
        if info.st_uid != os.geteuid():  # its owner could write tokens in, whatever the mode
            raise ConfigError(f"{where} belongs to user id {info.st_uid}, not to the service's ({os.geteuid()}), and "
                              f"it holds secrets: chown {os.geteuid()} {shlex.quote(path)}")

    try:
        data = read_capped(path, MAX_SECRET_FILE_BYTES, check=private)
    except NotARegularFile:
        raise ConfigError(f"{where} is not a regular file; point {variable} at a file that holds the secrets") from None
    except FileTooLarge:
        raise ConfigError(f"{where} is larger than {MAX_SECRET_FILE_BYTES} bytes: point {variable} at the "
                          "file of site:token lines") from None
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # Not the decoder's message: it quotes a byte of the file.
        raise ConfigError(f"{where} is not UTF-8 text") from None


def site_tokens(env: Mapping[str, str], token: str | None, read_token: str | None) -> tuple[tuple[str, str], ...]:
    """TAME_SITE_TOKENS, or the file TAME_SITE_TOKENS_FILE names (one pair a line): (site, token) pairs, each token
    writing only its site's links (api/boundary.py). A site may have several tokens, so one can replace another
    without a gap. ConfigError names the variable and the pair by its number, and says what to write; no message
    repeats what a pair gives, site or token: a pair written TOKEN:SITE has its secret where the site belongs."""
    text, name = env.get("TAME_SITE_TOKENS") or None, "TAME_SITE_TOKENS"
    path = env.get("TAME_SITE_TOKENS_FILE") or None
    if text is not None and path is not None:
        raise ConfigError("TAME_SITE_TOKENS and TAME_SITE_TOKENS_FILE are both set: keep one")
    if path is not None:
        name = f"TAME_SITE_TOKENS_FILE ({path})"
        text = read_secret_file("TAME_SITE_TOKENS_FILE", path)
    if text is None:
        return ()
    if not token:
        # A site token limits what its holder writes; without TAME_TOKEN everyone else would write anything.
        raise ConfigError(f"{name} is set but TAME_TOKEN is empty, which would leave writes (POST /v1/probes, "
                          "/v1/probe-runs, /v1/observations, /v1/sites/) open to anyone: set TAME_TOKEN to the "
                          f"operator's token for every site too, or unset {name}")
    write = f"write SITE:TOKEN pairs separated by commas, e.g. {SITE_TOKENS_EXAMPLE}"
    site_first = "write each pair SITE:TOKEN, the site first"
    pairs: list[tuple[str, str]] = []
    entries = [e.strip() for e in text.replace("\n", ",").split(",")]
    for number, entry in enumerate((e for e in entries if e), 1):
        pair = f"{name}: pair {number}"
        site_text, colon, secret = entry.partition(":")
        if not colon or not site_text:
            raise ConfigError(f"{pair} is not SITE:TOKEN; {write}")
        try:
            site = check_site(site_text)
        except InvalidRequest:
            raise ConfigError(f"{pair}'s site is not a site name ({SITE_RULE}); {site_first}") from None
        if not is_token(secret):
            raise ConfigError(f"{pair}'s token is {'empty' if not secret else 'not one word'}; a token is {TOKEN_RULE}, "
                              f"without commas; {MAKE_TOKEN}; {site_first}")
        if len(secret) < MIN_SITE_TOKEN_LENGTH:
            raise ConfigError(f"{pair}'s token has fewer than {MIN_SITE_TOKEN_LENGTH} characters; {MAKE_TOKEN}, "
                              f"and {site_first}")
        for other, (other_site, known) in enumerate(pairs, 1):
            if known == secret:
                raise ConfigError(f"{pair} gives pair {other}'s site and token again" if other_site == site else
                                  f"{name}: pairs {other} and {number} have the same token; give each site its own")
        if secret == token:
            raise ConfigError(f"{pair}'s token is TAME_TOKEN's, which writes for every site; give each site a token "
                              "of its own")
        if secret == read_token:
            raise ConfigError(f"{pair}'s token is TAME_READ_TOKEN's, so every reader could write for its site; give "
                              "each site a token of its own")
        pairs.append((site, secret))
    if not pairs:
        raise ConfigError(f"{name} gives no SITE:TOKEN pair; {write}, or unset it")
    # A site's name is no secret: a token equal to one (a pair written TOKEN:SITE, say) is a guess away.
    names = {site: f"pair {number}'s" for number, (site, _) in reversed(list(enumerate(pairs, 1)))}
    names.setdefault(default_site(env), "TAME_SITE")
    for number, (_, secret) in enumerate(pairs, 1):
        if secret.lower() in names:
            raise ConfigError(f"{name}: pair {number}'s token is the name of a site ({names[secret.lower()]}); "
                              f"{MAKE_TOKEN}, and {site_first}")
    return tuple(pairs)


def service_token(env: Mapping[str, str], name: str) -> str | None:
    """The token in variable ``name`` (TAME_TOKEN, TAME_READ_TOKEN), None when unset or empty; ConfigError names the
    variable, never its value: a token that cannot go in a header would make every request fail (the client) or
    every write 401 (the service)."""
    value = env.get(name) or None
    try:
        return None if value is None else check_token(value, name)
    except InvalidRequest as exc:
        raise ConfigError(str(exc)) from None


def forwarded_allow_ips(env: Mapping[str, str]) -> tuple[str, ...]:
    """TAME_FORWARDED_ALLOW_IPS: the trusted proxies (addresses and CIDR networks, comma-separated) whose
    X-Forwarded-For names the client; () when unset, and then no request's header is believed (api/server.py)."""
    text = env.get("TAME_FORWARDED_ALLOW_IPS") or ""
    proxies = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        where = f"TAME_FORWARDED_ALLOW_IPS: {item!r}"
        if item == "*":
            # Every client could name any address, and with it dodge the per-client probe-queue cap.
            raise ConfigError(f"{where} would let every client say who it is; list the proxies' addresses or "
                              "networks (0.0.0.0/0,::/0 if every address really is a trusted proxy)")
        try:
            proxies.append(str(ipaddress.ip_network(item, strict=True)))
        except ValueError as exc:
            raise ConfigError(f"{where} is not an address or CIDR network of a trusted proxy ({exc}); e.g. "
                              "10.0.0.5 or 10.0.0.0/24, comma-separated") from None
    return tuple(proxies)


@dataclass(frozen=True)
class Settings:
    """Plain values; see ``from_env`` for the variable behind each one."""

    database_url: str = "sqlite:///tame.sqlite3"
    # The most connections this process holds open to the store (advisor/pool.py); a transaction finding all in use
    # waits for one.
    db_pool_size: int = DEFAULT_POOL_SIZE
    # The tokens are secrets: kept out of repr, which reaches logs, tracebacks and debuggers.
    token: str | None = field(default=None, repr=False)
    read_token: str | None = field(default=None, repr=False)
    # (site, token) pairs: each token reads, and writes only its site's links (site_tokens, api/boundary.py).
    site_tokens: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    allowed: AllowList = field(default_factory=lambda: AllowList.parse(DEFAULT_ALLOWED))
    ttl_s: float = 3600.0
    # A link whose newest probe is older is due for one even while transfers keep its advice fresh
    # (advisor/freshness.py); None: PROBE_MAX_AGE_TTLS times ttl_s.
    probe_max_age_s: float | None = None
    # A queued probe of a link whose last probing (under the same control) measured its adaptive probe at most this
    # long ago, seconds, re-uses that probe instead of measuring the level again, so refreshes alternate between the
    # whole plan and its fixed levels (docs/accuracy.md, "What a probe plan costs"); None: REUSE_MAX_AGE_TTLS times
    # ttl_s; 0: never.
    reuse_adaptive_max_age_s: float | None = None
    max_concurrent_probes: int = 1
    model: str = DEFAULT_MODEL
    n_max: int = DEFAULT_N_MAX
    default_levels: tuple[int, ...] = DEFAULT_LEVELS
    default_duration_s: float = ProbePlan.duration_s
    omit_s: float = ProbePlan.omit_s
    # A probe whose rate has not settled is re-run twice as long, up to this (probes.plan.ProbePlan).
    max_probe_duration_s: float = ProbePlan.max_duration_s
    max_batch: int = 1000
    max_probe_attempts: int = 3
    # Queued probe jobs in total (all clients); POST /v1/probes past it answers 429.
    max_queued_probes: int = 500
    max_queued_probes_per_client: int = 50
    # The reverse proxies whose X-Forwarded-For gives the client's address (CIDR networks); none: the client is the
    # address that connected, whatever a header says (api/server.py).
    forwarded_allow_ips: tuple[str, ...] = ()
    # Advice cached in memory is re-read after this long even without a local write, so writes
    # made by another process (an agent sharing the database) show up.
    cache_max_age_s: float = 1.0
    # The HTTP server's limits (api/server.py, docs/security.md): an idle keep-alive connection is
    # closed after keepalive_timeout_s; a request's headers must be complete header_timeout_s after
    # its first byte (or the connection's opening), its body body_timeout_s after its headers;
    # beyond max_connections open connections new requests get 503; backlog is the listen queue.
    keepalive_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1000
    # The most of them one client (api.boundary.client_key; not the trusted proxies) may hold open.
    max_client_connections: int = 100
    backlog: int = 2048
    # Request bodies over api.boundary.LARGE_BODY_BYTES are read and handled by at most max_large_bodies requests at
    # once; one more waits up to large_body_wait_s for its turn, then gets 503 (api/boundary.py).
    max_large_bodies: int = 4
    large_body_wait_s: float = 5.0
    # What history the store keeps and how often the rest is pruned (advisor/retention.py).
    retention: Retention = field(default_factory=Retention)
    # The congestion control probes and advice use when a request names none: this host's default.
    congestion_control: str = field(default_factory=host_default_control)
    # This service's own site: the source of the links it probes itself, and of requests that name none.
    site: str = field(default_factory=lambda: default_site(os.environ))
    # The most any site's budget may be (advisor.sites.SiteBudget): a registration above it is refused, and a budget
    # stored before it was lowered is held to it when its probes are claimed.
    site_ceiling: SiteBudget = SITE_HARD_CAPS
    # The most links (source site, destination) the store keeps from one site: a write that would make one more is
    # refused (advisor.store.Store.check_new_link). Each link has its own retention allowance, so this bounds the
    # store per site; links that hold nothing age out (advisor/retention.py).
    max_site_links: int = MAX_SITE_LINKS
    # The most sites the store holds besides this service's own: a write that would make one more is refused
    # (advisor.store.Store.check_new_site); sites that hold nothing age out as links do (advisor/retention.py).
    max_sites: int = MAX_SITES

    def __repr__(self) -> str:
        # A repr reaches logs, tracebacks and debuggers: the tokens are left out (repr=False), and the database URL,
        # which may hold PostgreSQL's password, is shown without it.
        shown = (f"{f.name}={redact_url(self.database_url) if f.name == 'database_url' else getattr(self, f.name)!r}"
                 for f in dataclasses.fields(self) if f.repr)
        return f"{type(self).__name__}({', '.join(shown)})"

    @cached_property  # read on every GET /v1/advice
    def freshness(self) -> Freshness:
        """When advice is stale and when a link is due for a probe."""
        max_age = PROBE_MAX_AGE_TTLS * self.ttl_s if self.probe_max_age_s is None else self.probe_max_age_s
        return Freshness(self.ttl_s, max_age)

    @property
    def reuse_adaptive_within_s(self) -> float:
        """How old a link's last adaptive probe may be for a refresh to re-use it, seconds (0: never)."""
        if self.reuse_adaptive_max_age_s is None:
            return REUSE_MAX_AGE_TTLS * self.ttl_s
        return self.reuse_adaptive_max_age_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """TAME_DATABASE_URL, TAME_DB_POOL_SIZE (the most connections this process holds open to the store, default
        advisor.db.DEFAULT_POOL_SIZE), TAME_TOKEN, TAME_READ_TOKEN, TAME_SITE_TOKENS (or TAME_SITE_TOKENS_FILE; see
        site_tokens), TAME_ALLOWED_DESTINATIONS, TAME_ALLOWED_PORTS (the ports probes may go to, e.g. 5201-5210; default
        any), TAME_TTL_S,
        TAME_PROBE_MAX_AGE_S (a link whose newest probe is older is probed again even while finished transfers keep
        its advice fresh; default 24 times TAME_TTL_S, at least TAME_TTL_S),
        TAME_MAX_CONCURRENT_PROBES, TAME_MODEL, TAME_PROBE_LEVELS (e.g. "1,10"), TAME_PROBE_DURATION_S,
        TAME_PROBE_MAX_DURATION_S, TAME_PROBE_OMIT_S (warm-up seconds left out of each probe),
        TAME_PROBE_REUSE_MAX_AGE_S (a queued probe re-uses the link's last adaptive probe, measured at most this long
        ago, instead of measuring it again; default 2 times TAME_TTL_S, 0 = never), TAME_MAX_BATCH, TAME_MAX_QUEUED_PROBES,
        TAME_MAX_QUEUED_PROBES_PER_CLIENT (queued jobs one remote address, or one other site, may have),
        TAME_FORWARDED_ALLOW_IPS (trusted proxies whose X-Forwarded-For names the remote address; see
        forwarded_allow_ips), TAME_KEEPALIVE_TIMEOUT_S, TAME_HEADER_TIMEOUT_S, TAME_BODY_TIMEOUT_S,
        TAME_MAX_CONNECTIONS, TAME_MAX_CLIENT_CONNECTIONS (connections one client address, an IPv6 /64, may hold
        open; default 100 or TAME_MAX_CONNECTIONS if lower, at most TAME_MAX_CONNECTIONS), TAME_BACKLOG, TAME_MAX_LARGE_BODIES (request bodies over 1 MiB read at once, default
        4), TAME_LARGE_BODY_WAIT_S (how long one more waits for its turn before 503, default 5), TAME_MAX_SITE_LINKS (links the store keeps from one site, default 2000),
        TAME_MAX_SITES (sites the store keeps besides its own, default 1000),
        TAME_CONGESTION_CONTROL (the control probes and advice use when a request names none; default this host's,
        net.ipv4.tcp_congestion_control), TAME_SITE (this service's site, the source of the links it probes;
        default "local"), TAME_MAX_SITE_PROBES, TAME_MAX_SITE_STREAMS, TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR (the
        most any site's budget may be: site_ceiling; default and at most advisor.sites.SITE_HARD_CAPS).
        Retention (advisor/retention.py), per destination: TAME_KEEP_FITS (newest fits kept with their
        curves, default 20), TAME_KEEP_RUNS (newest probe runs and finished probe jobs kept, default 20),
        TAME_RUN_MAX_AGE_S (runs and finished jobs older than this go even within TAME_KEEP_RUNS, and links
        that hold nothing newer, fits and all, and a link's congestion controls under which it holds nothing newer
        and no probe is queued or running, with what it holds under them; default 2592000 = 30 days or
        2 x TAME_TTL_S if longer, 0 = no age limit, else at least 2 x TAME_TTL_S), TAME_KEEP_OBSERVATIONS
        (default 1000, at least 200, the refit window); while a link and its control stay, its current fit, the run
        it rests on and the newest run are kept. TAME_PRUNE_INTERVAL_S (seconds between pruning passes of a serving
        process, default 60, 0 = never prune), TAME_PRUNE_BATCH (rows deleted, or rows of link_controls gone
        through, per transaction, default 500).
        ConfigError names the variable that is wrong."""
        env = os.environ if env is None else env

        def number(name: str, default: float, low: float, high: float, kind=float):
            text = env.get(name)
            if text is None or text == "":
                return default
            try:
                value = parse_number(text, kind)
            except ValueError:
                raise ConfigError(f"{name}={text!r} is not a {'whole ' if kind is int else ''}number") from None
            if not low <= value <= high:
                raise ConfigError(f"{name}={text!r} must be between {low:g} and {high:g}")
            return value

        try:
            url = check_database_url(env.get("TAME_DATABASE_URL") or default_database_url(env), "TAME_DATABASE_URL")
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
        model = env.get("TAME_MODEL") or DEFAULT_MODEL
        if model not in MODELS:
            raise ConfigError(f"TAME_MODEL={model!r}: choose one of {', '.join(sorted(MODELS))}")
        levels_text = env.get("TAME_PROBE_LEVELS") or ",".join(map(str, DEFAULT_LEVELS))
        try:
            levels = tuple(sorted({parse_number(x, int) for x in levels_text.split(",") if x.strip()}))
        except ValueError:
            raise ConfigError(f"TAME_PROBE_LEVELS={levels_text!r}: give stream counts such as 1,10") from None
        if len(levels) < 2 or levels[0] < 1 or levels[-1] > 128:
            raise ConfigError(f"TAME_PROBE_LEVELS={levels_text!r}: give at least two stream counts in 1..128")
        token, read_token = (service_token(env, name) for name in ("TAME_TOKEN", "TAME_READ_TOKEN"))
        if read_token and not token:
            # Writes are guarded by TAME_TOKEN alone, so this would guard reads and leave writes open.
            raise ConfigError("TAME_READ_TOKEN is set but TAME_TOKEN is empty, which would leave writes "
                              "(POST /v1/probes, /v1/probe-runs, /v1/observations) open to anyone: set TAME_TOKEN "
                              "to a write token too, or unset TAME_READ_TOKEN")
        ttl_s = number("TAME_TTL_S", 3600.0, 1.0, 365 * 86400.0)
        probe_max_age_s = number("TAME_PROBE_MAX_AGE_S", PROBE_MAX_AGE_TTLS * ttl_s, 1.0, 100 * 365 * 86400.0)
        if probe_max_age_s < ttl_s:
            # Below the TTL every link would be probed before its advice could go stale: TAME_TTL_S would mean nothing.
            raise ConfigError(f"TAME_PROBE_MAX_AGE_S={env['TAME_PROBE_MAX_AGE_S']!r} must be at least TAME_TTL_S "
                              f"({ttl_s:g} s): it bounds how long transfers alone may keep a link fresh")
        control = default_control(env)
        max_connections = number("TAME_MAX_CONNECTIONS", 1000, 1, 1_000_000, int)
        # Each ceiling from 1 to its hard cap, which is its default: unset, a site may ask for what it always could.
        caps = SITE_HARD_CAPS.to_json()
        settings = cls(
            congestion_control=control,
            site=default_site(env),
            database_url=url,
            db_pool_size=number("TAME_DB_POOL_SIZE", DEFAULT_POOL_SIZE, 1, 1000, int),
            token=token,
            read_token=read_token,
            site_tokens=site_tokens(env, token, read_token),
            allowed=AllowList.parse(env.get("TAME_ALLOWED_DESTINATIONS") or DEFAULT_ALLOWED,
                                    env.get("TAME_ALLOWED_PORTS") or None),
            ttl_s=ttl_s,
            probe_max_age_s=probe_max_age_s,
            max_concurrent_probes=number("TAME_MAX_CONCURRENT_PROBES", 1, 1, 64, int),
            model=model,
            default_levels=levels,
            default_duration_s=number("TAME_PROBE_DURATION_S", ProbePlan.duration_s, 1.0, 300.0),
            max_probe_duration_s=number("TAME_PROBE_MAX_DURATION_S", ProbePlan.max_duration_s, 1.0,
                                        MAX_PROBE_MAX_DURATION_S),
            omit_s=number("TAME_PROBE_OMIT_S", ProbePlan.omit_s, 0.0, MAX_PROBE_OMIT_S),
            reuse_adaptive_max_age_s=number("TAME_PROBE_REUSE_MAX_AGE_S", REUSE_MAX_AGE_TTLS * ttl_s, 0.0,
                                            100 * 365 * 86400.0),
            max_batch=number("TAME_MAX_BATCH", 1000, 1, 100_000, int),
            max_queued_probes=number("TAME_MAX_QUEUED_PROBES", 500, 1, 1_000_000, int),
            max_queued_probes_per_client=number("TAME_MAX_QUEUED_PROBES_PER_CLIENT", 50, 1, 1_000_000, int),
            forwarded_allow_ips=forwarded_allow_ips(env),
            keepalive_timeout_s=number("TAME_KEEPALIVE_TIMEOUT_S", 5.0, 0.1, 300.0),
            header_timeout_s=number("TAME_HEADER_TIMEOUT_S", 10.0, 0.1, 300.0),
            body_timeout_s=number("TAME_BODY_TIMEOUT_S", 30.0, 0.1, 3600.0),
            max_connections=max_connections,
            max_client_connections=number("TAME_MAX_CLIENT_CONNECTIONS", min(100, max_connections), 1,
                                          max_connections, int),
            backlog=number("TAME_BACKLOG", 2048, 1, 65535, int),
            max_large_bodies=number("TAME_MAX_LARGE_BODIES", 4, 1, 1024, int),
            large_body_wait_s=number("TAME_LARGE_BODY_WAIT_S", 5.0, 0.0, 300.0),
            max_site_links=number("TAME_MAX_SITE_LINKS", MAX_SITE_LINKS, 1, 10_000_000, int),
            max_sites=number("TAME_MAX_SITES", MAX_SITES, 1, 1_000_000, int),
            retention=Retention(
                keep_fits=number("TAME_KEEP_FITS", 20, 1, 1_000_000, int),
                keep_runs=number("TAME_KEEP_RUNS", 20, 1, 1_000_000, int),
                run_max_age_s=run_max_age_s(env, ttl_s, number),
                keep_observations=number("TAME_KEEP_OBSERVATIONS", 1000, REFIT_OBSERVATIONS, 100_000_000, int),
                interval_s=number("TAME_PRUNE_INTERVAL_S", 60.0, 0.0, 7 * 86400.0),
                batch=number("TAME_PRUNE_BATCH", 500, 1, 100_000, int),
            ),
            site_ceiling=SiteBudget(**{name: number(variable, caps[name], 1, caps[name], type(caps[name]))
                                       for name, variable in SITE_CEILING_VARIABLES.items()}),
        )
        check_site_ceiling(settings, env)
        return settings
