"""The HTTP API: create_app(settings, store, driver) builds it; nothing is opened at import time.

Error mapping to HTTP statuses lives here and only here:
InvalidRequest -> 422, BatchTooLarge -> 413, DestinationNotAllowed -> 403, UnknownDestination and
UnknownProbe -> 404, StoreError -> 503, a missing or wrong token -> 401.
Auth: when TAME_TOKEN is set, writes (POST) need ``Authorization: Bearer TOKEN``; when
TAME_READ_TOKEN is set, reads need it (or the write token). /healthz is always open.
"""

from __future__ import annotations

import hmac
import json
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from advisor.allowlist import Resolver, system_resolver
from advisor.destinations import parse_destination
from advisor.errors import (BatchTooLarge, DestinationNotAllowed, InvalidRequest, QueueFull, StoreError,
                            UnknownDestination, UnknownProbe)
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.store import Store
from advisor.worker import ProbeWorker
from api import schemas
from api.fastpath import AdviceFastPath
from api.metrics import Metrics, MetricsMiddleware
from probes.base import ProbeDriver
from probes.result import ProbeResult

_STATUS = {
    BatchTooLarge: 413,
    DestinationNotAllowed: 403,
    UnknownDestination: 404,
    UnknownProbe: 404,
    InvalidRequest: 422,
    QueueFull: 429,
    StoreError: 503,
}
_ERRORS = {404: {"model": schemas.ErrorOut}, 422: {"model": schemas.ErrorOut}, 503: {"model": schemas.ErrorOut}}


