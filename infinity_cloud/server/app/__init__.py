"""The one app factory every target calls."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Security
from fastapi.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from infinity_cloud.core.config import DeploymentSpec, ServerSpec
from infinity_cloud.core.version import __version__
from infinity_cloud.engine import Engine
from infinity_cloud.families import input_kinds
from infinity_cloud.server import admin_routes, status_routes
from infinity_cloud.server.auth import ApiKeyGate, admin_key_scheme, api_key_scheme
from infinity_cloud.server.dialects import DIALECTS, Dialect
from infinity_cloud.server.dialects.registry import mount
from infinity_cloud.server.docs import DOCS_ASSETS, add_docs
from infinity_cloud.server.engine_calls import ClientDisconnected
from infinity_cloud.server.errors import EXCEPTION_HANDLERS, CatchBugs
from infinity_cloud.server.metrics import Metrics
from infinity_cloud.server.middleware import BodyLimit, CacheControl
from infinity_cloud.server.openapi import with_limits
from infinity_cloud.server.request_id import RequestId
from infinity_cloud.server.tracing import TraceRequests, Tracing

log = logging.getLogger(__name__)


async def _client_gone(_: Request, __: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it; nginx's code for "client closed"


def _load_in_background(engine: Engine) -> asyncio.Task[Engine]:
    task = asyncio.create_task(engine.start())

    def report(done: asyncio.Task[Engine]) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.error("model loading failed: %s", done.exception())

    task.add_done_callback(report)
    return task


def create_app(
    engine: Engine | DeploymentSpec | None = None,
    *,
    manage_engine: bool = True,
    server: ServerSpec | None = None,
    dialects: Sequence[Dialect] = DIALECTS,
) -> FastAPI:
    """Build the HTTP app around an engine (built from the spec when given a spec).

    Models not loaded yet are loaded in the background at start-up, so /health answers 503
    until they are ready. With `manage_engine`, the app stops the engine at shutdown.
    `server` replaces the spec's HTTP settings, for a target that learns them (its API keys)
    only after the engine was built. `dialects` are the wire dialects served (all by default).
    """
    if not isinstance(engine, Engine):
        engine = Engine(engine)
    spec = engine.spec if server is None else engine.spec.model_copy(update={"server": server})
    metrics = Metrics()
    engine.observers.append(metrics.observe_batch)
    tracing = None
    if spec.server.otlp_endpoint:  # the SDK imported only then (server/tracing.py)
        tracing = Tracing(spec.server.otlp_endpoint)
        engine.observers.append(tracing.observe_batch)
    if engine.cache.enabled:
        metrics.watch_cache(engine.cache.describe)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.cache.start()  # an engine loaded before the loop ran (Engine.loaded) connects here
        loader = None
        if any(m.state == "loading" for m in engine.models.values()):
            loader = _load_in_background(engine)
        yield
        if loader is not None and not loader.done():
            await asyncio.wait({loader})
        if manage_engine:
            await engine.stop()
        if tracing is not None:
            engine.observers.remove(tracing.observe_batch)
            await asyncio.to_thread(tracing.shutdown)  # exports what is buffered

    prefix = spec.server.url_prefix
    app = FastAPI(
        title="infinity-cloud",
        version=__version__,
        description="Embeddings, reranking and classification behind an OpenAI-compatible API.",
        lifespan=lifespan,
        # Bare HTTP clients often send no Content-Type at all; read the body as JSON then.
        strict_content_type=False,
        docs_url=None,  # our own /docs, below: its assets are served here, not from a CDN
        redoc_url=None,
        openapi_url=f"{prefix}/openapi.json",
        exception_handlers={**EXCEPTION_HANDLERS, ClientDisconnected: _client_gone},
    )
    # The kinds of input as the families' registry holds them now (a request's are checked
    # against it as it is read: `dialects.common.Kind`).
    kinds = {"all": input_kinds().names, "ranked": input_kinds(ranked=True).names}
    app.openapi = with_limits(app, spec.server.limits, kinds)  # type: ignore[method-assign]
    app.state.engine = engine
    app.state.spec = spec
    app.state.metrics = metrics
    app.state.started_at = int(time.time())

    # The document declares a key only where one is asked for (a client generated from it sends
    # what it says); ApiKeyGate does the checking.
    protected = [Security(api_key_scheme)] if spec.server.keys else []
    app.state.bodies = mount(app, dialects, prefix, protected)
    # Not dialects: what every client and orchestrator asks of the server.
    app.include_router(status_routes.models_router, prefix=prefix, dependencies=protected)
    app.include_router(
        status_routes.models_router, prefix=f"{prefix}/v1", dependencies=protected,
        generate_unique_id_function=lambda route: f"v1_{route.name}",
    )
    app.include_router(status_routes.metrics_router, prefix=prefix, dependencies=protected)
    app.include_router(status_routes.health_router, prefix=prefix)
    admin_keys = spec.server.admin
    if admin_keys:  # no admin API without its own keys
        app.include_router(admin_routes.router, prefix=prefix, dependencies=[Security(admin_key_scheme)])

    app.add_middleware(BodyLimit, max_bytes=spec.server.limits.max_payload_bytes)
    app.add_middleware(CacheControl)
    # Outside the body limit: a caller without a key is refused before any byte is read.
    add_docs(app, prefix)
    open_paths = {f"{prefix}{path}" for path in ("/health", "/ping", "/docs", "/openapi.json")}
    app.add_middleware(
        ApiKeyGate, keys=spec.server.keys, open_paths=open_paths, open_prefix=f"{prefix}{DOCS_ASSETS}/",
        admin_keys=admin_keys, admin_prefix=f"{prefix}{admin_routes.PREFIX}" if admin_keys else None,
    )
    app.add_middleware(CatchBugs)
    app.add_middleware(RequestId)  # outermost but CORS: every answer, 401s and 500s too, carries it
    if tracing is not None:  # around every layer: a request's span ends with its answer's last byte
        app.add_middleware(TraceRequests, tracing=tracing)
    if spec.server.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(spec.server.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Retry-After", "X-Request-Id"],
        )
    return app
