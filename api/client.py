"""The client schedulers (and `tame agent --push`) use to talk to a `tame serve`."""

from __future__ import annotations

from typing import Any, Sequence

import httpx


class TameError(Exception):
    """The service answered with an error; ``status`` is the HTTP status, the message its detail."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class TameClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TameClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TameError(0, f"cannot reach the advice service: {exc}") from exc
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise TameError(response.status_code, str(detail))
        return response.json()

    def advice(self, dest: str, max_impact: float, cc: str | None = None, src: str | None = None) -> dict[str, Any]:
        """GET /v1/advice for the link from ``src`` (None: the service's own site) to ``dest``."""
        params: dict[str, Any] = {"dest": dest, "max_impact": max_impact,
                                  **_given(cc=cc, src=src)}
        return self._call("GET", "/v1/advice", params=params)

    def batch(self, queries: Sequence[tuple[str, float]], cc: str | None = None,
              src: str | None = None) -> list[dict[str, Any]]:
        """POST /v1/advice:batch of (dest, max_impact) pairs, under ``cc`` from ``src`` (None: the service's)."""
        body = [{"dest": d, "max_impact": m} for d, m in queries]
        return self._call("POST", "/v1/advice:batch", json=body, params=_given(cc=cc, src=src))["results"]

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
        return self._call("GET", f"/v1/probes/{probe_id}")

    def paths(self, src: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/paths", params=_given(src=src))["paths"]

    def links(self, src: str | None = None) -> dict[str, Any]:
        """GET /v1/links: {"site": the service's own site, "links": [...]}."""
        return self._call("GET", "/v1/links", params=_given(src=src))

    def curve(self, dest: str, cc: str | None = None, src: str | None = None) -> dict[str, Any]:
        return self._call("GET", f"/v1/paths/{httpx.URL(path=dest).raw_path.decode()}/curve",
                          params=_given(cc=cc, src=src))

    def observe(self, dest: str, streams: int, throughput_bps: float, **detail: Any) -> dict[str, Any]:
        """POST /v1/observations; ``detail``: its optional fields (src, congestion_control, stream_bps,
        fractional_multiplier, ...; None values are left out)."""
        body = {"dest": dest, "streams": streams, "throughput_bps": throughput_bps,
                **{k: v for k, v in detail.items() if v is not None}}
        return self._call("POST", "/v1/observations", json=body)

    def push_probe_run(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/probe-runs", json=payload)

    def register_site(self, site: str, dests: Sequence[str], budget: dict[str, Any],
                      congestion_control: str | None = None, owner: str | None = None) -> dict[str, Any]:
        """PUT /v1/sites/SITE: the site's links (dests) and probe budget (advisor.sites.SiteBudget.to_json()), from
        agent ``owner`` (409 when the site's live agents run with another budget)."""
        body = {"dests": list(dests), **budget, **_given(congestion_control=congestion_control, owner=owner)}
        return self._call("PUT", f"/v1/sites/{httpx.URL(path=site).raw_path.decode()}", json=body)

    def claim(self, site: str, owner: str, max_streams: int) -> dict[str, Any]:
        """POST /v1/sites/SITE/claims: the site's next due probe for agent ``owner`` ({"job": None} when none)."""
        return self._call("POST", f"/v1/sites/{httpx.URL(path=site).raw_path.decode()}/claims",
                          json={"owner": owner, "max_streams": max_streams})


def _given(**values: Any) -> dict[str, Any]:
    """The optional parameters that were given (None: leave it to the service)."""
    return {name: value for name, value in values.items() if value is not None}
