"""The FastAPI application: ``create_app(settings) -> FastAPI``.

The app only reads and writes the database and the file store; tuning never runs inside a
request (workers claim queued jobs, see :mod:`service.worker`). Model validation, the one heavy
step of a request, runs in a worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response

import db
from service import validation
from service.api.deps import API_PREFIX, ServiceState
from service.api.errors import install_error_handlers
from service.api.main import api_router
from service.api.request_guard import BodyLimits, RequestGuard
from service.dashboard import install_dashboard
from service.files import FileStore
from service.history_cache import HistoryCache
from service.metrics import Metrics
from service.security_headers import SecurityHeaders
from service.settings import Settings

logger = logging.getLogger("tunehub.service")
VALIDATION_ERROR_SCHEMA = {
    "title": "ValidationErrorBody",
    "type": "object",
    "required": ["detail", "code"],
    "properties": {
        "detail": {"type": "string"},
        "code": {"type": "string", "enum": ["invalid_request"]},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "loc": {"type": "array", "items": {"type": "string"}},
                    "msg": {"type": "string"},
                },
            },
        },
    },
}


def open_service_storage(settings: Settings) -> db.TuningStorage:
    """The embedded default database is created on first use; any other must be upgraded by
    ``tunehub db upgrade`` first (raises :class:`db.SchemaOutdatedError` naming the command)."""
    url, embedded = settings.resolved_database_url()
    if embedded:
        settings.home_dir().mkdir(parents=True, exist_ok=True)
    return db.open_storage(url, upgrade=embedded, pool_size=settings.api_threads + 2)


class _MetricsMiddleware:
    def __init__(self, app, metrics: Metrics) -> None:
        self.app = metrics.middleware(app)

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)


def create_app(
    settings: Settings | None = None, *, storage: db.TuningStorage | None = None
) -> FastAPI:
    settings = settings or Settings()
    owns = storage is None
    storage = storage or open_service_storage(settings)
    files = FileStore(settings.resolved_storage_dir()).ensure()
    # What interrupted requests of a dead server left (kill -9 included); live processes'
    # folders are kept (service.files).
    swept = files.sweep_tmp()
    if swept:
        logger.info("removed %d abandoned temporary entries from %s", swept, files.tmp)
    metrics = Metrics(storage, settings.stale_after_secs)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        # Few request threads, each with a pooled connection: 40 threads (anyio's default)
        # fighting over the GIL and a smaller pool only add queueing.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        # The process holds millions of long-lived objects (TVM, torch, ONNX for validation):
        # move them out of the collector's view so a full collection does not stall requests
        # for hundreds of milliseconds.
        gc.collect()
        gc.freeze()
        # Uploads validate in processes forked from a fork server that imports the compiler
        # once (seconds): start it now, not on the first upload.
        threading.Thread(target=validation.warm_up, name="validation-warm-up", daemon=True).start()
        yield
        if owns:
            storage.close()

    app = FastAPI(
        title="TuneHub",
        summary="Upload a model, tune it with TVM MetaSchedule, download a verified library.",
        version="1",
        lifespan=lifespan,
        docs_url="/docs",
        openapi_url="/openapi.json",
        # FastAPI's built-in OpenTelemetry instrumentation costs milliseconds per request when an
        # OpenTelemetry API is installed; TuneHub exports Prometheus metrics instead.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.tunehub = ServiceState(
        settings=settings,
        storage=storage,
        files=files,
        owns_storage=owns,
        history=HistoryCache(settings.history_cache_jobs),
    )
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(api_router)
    install_dashboard(app)
    # Outermost last: security headers on every answer; metrics count the guard's refusals;
    # the guard checks tokens and bounds bodies before any route reads one.
    app.add_middleware(
        RequestGuard,
        state=app.state.tunehub,
        routes=lambda: app.routes,
        limits=BodyLimits.from_settings(settings),
    )
    app.add_middleware(_MetricsMiddleware, metrics=metrics)
    app.add_middleware(SecurityHeaders)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            # Validation errors use the one error body too (see service.api.errors).
            schema.setdefault("components", {}).setdefault("schemas", {})["HTTPValidationError"] = (
                VALIDATION_ERROR_SCHEMA
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics(request: Request) -> Response:
        if not settings.metrics_public:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            state: ServiceState = app.state.tunehub
            if scheme.lower() != "bearer" or state.principal(token.strip()) is None:
                return JSONResponse(
                    {"detail": "metrics need an API token", "code": "unauthorized"},
                    401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/", include_in_schema=False)
    async def root() -> JSONResponse:
        return JSONResponse(
            {
                "name": "TuneHub",
                "api": API_PREFIX,
                "docs": "/docs",
                "openapi": "/openapi.json",
                "dashboard": "/dashboard/",
            }
        )

    return app
