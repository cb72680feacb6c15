"""The server's boundary: a request is authenticated from its headers, and its body capped and timed,
before the app reads a byte of it.

Pure ASGI and outermost, so a request without the right token gets 401 with its body unread, and
a body over its route's cap gets 413 as soon as that is known: at once from Content-Length, or
when the bytes streamed in (a chunked body) pass the cap. Bodies within their cap are read here,
under TAME_BODY_TIMEOUT_S, and handed on whole, so the app never waits on a slow client.

Access classes: POST /v1/probes, /v1/probe-runs and /v1/observations, and everything under /v1/sites/
(an agent's registration and claims; any method on those paths) need TAME_TOKEN when it is set; /healthz is open; everything else, /docs and /openapi.json
included, needs TAME_READ_TOKEN or TAME_TOKEN when TAME_READ_TOKEN is set.

Bodies over LARGE_BODY_BYTES (only a probe run's can be, with the default TAME_MAX_BATCH) are read, parsed and
handled by at most TAME_MAX_LARGE_BODIES requests at once: buffering and parsing one costs about three times its size,
so TAME_MAX_CONNECTIONS of them at their cap would not fit in memory. One more waits TAME_LARGE_BODY_WAIT_S for its
turn, its body unread, then gets 503 with Retry-After; smaller bodies never wait.

A site's token (TAME_SITE_TOKENS) reads, and writes only that site's links: under /v1/sites/ only its own site's
paths (checked here, 403 otherwise), and the three write routes only a body whose src is its site (checked by the
routes with check_src, as only they parse the body). The site is put in the request's state (``token_site``) for
them; None there means a token for every site, or none needed. A request whose state has no ``token_site`` was not
seen by the boundary, and check_src refuses it: its absence never stands for "every site".
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
from typing import Any, Callable, Sequence

from advisor.errors import InvalidRequest, WrongSite
from advisor.limits import MAX_PROBE_STREAMS, check_site
from api import schemas
from probes.iperf_parse import RAW_MAX_CHARS

WRITE_PATHS = frozenset({"/v1/probes", "/v1/probe-runs", "/v1/observations"})
# Agents' routes: PUT /v1/sites/NAME, POST /v1/sites/NAME/claims.
SITES_PREFIX = "/v1/sites/"
OPEN_PATHS = frozenset({"/healthz"})

# A body on any route not in body_caps (none of them reads one) is refused past this.
OTHER_BODY_BYTES = 16 * 1024
# POST /v1/probes: a dest of at most 300 characters and a few numbers.
SMALL_BODY_BYTES = 16 * 1024
# POST /v1/observations: that, and up to MAX_STREAMS entries in each per-stream list: a number in under 32
# bytes, a congestion control's name (15 characters) quoted in under 24.
OBSERVATION_STREAM_BYTES = 32 + 32 + 24
# One batch item is a dest of at most 300 characters and a budget: under 400 bytes as compact JSON;
# 1 KiB leaves room for indentation and some escaped characters.
BATCH_ITEM_BYTES = 1024
# One pushed probe: its scalar fields (under 1 KiB), stream_bps and stream_retransmits for up to
# MAX_PROBE_STREAMS streams (what the schema takes; iperf3 opens no more) at under 32 bytes a number, and raw as JSON text, where
# quotes, backslashes and newlines take two bytes a character (iperf3's JSON output escapes no worse).
PROBE_RUN_FIELDS_BYTES = 4 * 1024
# PUT /v1/sites/NAME: its budget, and up to MAX_SITE_LINKS destinations of at most 300 characters, quoted.
SITE_FIELDS_BYTES = 4 * 1024
PROBE_FIELDS_BYTES = 2 * 1024 + 2 * MAX_PROBE_STREAMS * 32


# Bodies longer than this wait for one of the server's few turns at large bodies (Boundary, max_large_bodies). Above
# every route's cap but the probe runs' (and the batch's when TAME_MAX_BATCH is raised past 1024).
LARGE_BODY_BYTES = 1 << 20


def _max_length(model, name: str) -> int:
    """The max_length a schema field declares, so the caps follow api/schemas.py."""
    return next(m.max_length for m in model.model_fields[name].metadata if getattr(m, "max_length", None))


OBSERVATION_BODY_BYTES = SMALL_BODY_BYTES + _max_length(schemas.ObservationIn, "stream_bps") * OBSERVATION_STREAM_BYTES
PROBE_RAW_BYTES = 2 * RAW_MAX_CHARS
PROBE_RUN_BYTES = (PROBE_RUN_FIELDS_BYTES
                   + _max_length(schemas.ProbeRunIn, "probes") * (PROBE_FIELDS_BYTES + PROBE_RAW_BYTES))
SITE_BODY_BYTES = SITE_FIELDS_BYTES + _max_length(schemas.SiteIn, "dests") * (schemas.limits.MAX_DEST_LENGTH + 8)


def body_caps(max_batch: int) -> dict[str, int]:
    """The most bytes a request body may have, by path (others: OTHER_BODY_BYTES)."""
    return {
        "/v1/advice:batch": max_batch * BATCH_ITEM_BYTES,
        "/v1/probes": SMALL_BODY_BYTES,
        "/v1/observations": OBSERVATION_BODY_BYTES,
        "/v1/probe-runs": PROBE_RUN_BYTES,
        SITES_PREFIX: SITE_BODY_BYTES,
    }


def route_of(path: str) -> str:
    """The path a cap and an access class are kept under: the path itself, or SITES_PREFIX for an agent's route."""
    return SITES_PREFIX if path.startswith(SITES_PREFIX) else path


