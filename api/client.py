"""The client schedulers (and `tame agent --push`) use to talk to a `tame serve`."""

from __future__ import annotations

import re
from urllib.parse import quote
from typing import Any, Sequence

import httpx

from advisor.errors import InvalidRequest
from advisor.limits import check_token

# "scheme://" at the start: the user part of a URL follows it (or starts the text when it is missing).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class InvalidServiceURL(ValueError):
    """A service URL is not http(s)://HOST[:PORT]; the message names where it came from and hides its password."""


def shown_url(url: str) -> str:
    """``url`` with its user part and the values of its query as ***: the only form of a service URL a message may
    show (http://***@host:8000/?token=***)."""
    # Secrecy before legibility, on the text as written (it may not parse): the user part (a login may be the secret
    # itself, as in http://TOKEN@host) runs from "scheme://" to the last @, so one holding a raw @, / or ? is hidden
    # whole, a value without "scheme://" too, and an @ in the path or query hides more than the user part, never less.
    # Nothing is percent-decoded.
    match = _SCHEME.match(url)
    start, at = match.end() if match else 0, url.rfind("@")
    head, rest = (f"{url[:start]}***", url[at:]) if at >= start else (url[:start], url[start:])
    path, question, query = rest.partition("?")
    return head + path + question + "&".join(_shown_parameter(item) for item in query.split("&")) if question \
        else head + rest


def _shown_parameter(item: str) -> str:
    """One key=value of a query with its value as *** (a bare value whole)."""
    key, equals, value = item.partition("=")
    if not equals:
        return "***" if item else item
    return f"{key}=***" if value else item


def check_url(url: str, source: str = "base_url") -> None:
    """Refuse (InvalidServiceURL, naming ``source``: TAME_URL, --server, ...) a ``url`` not http(s)://HOST[:PORT], or
    one holding a user name or password."""
    try:
        parsed = httpx.URL(url)
        host = parsed.host  # decoded from IDNA: UnicodeError (idna's) for a host such as xn--zz
    except (httpx.InvalidURL, UnicodeError):
        # httpx's message repeats pieces of the URL, a password among them: it stays out of ours.
        why = "is not a valid URL"
    else:
        if parsed.scheme not in ("http", "https"):
            why = "is not an http or https URL"
        elif not host:
            why = "has no host"
        elif not _resolvable(parsed.raw_host):
            why = "has a host name with an empty label or one over 63 characters"
        elif parsed.port is not None and not 1 <= parsed.port <= 65535:
            why = "has a port outside 1-65535"
        elif parsed.userinfo:
            # httpx would send the URL's login as Basic auth in place of the Bearer token: every write would get 401.
            why = ("holds a login, and the service takes none: it reads the token from TAME_TOKEN (TAME_READ_TOKEN to "
                   "read only)")
        else:
            return
    # As the project names values elsewhere: --flag 'value', NAME='value'.
    named = f"{source} {shown_url(url)!r}" if source.startswith("-") else f"{source}={shown_url(url)!r}"
    raise InvalidServiceURL(f"{named} {why}: give the advice service's address as http://HOST:PORT "
                            "(or https://HOST:PORT)")


def _resolvable(raw_host: bytes) -> bool:
    """Whether the socket layer can look ``raw_host`` up: it encodes a name with the idna codec, which raises
    UnicodeError (a traceback, not a connection error) for an empty label (a..b, .a) or one over 63 characters."""
    try:
        raw_host.decode("ascii").encode("idna")
    except UnicodeError:
        return False
    return True


class InvalidToken(ValueError):
    """A token cannot go in an Authorization header (advisor.limits.check_token); the message never shows it."""


class TameError(Exception):
    """The service answered with an error; ``status`` is the HTTP status, the message its detail."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later: no answer (status 0), the service's trouble (5xx), a
        timeout or a rate limit; any other 4xx is the request's own fault."""
        return self.status in (0, 408, 429) or self.status >= 500

    def refused_unknown_key(self, key: str) -> bool:
        """True when the service refused the request's body for giving ``key``, a key its body schema does not take
        (a service older than that key): 422 naming it "Extra inputs are not permitted", as api/app.py words a key
        that a schema with extra="forbid" does not take; a refusal of the key's value is not this."""
        return self.status == 422 and f"{key}: Extra inputs are not permitted" in self.detail.split("; ")


class TameClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0):
        """A client of the service at ``base_url`` (InvalidServiceURL when it is not http(s)://HOST[:PORT]; InvalidToken
        when ``token`` is not printable ASCII without white space: httpx would put it in its error, or fail with a
        traceback)."""
        check_url(base_url)
        if token:
            try:
                check_token(token, "the token")
            except InvalidRequest as exc:
                raise InvalidToken(str(exc)) from None
        self.shown_url = shown_url(base_url)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TameClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, field: str | None = None, **kwargs) -> Any:
        """The service's answer to ``method path`` (an object), or its ``field`` when given; TameError otherwise."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TameError(0, f"cannot reach the advice service: {exc}") from exc
        try:
            answer = response.json()
        except ValueError:  # a proxy's or a captive portal's page, a redirect: not the service's answer
            answer = None
            is_json = False
        else:
            is_json = True
        if response.status_code >= 400:
            # The service's refusals are objects with a detail; anything else (a proxy's page) is shown a line of.
            detail = (answer["detail"] if isinstance(answer, dict) and "detail" in answer
                      else _line_of(response.text))
            raise TameError(response.status_code, str(detail))
        if not isinstance(answer, dict):  # every answer of the service is an object
            came = ("not JSON" if not is_json else f"JSON that is not a JSON object ({type(answer).__name__})")
            raise TameError(0, f"the advice service at {self.shown_url} answered HTTP {response.status_code} with "
                               f"{response.headers.get('content-type', 'no content type')!r:.80}, {came}: check that "
                               "it is the service's address (TAME_URL), not a proxy's or a login page's")
        if field is None:
            return answer
        if field not in answer:
            raise TameError(0, f"the advice service at {self.shown_url} answered HTTP {response.status_code} without "
                               f"{field!r}: check that it is the service's address (TAME_URL) and of this version")
        return answer[field]

    def advice(self, dest: str, max_impact: float, cc: str | None = None, src: str | None = None) -> dict[str, Any]:
        """GET /v1/advice for the link from ``src`` (None: the service's own site) to ``dest``."""
        params: dict[str, Any] = {"dest": dest, "max_impact": max_impact,
                                  **_given(cc=cc, src=src)}
        return self._call("GET", "/v1/advice", params=params)

    def batch(self, queries: Sequence[tuple[str, float]], cc: str | None = None,
              src: str | None = None) -> list[dict[str, Any]]:
        """POST /v1/advice:batch of (dest, max_impact) pairs, under ``cc`` from ``src`` (None: the service's)."""
        body = [{"dest": d, "max_impact": m} for d, m in queries]
        return self._call("POST", "/v1/advice:batch", "results", json=body, params=_given(cc=cc, src=src))

    def request_probe(self, dest: str, levels: Sequence[int] | None = None, duration_s: float | None = None,
                      congestion_control: str | None = None, src: str | None = None) -> dict:
        body: dict[str, Any] = {"dest": dest, **_given(src=src)}
        if congestion_control is not None:
            body["congestion_control"] = congestion_control
        if levels is not None:
            body["levels"] = list(levels)
        if duration_s is not None:
            body["duration_s"] = duration_s
        return self._call("POST", "/v1/probes", json=body)

    def probe(self, probe_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/probes/{_segment(probe_id)}")

    def paths(self, src: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/paths", "paths", params=_given(src=src))

    def links(self, src: str | None = None) -> dict[str, Any]:
        """GET /v1/links: {"site": the service's own site, "links": [...]}."""
        return self._call("GET", "/v1/links", params=_given(src=src))

    def own_site(self) -> str:
        """The service's own site (GET /v1/links' "site"): the one a run pushed without ``src`` is stored under."""
        return self._call("GET", "/v1/links", "site")

    def curve(self, dest: str, cc: str | None = None, src: str | None = None) -> dict[str, Any]:
        return self._call("GET", f"/v1/paths/{_segment(dest)}/curve",
                          params=_given(cc=cc, src=src))

    def observe(self, dest: str, streams: int, throughput_bps: float, idempotency_key: str | None = None,
                **detail: Any) -> dict[str, Any]:
        """POST /v1/observations; ``detail``: its optional fields (src, congestion_control, stream_bps,
        fractional_multiplier, ...; None values are left out). Sent again with the same ``idempotency_key``,
        it is stored once."""
        body = {"dest": dest, "streams": streams, "throughput_bps": throughput_bps,
                **{k: v for k, v in detail.items() if v is not None}}
        return self._call("POST", "/v1/observations", json=body, headers=_keyed(idempotency_key))

    def push_probe_run(self, payload: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """POST /v1/probe-runs; sent again with the same ``idempotency_key``, the run is stored once."""
        return self._call("POST", "/v1/probe-runs", json=payload, headers=_keyed(idempotency_key))

    def fail_claim(self, site: str, job_id: str, owner: str, error: str) -> dict[str, Any]:
        """POST /v1/sites/SITE/claims/ID/failure: agent ``owner`` could not run its claimed probe (``error``)."""
        return self._call("POST", f"/v1/sites/{_segment(site)}/claims/{_segment(job_id)}/failure",
                          json={"owner": owner, "error": error[:1000]})

    def release_claim(self, site: str, job_id: str, owner: str, lookup_error: str | None = None) -> dict[str, Any]:
        """POST /v1/sites/SITE/claims/ID/release: agent ``owner`` hands its claimed probe back, because it stops, or
        because its lookup of the destination's name did not finish (``lookup_error``: the job waits)."""
        return self._call("POST", f"/v1/sites/{_segment(site)}/claims/{_segment(job_id)}/release",
                          json={"owner": owner, **_given(lookup_error=None if lookup_error is None
                                                         else lookup_error[:1000])})

    def register_site(self, site: str, dests: Sequence[str], budget: dict[str, Any],
                      congestion_control: str | None = None, owner: str | None = None) -> dict[str, Any]:
        """PUT /v1/sites/SITE: the site's links (dests) and probe budget (advisor.sites.SiteBudget.to_json()), from
        agent ``owner`` (409 when the site's live agents run with another budget)."""
        body = {"dests": list(dests), **budget, **_given(congestion_control=congestion_control, owner=owner)}
        return self._call("PUT", f"/v1/sites/{_segment(site)}", json=body)

    def claim(self, site: str, owner: str, max_streams: int, holding: Sequence[str] = ()) -> dict[str, Any]:
        """POST /v1/sites/SITE/claims: the site's next due probe for agent ``owner`` ({"job": None} when none), which
        runs the probes ``holding`` (ids) now: one claimed in its name before and not among them comes first."""
        return self._call("POST", f"/v1/sites/{_segment(site)}/claims",
                          json={"owner": owner, "max_streams": max_streams, "holding": list(holding)})


# The most of an answer that is not the service's a TameError shows, characters.
SHOWN_TEXT_CHARS = 300


def _line_of(text: str) -> str:
    """The start of an answer's text that is not the service's (a proxy's error page) as one line of printable
    characters: it goes into messages a terminal shows, every round of an agent."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text[:SHOWN_TEXT_CHARS]).split())
    return line + (" …" if len(text) > SHOWN_TEXT_CHARS else "")


def _segment(text: str) -> str:
    """``text`` as one path segment, every reserved character escaped: a bare IPv6 destination (``::1``) would
    otherwise begin the path with ':', and '/', '?', '#' or '%' would end or change the segment."""
    return quote(text, safe="")


def _keyed(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}


def _given(**values: Any) -> dict[str, Any]:
    """The optional parameters that were given (None: leave it to the service)."""
    return {name: value for name, value in values.items() if value is not None}
