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
        """GET /v1/advice for the link ``src`` (a site; None: the server's own) to ``dest``."""
        params: dict[str, Any] = {"dest": dest, "max_impact": max_impact}
        if cc is not None:
            params["cc"] = cc
        if src is not None:
            params["src"] = src
        return self._call("GET", "/v1/advice", params=params)

    def batch(self, queries: Sequence[tuple[str, float]]) -> list[dict[str, Any]]:
        body = [{"dest": d, "max_impact": m} for d, m in queries]
        return self._call("POST", "/v1/advice:batch", json=body)["results"]

    def request_probe(self, dest: str, levels: Sequence[int] | None = None, duration_s: float | None = None,
                      congestion_control: str | None = None) -> dict:
        body: dict[str, Any] = {"dest": dest}
        if congestion_control is not None:
            body["congestion_control"] = congestion_control
        if levels is not None:
            body["levels"] = list(levels)
        if duration_s is not None:
            body["duration_s"] = duration_s
        return self._call("POST", "/v1/probes", json=body)

    def probe(self, probe_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/probes/{probe_id}")

    def paths(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/paths")["paths"]

    def curve(self, dest: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/paths/{httpx.URL(path=dest).raw_path.decode()}/curve")

    def observe(self, dest: str, streams: int, throughput_bps: float, **detail: Any) -> dict[str, Any]:
        """POST /v1/observations; ``detail``: its optional fields (src, congestion_control, stream_bps,
        fractional_multiplier, ...; None values are left out)."""
        body = {"dest": dest, "streams": streams, "throughput_bps": throughput_bps,
                **{k: v for k, v in detail.items() if v is not None}}
        return self._call("POST", "/v1/observations", json=body)

    def push_probe_run(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/probe-runs", json=payload)