def bearer(header: str) -> bytes | None:
    """The token of an Authorization header value ``Bearer T``, or None."""
    scheme, _, given = header.partition(" ")
    return given.encode("latin-1") if scheme.lower() == "bearer" and given else None


def header_token_ok(header: str, *tokens: str | None) -> bool:
    """Whether an Authorization header value is ``Bearer T`` for one of ``tokens`` (constant-time compare)."""
    given = bearer(header)
    return given is not None and any(t is not None and hmac.compare_digest(given, t.encode()) for t in tokens)


# The key of the request's state the site of its token is kept under (None: a token for every site, or none needed).
# The boundary sets it on every request it lets through; a request without it did not pass the boundary.
TOKEN_SITE = "token_site"
_UNDECIDED = object()


def check_writer(token_site: str | None, src: Any, *, in_path: bool = False) -> None:
    """Refuse (WrongSite) a write for links from ``src`` (a body's src, None when it names none, or the SITE of
    /v1/sites/SITE when ``in_path``) made with site ``token_site``'s token; None: a token for every site."""
    if token_site is None:
        return
    try:
        named = None if src is None else check_site(src)
    except InvalidRequest:
        named = None
    if named == token_site:
        return
    if in_path:
        raise WrongSite(f"this token is {token_site}'s: it registers and claims only for {token_site}, not "
                        f"{named or 'that name'}; use /v1/sites/{token_site}")
    given = "the request names no src" if src is None else f"not from {named or 'that src'}"
    raise WrongSite(f"this token is {token_site}'s: it writes only links from {token_site}, {given}; "
                    f'give "src": "{token_site}"')


def check_src(request, src: Any) -> None:
    """check_writer for a route's request whose body names ``src``, with the site of the request's token;
    RuntimeError when the boundary did not decide that site (the app was assembled without it)."""
    token_site = getattr(request.state, TOKEN_SITE, _UNDECIDED)
    if token_site is _UNDECIDED:
        # A server bug, not the client's: it is answered 500 and logged with its traceback, and nothing is written.
        raise RuntimeError(f"a write route was reached without api.boundary.Boundary's {TOKEN_SITE!r}: the app "
                           "must run behind the boundary, which decides whose token the request carries")
    check_writer(token_site, src)