class Unauthorized(Exception):
    """A token is configured and the request did not carry it."""


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload, separators=(",", ":")).encode(), status_code=status,
                    media_type="application/json")


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path"))
        parts.append(f"{where or 'request'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def create_app(settings: Settings, store: Store, driver: ProbeDriver | None = None, *,
               clock: Callable[[], float] = time.time, resolver: Resolver = system_resolver,
               start_worker: bool = True) -> FastAPI:
    """The API over ``store``; with a ``driver`` a local probe worker drains the queue while the app runs."""
    service = AdviceService(store, settings, clock=clock, resolver=resolver)
    metrics = Metrics(service.staleness)
    worker = ProbeWorker(service, driver, on_probe=metrics.observe_probe) if driver is not None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if worker is not None and start_worker:
            worker.start()
        try:
            yield
        finally:
            if worker is not None and start_worker:
                await run_in_threadpool(worker.stop)

    app = FastAPI(title="TameParallelTCP advice service", version="1", lifespan=lifespan,
                  description="How many parallel TCP streams to use to a destination, and what they cost other traffic.")
    app.state.service = service
    app.state.worker = worker
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    def _token_ok(request: Request, *tokens: str | None) -> bool:
        return _header_token_ok(request.headers.get("authorization", ""), *tokens)

    def _header_token_ok(header: str, *tokens: str | None) -> bool:
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            return False
        return any(t is not None and hmac.compare_digest(given.encode(), t.encode()) for t in tokens)

    async def require_read(request: Request) -> None:
        if settings.read_token and not _token_ok(request, settings.read_token, settings.token):
            raise Unauthorized("reads need 'Authorization: Bearer TOKEN' (TAME_READ_TOKEN is set)")

    async def require_write(request: Request) -> None:
        if settings.token and not _token_ok(request, settings.token):
            raise Unauthorized("writes need 'Authorization: Bearer TOKEN' (TAME_TOKEN is set)")

    @app.exception_handler(Unauthorized)
    async def _unauthorized(request: Request, exc: Unauthorized):
        return JSONResponse({"detail": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    async def _advisor_error(request: Request, exc: Exception):
        status = next(code for kind, code in _STATUS.items() if isinstance(exc, kind))
        retry = {"Retry-After": str(max(1, round(exc.retry_after_s)))} if isinstance(exc, QueueFull) else None
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=retry)

    for kind in _STATUS:
        app.add_exception_handler(kind, _advisor_error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _describe_validation(exc)}, status_code=422)

    read = [Depends(require_read)]
    write = [Depends(require_write)]

    @app.get("/v1/advice", response_model=schemas.AdviceOut, dependencies=read, responses=_ERRORS)
    async def get_advice(dest: str = Query(min_length=1, max_length=300, description="HOST[:PORT]"),
                         max_impact: float = Query(description="impact budget, fraction 0-1")) -> Response:
        payload = service.cached_advice(dest, max_impact)
        if payload is None:
            payload = await run_in_threadpool(service.advice, dest, max_impact)
        metrics.advice_served.labels("true" if payload["stale"] else "false").inc()
        return _json(payload)

    @app.post("/v1/advice:batch", response_model=schemas.BatchOut, dependencies=read,
              responses={413: {"model": schemas.ErrorOut}, **_ERRORS})
    def post_batch(items: list[schemas.AdviceQuery]) -> Response:
        results = service.batch([(item.dest, item.max_impact) for item in items])
        return _json({"results": results})

    @app.post("/v1/probes", status_code=202, response_model=schemas.ProbeAccepted, dependencies=write,
              responses={403: {"model": schemas.ErrorOut}, 401: {"model": schemas.ErrorOut}, **_ERRORS})
    def post_probe(body: schemas.ProbeRequest) -> Response:
        job, created = service.request_probe(body.dest, body.levels, body.duration_s)
        return _json({"id": job.id, "dest": job.dest, "status": job.status, "created": created}, 202)

    @app.get("/v1/probes/{probe_id}", response_model=schemas.ProbeStatus, dependencies=read, responses=_ERRORS)
    def get_probe(probe_id: str) -> Response:
        return _json(service.probe_status(probe_id))

    @app.get("/v1/paths", response_model=schemas.PathsOut, dependencies=read, responses=_ERRORS)
    def get_paths() -> Response:
        return _json({"paths": service.paths()})

    @app.get("/v1/paths/{dest}/curve", response_model=schemas.CurveOut, dependencies=read, responses=_ERRORS)
    def get_curve(dest: str) -> Response:
        return _json(service.curve(dest))

    @app.post("/v1/observations", status_code=202, response_model=schemas.ObservationOut, dependencies=write,
              responses={401: {"model": schemas.ErrorOut}, **_ERRORS})
    def post_observation(body: schemas.ObservationIn) -> Response:
        return _json(service.observe(body.dest, body.streams, body.throughput_bps), 202)

    @app.post("/v1/probe-runs", status_code=201, response_model=schemas.ProbeRunOut, dependencies=write,
              responses={401: {"model": schemas.ErrorOut}, **_ERRORS})
    def post_probe_run(body: schemas.ProbeRunIn) -> Response:
        dest = parse_destination(body.dest)
        results = [ProbeResult(dest=dest.key, **p.result_fields()) for p in body.probes]
        run_id, error = service.ingest_run(dest, body.idle_rtt_s, results, body.started_at or clock(), source="push")
        return _json({"dest": dest.key, "probe_run_id": run_id, "fitted": error is None, "error": error}, 201)

    @app.get("/healthz", response_model=schemas.Health, responses={503: {"model": schemas.ErrorOut}})
    def healthz() -> Response:
        store.job_counts()  # touches the database; StoreError -> 503
        return _json({"status": "ok", "database": store.db.dialect})

    @app.get("/metrics", dependencies=read, response_class=PlainTextResponse)
    def get_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def fast_read_allowed(scope) -> bool:
        if not settings.read_token:
            return True
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"").decode("latin-1")
        return _header_token_ok(header, settings.read_token, settings.token)

    # Added last, so it runs first: warm advice never reaches FastAPI's routing (see api/fastpath.py).
    app.add_middleware(AdviceFastPath, service=service, metrics=metrics, read_allowed=fast_read_allowed)
    return app
