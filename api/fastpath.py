"""GET /v1/advice: one query parser and one serialisation, used by the warm-cache fast path and the route.

The fast path answers a request whose advice is cached straight from the ASGI scope, without FastAPI's
routing, with the bytes the route would send (AdviceEntry.json_bytes); anything else (a miss, a query
that does not parse, a stale entry whose re-probe must be queued) falls through to the route, which
parses the same query with the same function and reports what is wrong. The token has been checked by
api/boundary.py, which runs before this.
"""

from __future__ import annotations

import re
import time
from urllib.parse import unquote_plus

from advisor.errors import InvalidRequest
from advisor.limits import MAX_DEST_LENGTH, check_congestion_control, check_max_impact, check_site
from advisor.service import AdviceService
from api.metrics import Metrics

_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_HEADERS = [(b"content-type", b"application/json")]

# The query parameters as the OpenAPI schema describes them (the route reads them with advice_query).
ADVICE_PARAMETERS = [
    {"name": "src", "in": "query", "required": False,
     "description": "the link's source site (default: the service's own, TAME_SITE); advice is kept per link",
     "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$", "maxLength": 64}},
    {"name": "dest", "in": "query", "required": True, "description": "HOST[:PORT] (default port 5201), IPv6 as [ADDR]:PORT",
     "schema": {"type": "string", "minLength": 1, "maxLength": MAX_DEST_LENGTH}},
    {"name": "max_impact", "in": "query", "required": True, "description": "impact budget, fraction 0-1",
     "schema": {"type": "number", "minimum": 0, "maximum": 1}},
    {"name": "cc", "in": "query", "required": False,
     "description": "TCP congestion control the streams will use, e.g. cubic, bbr, reno (default: the service's, "
                    "its host's default); advice is kept per destination and control",
     "schema": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,14}$"}},
]


def advice_query(query_string: bytes) -> tuple[str, float, str | None, str | None]:
    """(dest, max_impact, cc or None, src or None) from GET /v1/advice's query string; InvalidRequest says what is
    wrong.

    The first value of each parameter counts; other parameters are ignored."""
    values: dict[str, str] = {}
    for part in query_string.decode("latin-1").split("&"):
        name, _, value = part.partition("=")
        if name in ("dest", "max_impact", "cc", "src") and name not in values:
            values[name] = unquote_plus(value) if ("%" in value or "+" in value) else value
    dest, budget_text = values.get("dest"), values.get("max_impact")
    if not dest:
        raise InvalidRequest("dest: give the destination as ?dest=HOST[:PORT]")
    if len(dest) > MAX_DEST_LENGTH:
        raise InvalidRequest(f"dest: at most {MAX_DEST_LENGTH} characters")
    if budget_text is None or not _NUMBER.fullmatch(budget_text):
        raise InvalidRequest("max_impact: give the impact budget as a fraction 0-1, e.g. &max_impact=0.1")
    control, src = values.get("cc"), values.get("src")
    return (dest, check_max_impact(float(budget_text)), None if control is None else check_congestion_control(control, "cc"),
            None if src is None else check_site(src))


class AdviceFastPath:
    def __init__(self, app, service: AdviceService, metrics: Metrics):
        self.app = app
        self.service = service
        self._requests = metrics.requests.labels("GET", "/v1/advice", "200")
        self._latency = metrics.latency.labels("/v1/advice")
        self._served = {False: metrics.advice_served.labels("false"), True: metrics.advice_served.labels("true")}

    def _answer(self, scope) -> bytes | None:
        try:
            dest, budget, control, src = advice_query(scope["query_string"])
        except InvalidRequest:
            return None
        hit = self.service.cached_entry(dest, budget, control, src)
        if hit is None:
            return None
        entry, age_s, stale = hit
        self._served[stale].inc()
        return entry.json_bytes(age_s, stale)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/v1/advice":
            started = time.perf_counter()
            body = self._answer(scope)
            if body is not None:
                await send({"type": "http.response.start", "status": 200,
                            "headers": _HEADERS + [(b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                self._requests.inc()
                self._latency.observe(time.perf_counter() - started)
                return
        await self.app(scope, receive, send)