class Boundary:
    """ASGI middleware: token check from the headers, then the body read whole within its cap and deadline."""

    def __init__(self, app, *, token: str | None, read_token: str | None, caps: dict[str, int],
                 body_timeout_s: float, site_tokens: Sequence[tuple[str, str]] = (),
                 on_refused: Callable[[str, str, int], None] | None = None, max_large_bodies: int = 4,
                 large_body_wait_s: float = 5.0):
        if site_tokens and not token:
            raise ValueError("site tokens without a token for every site would leave writes open")
        self.app = app
        self.token = token
        self.read_token = read_token
        self.site_tokens = tuple((site, secret.encode()) for site, secret in site_tokens)
        self.caps = caps
        self.body_timeout_s = body_timeout_s
        self.on_refused = on_refused
        self.max_large_bodies = max_large_bodies
        self.large_body_wait_s = large_body_wait_s
        # The turns at large bodies, made in the loop that serves (an asyncio primitive belongs to one loop).
        self._large: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def _site_of(self, given: bytes | None) -> str | None:
        """The site whose token ``given`` is, or None; every site token is compared (each in constant time)."""
        found = None
        for site, secret in self.site_tokens:
            if given is not None and hmac.compare_digest(given, secret):
                found = site
        return found

    def _decide(self, path: str, authorization: bytes) -> tuple[str | None, tuple[int, str] | None]:
        """(the site of the request's token, or None; the refusal as (status, detail), or None)."""
        if path in OPEN_PATHS:
            return None, None
        header = authorization.decode("latin-1")
        site = self._site_of(bearer(header))
        if path in WRITE_PATHS or route_of(path) == SITES_PREFIX:
            if not self.token or header_token_ok(header, self.token):
                return None, None
            if site is None:
                return None, (401, "writes need 'Authorization: Bearer TOKEN' (TAME_TOKEN is set)")
            if route_of(path) == SITES_PREFIX:
                try:
                    check_writer(site, path[len(SITES_PREFIX):].split("/")[0], in_path=True)
                except WrongSite as exc:
                    return site, (403, str(exc))
            return site, None
        if self.read_token and site is None and not header_token_ok(header, self.read_token, self.token):
            return None, (401, "reads need 'Authorization: Bearer TOKEN' (TAME_READ_TOKEN is set)")
        return site, None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if len(path) > 1:
            path = path.rstrip("/")
        authorization = b""
        length = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        has_body = chunked or (length is not None and length != b"0")
        site, refusal = self._decide(path, authorization)
        if refusal is not None:
            status, detail = refusal
            challenge = {b"www-authenticate": b"Bearer"} if status == 401 else None
            return await self._refuse(scope, send, path, status, detail, has_body, challenge)
        # A state of this request's own (uvicorn copies the app's per request; another server might not). The site
        # is set even when it is None (TAME_TOKEN, or no token needed): check_src refuses a request without it.
        scope["state"] = {**scope.get("state", {}), TOKEN_SITE: site}
        if not has_body:
            return await self.app(scope, receive, send)
        cap = self.caps.get(route_of(path), OTHER_BODY_BYTES)
        if length is not None and not chunked:
            if not length.isdigit():
                return await self._refuse(scope, send, path, 400, "Content-Length is not a number", True)
            if int(length) > cap:
                return await self._refuse(scope, send, path, 413, _too_large(cap), True)
        turn = None
        try:
            if length is not None and not chunked and int(length) > LARGE_BODY_BYTES:
                turn = await self._large_turn()
                if turn is None:
                    return await self._busy(scope, send, path)
            body = bytearray()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.body_timeout_s
            while True:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    return await self._refuse(scope, send, path, 408,
                                              f"the request body did not arrive within {self.body_timeout_s:g} s", True)
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                if len(body) > cap:
                    return await self._refuse(scope, send, path, 413, _too_large(cap), True)
                if turn is None and len(body) > LARGE_BODY_BYTES:  # a chunked body: known large only now
                    waited_from = loop.time()
                    turn = await self._large_turn()
                    if turn is None:
                        return await self._busy(scope, send, path)
                    deadline += loop.time() - waited_from  # the wait was this server's, not the client's
                if not message.get("more_body", False):
                    break
            # The turn lasts until the response is sent: parsing the body takes more memory than reading it.
            return await self.app(scope, _replay(bytes(body), receive), send)
        finally:
            if turn is not None:
                turn.release()

    async def _large_turn(self) -> asyncio.Semaphore | None:
        """One of the max_large_bodies turns at a large body (to be released), or None when none came free within
        large_body_wait_s."""
        loop = asyncio.get_running_loop()
        if self._large is None or self._large[0] is not loop:
            self._large = (loop, asyncio.Semaphore(self.max_large_bodies))
        turns = self._large[1]
        try:
            async with asyncio.timeout(self.large_body_wait_s):
                await turns.acquire()
        except TimeoutError:
            return None
        return turns

    async def _busy(self, scope, send, path: str) -> None:
        retry_s = max(1, math.ceil(self.large_body_wait_s))
        return await self._refuse(
            scope, send, path, 503,
            f"this server is reading as many request bodies over {LARGE_BODY_BYTES} bytes as it reads at once "
            f"({self.max_large_bodies}, TAME_MAX_LARGE_BODIES); send it again in {retry_s} s", True,
            {b"retry-after": str(retry_s).encode()})

    async def _refuse(self, scope, send, path: str, status: int, detail: str, unread_body: bool,
                      extra: dict[bytes, bytes] | None = None) -> None:
        payload = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        headers += list((extra or {}).items())
        if unread_body:
            # The rest of the body is not wanted: closing stops the server reading it.
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        if self.on_refused is not None:
            self.on_refused(scope["method"], path, status)


def _too_large(cap: int) -> str:
    return f"the request body is larger than this endpoint accepts ({cap} bytes)"


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
