"""The HTTP API: create_app(settings, store, driver) builds it; nothing is opened at import time.

Error mapping to HTTP statuses lives here and only here:
InvalidRequest -> 422 (TooManyLinks, a new link past a site's TAME_MAX_SITE_LINKS, and TooManySites, a new site past
TAME_MAX_SITES, among them), BatchTooLarge ->
413, DestinationNotAllowed and WrongSite -> 403, UnknownDestination and UnknownProbe -> 404, BudgetConflict -> 409,
QueueFull -> 429 and LookupUnfinished (a destination's name lookup did not finish: the name slow to resolve, or the
service's lookups all busy) -> 503, both with Retry-After, StoreError -> 503 (with a generic message; the detail is
logged); a body that is not JSON, or gives a key twice in one object, or holds a NUL in a string (api/bodies.py), or
does not fit its schema -> 422. Tokens, body caps and body deadlines are checked
before any route, by api/boundary.py: when TAME_TOKEN is set, writes need ``Authorization: Bearer TOKEN``; when TAME_READ_TOKEN is set, reads (the docs
included) need it or the write token. A site's token (TAME_SITE_TOKENS) reads, and writes only links from
its site: the boundary checks /v1/sites/SITE, the write routes a body's src (api.boundary.check_src). /healthz
is always open. /docs serves Swagger UI from
assets shipped in the fastapi-offline package, so it works offline.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles

from advisor import idempotency
from advisor.allowlist import RESOLVE_TIMEOUT_S, Resolver, system_resolver
from advisor.destinations import parse_destination
from advisor.errors import (BatchTooLarge, BudgetConflict, DestinationNotAllowed, InvalidRequest, LookupUnfinished,
                            QueueFull, RetryLater, StoreError, UnknownDestination, UnknownProbe, WrongSite)
from advisor.retention import Pruner
from advisor.service import AdviceService
from advisor.settings import Settings
from advisor.sites import SiteBudget
from advisor.store import Store, StoredRun
from advisor.terminal import visible
from advisor.worker import ProbeWorker
from api import schemas
from api.bodies import UniqueKeysRoute
from api.boundary import Boundary, body_caps, check_src
from api.fastpath import ADVICE_PARAMETERS, AdviceFastPath, advice_query
from api.metrics import Metrics, MetricsMiddleware
from probes.base import ProbeDriver
from probes.result import ProbeResult

_STATUS = {
    BatchTooLarge: 413,
    DestinationNotAllowed: 403,
    WrongSite: 403,
    UnknownDestination: 404,
    UnknownProbe: 404,
    BudgetConflict: 409,
    InvalidRequest: 422,
    QueueFull: 429,
    LookupUnfinished: 503,
    StoreError: 503,
}
# What a stored write answers, the first time and when sent again under its Idempotency-Key.
_WRITE_STATUS = {idempotency.PROBE_RUN: 201, idempotency.OBSERVATION: 202}
STORE_UNAVAILABLE = "the advice store is unavailable; try again shortly"
_ERROR_MEANING = {
    401: "a token is configured and the request did not carry it",
    403: "the destination is outside the operator's allow-list (TAME_ALLOWED_DESTINATIONS), or the token is a "
         "site's (TAME_SITE_TOKENS) and the request writes for another site's links or names no src",
    404: "unknown destination or probe",
    408: "the body did not arrive within TAME_BODY_TIMEOUT_S",
    409: "the site's live agents run with another budget (the detail names it and who set it): run every agent "
         "of a site with the same budget, or stop the other one",
    413: "the body, or the batch, is larger than this route takes",
    422: "malformed input (a body that is not JSON or gives a key twice in one object, a field out of range), a "
         "site's budget above the operator's ceiling (TAME_MAX_SITE_PROBES, TAME_MAX_SITE_STREAMS, "
         "TAME_MAX_SITE_PROBE_SECONDS_PER_HOUR), a new link from a site that has TAME_MAX_SITE_LINKS links "
         "already, or a new site past TAME_MAX_SITES; the detail says what to give instead",
    429: "the probe queue is full, in total or for this client; ask again after Retry-After seconds",
    503: "the advice store is unavailable, the server is at its connection limit, it is reading as many bodies "
         "over 1 MiB as it reads at once (TAME_MAX_LARGE_BODIES), or the destination's name lookup did not "
         f"finish: it did not resolve within {RESOLVE_TIMEOUT_S:g} s, or the service's name lookups were all busy "
         "and it was not looked up (give its address); send it again after Retry-After seconds when given",
}


def _responses(*codes: int) -> dict[int, dict]:
    """The error statuses a route may answer, as the OpenAPI schema documents them (one ErrorOut body each)."""
    out: dict[int, dict] = {}
    for code in codes:
        out[code] = {"model": schemas.ErrorOut, "description": _ERROR_MEANING[code]}
        if code in (429, 503):  # a 503 has it when too many large bodies are being read (api/boundary.py), or lookups
            out[code]["headers"] = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
    return out


# A write's answer; also when it was sent again under its Idempotency-Key, answered from the first (nothing stored).
_REPLAYABLE = {"description": "stored; or, sent again under its Idempotency-Key, the first answer (nothing stored)",
               "headers": {"Idempotent-Replayed": {"description": "true when this answers a request sent again",
                                                   "schema": {"type": "string", "enum": ["true"]}}}}

# Every route may answer 401 (tokens), 422 and 503; those that take a body also 408 and 413 (api/boundary.py).
_ERRORS = _responses(401, 404, 422, 503)
_BODY_ERRORS = _responses(401, 404, 408, 413, 422, 503)

log = logging.getLogger("tame.api")


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload, separators=(",", ":")).encode(), status_code=status,
                    media_type="application/json")


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":  # api/bodies.py: its message says what is wrong and where
            parts.append(error["ctx"]["error"])
            continue
        # A key the schema does not take is named as sent: its control and bidi characters as escapes.
        where = visible(".".join(str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path")))
        parts.append(f"{where or 'request'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def create_app(settings: Settings, store: Store, driver: ProbeDriver | None = None, *,
               clock: Callable[[], float] = time.time, resolver: Resolver = system_resolver,
               start_worker: bool = True, on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The API over ``store``; with a ``driver`` a local probe worker drains the queue while the app runs;
    ``on_shutdown`` runs last as it stops (`tame serve` closes the store there: uvicorn re-raises SIGTERM after
    its shutdown, so code after it never runs)."""
    service = AdviceService(store, settings, clock=clock, resolver=resolver)
    metrics = Metrics(service.staleness, service.cache_reads)
    worker = ProbeWorker(service, driver, on_probe=metrics.observe_probe) if driver is not None else None
    # The worker prunes the store and re-queues jobs whose lease ran out while it runs; a server without one
    # (`tame serve --no-worker`) does both itself, so an agent that died holding a claim does not hold it for ever.
    pruner = Pruner(store, settings.retention, recover=lambda: store.recover_jobs(
        settings.max_probe_attempts, local_src=settings.site)) if worker is None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if worker is not None and start_worker:
            worker.start()
        if pruner is not None:
            pruner.start()
        try:
            yield
        finally:
            if pruner is not None:
                await run_in_threadpool(pruner.stop)
            if worker is not None and start_worker:
                await run_in_threadpool(worker.stop)
            if on_shutdown is not None:
                on_shutdown()

    app = FastAPI(title="TameParallelTCP advice service", version="1", lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  description="How many parallel TCP streams to use to a destination, and what they cost other traffic.")
    # Every route added below reads its JSON body refusing a key given twice (api/bodies.py).
    app.router.route_class = UniqueKeysRoute
    app.state.settings = settings
    app.state.service = service
    app.state.worker = worker
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    async def _advisor_error(request: Request, exc: Exception):
        status = next(code for kind, code in _STATUS.items() if isinstance(exc, kind))
        retry = {"Retry-After": str(max(1, round(exc.retry_after_s)))} if isinstance(exc, RetryLater) else None
        if isinstance(exc, StoreError):
            # The store's text can carry SQL and data (a key's value); it goes to the log only.
            log.error("%s %s: %s", request.method, request.url.path, exc)
            return JSONResponse({"detail": STORE_UNAVAILABLE}, status_code=status)
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=retry)

    for kind in _STATUS:
        app.add_exception_handler(kind, _advisor_error)

    @app.exception_handler(idempotency.AlreadyTaken)
    async def _replayed(request: Request, exc: idempotency.AlreadyTaken):
        # Sent again under its Idempotency-Key: the first request's answer, nothing stored.
        response = _json(exc.answer, _WRITE_STATUS[exc.kind])
        response.headers["Idempotent-Replayed"] = "true"
        return response

    def _keyed(kind: str, key: str | None, body: BaseModel,
               exclude: set[str] = frozenset()) -> idempotency.KeyedRequest | None:
        if key is None:
            return None
        # One request whether its src is left out or names the site it resolves to.
        src = service.site(body.src)
        fields = body.model_dump(mode="json", exclude={"src", *exclude}, exclude_defaults=True)
        return idempotency.KeyedRequest.checked(src, kind, key, {**fields, "src": src})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _describe_validation(exc)}, status_code=422)

    @app.get("/v1/advice", response_model=schemas.AdviceOut, responses=_ERRORS,
             openapi_extra={"parameters": ADVICE_PARAMETERS})
    async def get_advice(request: Request) -> Response:
        # The fast path answered what was cached; this parses the same query with the same function.
        dest, budget, control, src = advice_query(request.scope["query_string"])
        entry, age_s, stale = await run_in_threadpool(service.advice_entry, dest, budget, control, src)
        metrics.advice_served.labels("true" if stale else "false").inc()
        return Response(entry.json_bytes(age_s, stale), media_type="application/json")

    @app.post("/v1/advice:batch", response_model=schemas.BatchOut, responses=_BODY_ERRORS)
    def post_batch(items: list[schemas.AdviceQuery], cc: schemas.Control | None = None,
                   src: schemas.Site | None = None) -> Response:
        # ?cc= and ?src= are the control and site of the items that name none (each item's own wins).
        results = service.batch([(item.dest, item.max_impact, item.cc or cc, item.src or src) for item in items])
        return Response(b'{"results":[' + b",".join(results) + b"]}", media_type="application/json")

    @app.post("/v1/probes", status_code=202, response_model=schemas.ProbeAccepted,
              responses={**_BODY_ERRORS, **_responses(403, 429)})
    def post_probe(body: schemas.ProbeRequest, request: Request) -> Response:
        check_src(request, body.src)
        client = request.client.host if request.client else None
        job, created = service.request_probe(body.dest, body.levels, body.duration_s, client=client,
                                             congestion_control=body.congestion_control, src=body.src)
        return _json({"id": job.id, "src": job.src, "dest": job.dest, "congestion_control": job.congestion_control,
                      "status": job.status, "created": created}, 202)

    @app.get("/v1/probes/{probe_id}", response_model=schemas.ProbeStatus, responses=_ERRORS)
    def get_probe(probe_id: str) -> Response:
        return _json(service.probe_status(probe_id))

    @app.get("/v1/paths", response_model=schemas.PathsOut, responses=_ERRORS)
    def get_paths(src: schemas.Site | None = None) -> Response:
        return _json({"paths": service.paths(src)})

    @app.get("/v1/links", response_model=schemas.LinksOut, responses=_ERRORS)
    def get_links(src: schemas.Site | None = None) -> Response:
        return _json({"site": settings.site, "links": service.links(src)})

    @app.get("/v1/paths/{dest}/curve", response_model=schemas.CurveOut, responses=_ERRORS)
    def get_curve(dest: str, cc: schemas.Control | None = None, src: schemas.Site | None = None) -> Response:
        return _json(service.curve(dest, cc, src))

    @app.post("/v1/observations", status_code=202, response_model=schemas.ObservationOut,
              responses={**_BODY_ERRORS, **_responses(403), 202: _REPLAYABLE})
    def post_observation(body: schemas.ObservationIn, request: Request,
                         idempotency_key: schemas.IdempotencyKey = None) -> Response:
        check_src(request, body.src)
        keyed = _keyed(idempotency.OBSERVATION, idempotency_key, body)
        return _json(service.observe(body.dest, body.streams, body.throughput_bps, request=keyed, **body.detail()),
                     _WRITE_STATUS[idempotency.OBSERVATION])

    @app.post("/v1/probe-runs", status_code=201, response_model=schemas.ProbeRunOut,
              responses={**_BODY_ERRORS, **_responses(403), 201: _REPLAYABLE})
    def post_probe_run(body: schemas.ProbeRunIn, request: Request,
                       idempotency_key: schemas.IdempotencyKey = None) -> Response:
        check_src(request, body.src)
        # A re-sent run's age has grown since the first send: the one field that may differ under one key.
        keyed = _keyed(idempotency.PROBE_RUN, idempotency_key, body, exclude={"measured_ago_s"})
        dest = parse_destination(body.dest)
        # A pushed run becomes advice schedulers read, as an observation does: only where probes are allowed.
        service.check_allowed(dest)
        src = service.site(body.src)
        claimed = service.claimed_job(body.job_id, body.owner, src, dest)
        # A claimed probe was asked to run under its job's control: a run under another closes it as failed
        # (ingest_run says so) and is kept as that other control's advice.
        results = [ProbeResult(dest=dest.key, congestion_control=body.congestion_control if claimed else None,
                               **p.result_fields()) for p in body.probes]
        asked = claimed.congestion_control if claimed else body.congestion_control

        def answer(run: StoredRun, error: str | None) -> dict[str, Any]:
            return {"src": src, "dest": dest.key, "probe_run_id": run.id, "congestion_control": run.congestion_control,
                    "fitted": error is None, "error": error, "current": run.current, "history": run.history_note()}

        run, error = service.ingest_run(dest, body.idle_rtt_s, results, body.started_at or clock(), source="push",
                                           congestion_control=asked, src=src,
                                           job_id=claimed.id if claimed else None, job_owner=body.owner,
                                           measured_ago_s=body.measured_ago_s, request=keyed, answer=answer,
                                           job=claimed)
        return _json(answer(run, error), _WRITE_STATUS[idempotency.PROBE_RUN])

    @app.put("/v1/sites/{site}", response_model=schemas.SiteOut, responses={**_BODY_ERRORS, **_responses(403, 409)})
    def put_site(site: str, body: schemas.SiteIn) -> Response:
        budget = SiteBudget.checked(body.max_probes, body.max_streams, body.probe_seconds_per_hour)
        return _json(service.register_site(site, budget, body.dests, body.congestion_control, body.owner))

    @app.post("/v1/sites/{site}/claims", response_model=schemas.ClaimOut, responses={**_BODY_ERRORS, **_responses(403)})
    def post_claim(site: str, body: schemas.ClaimIn) -> Response:
        return _json(service.claim(site, body.owner, body.max_streams, body.holding))

    @app.post("/v1/sites/{site}/claims/{probe_id}/failure", response_model=schemas.ProbeStatus,
              responses={**_BODY_ERRORS, **_responses(403)})
    def post_claim_failure(site: str, probe_id: str, body: schemas.ClaimFailureIn) -> Response:
        # The attempt counts what it took of the site's budget, not its whole lease, and its job queues again.
        return _json(service.fail_claim(site, probe_id, body.owner, body.error))

    @app.post("/v1/sites/{site}/claims/{probe_id}/release", response_model=schemas.ProbeStatus,
              responses={**_BODY_ERRORS, **_responses(403)})
    def post_claim_release(site: str, probe_id: str, body: schemas.ClaimReleaseIn) -> Response:
        # An agent that stops hands its probe back: queued again now, charged what it took, not counted an attempt;
        # one whose lookup of the name did not finish, to wait (service.release_claim).
        return _json(service.release_claim(site, probe_id, body.owner, body.lookup_error))

    @app.get("/healthz", response_model=schemas.Health, responses=_responses(503))
    def healthz() -> Response:
        store.job_counts()  # touches the database; StoreError -> 503
        return _json({"status": "ok", "database": store.db.dialect})

    @app.get("/metrics", responses={200: {"description": "Prometheus text format",
                                          "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}},
                                    **_responses(401, 503)})
    def get_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    assets = _swagger_assets()
    app.mount("/docs/assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} - Swagger UI",
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css",
                                   swagger_favicon_url="/docs/assets/favicon.png", oauth2_redirect_url=None)

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=f"{app.title} - ReDoc",
                              redoc_js_url="/docs/assets/redoc.standalone.js",
                              redoc_favicon_url="/docs/assets/favicon.png", with_google_fonts=False)

    # Added last, so they run first: warm advice never reaches FastAPI's routing (see api/fastpath.py),
    # and nothing runs before the boundary's token and size checks.
    app.add_middleware(AdviceFastPath, service=service, metrics=metrics)
    caps = body_caps(settings.max_batch)

    def refused(method: str, path: str, status: int) -> None:
        metrics.requests.labels(method, path if path in caps else "unmatched", str(status)).inc()

    app.add_middleware(Boundary, token=settings.token, read_token=settings.read_token, caps=caps,
                       body_timeout_s=settings.body_timeout_s, site_tokens=settings.site_tokens, on_refused=refused,
                       max_large_bodies=settings.max_large_bodies, large_body_wait_s=settings.large_body_wait_s)
    return app


def _swagger_assets() -> str:
    """The folder of Swagger UI's and ReDoc's JavaScript and CSS that the fastapi-offline package ships."""
    import importlib.resources

    return str(importlib.resources.files("fastapi_offline") / "static")
