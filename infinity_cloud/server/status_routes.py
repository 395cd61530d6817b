"""The routes every server has besides its dialects' and the admin API: models, health and
metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.core.errors import ModelNotFoundError, ModelNotReadyError
from infinity_cloud.server.dialects.batch_transform import transform_settings
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.errors import error_body, error_responses
from infinity_cloud.server.parsing import JsonRoute

models_router = APIRouter(tags=["models"], route_class=JsonRoute, responses=error_responses())
# Open to all, so no 401; a 503 while a model is not ready.
health_router = APIRouter(
    tags=["health"], route_class=JsonRoute, responses=error_responses(statuses=(408, 500, 503))
)
metrics_router = APIRouter(
    tags=["metrics"], route_class=JsonRoute, responses=error_responses(statuses=(401, 408, 500))
)


def _model_entries(request: Request) -> list[dict[str, Any]]:
    state = request.app.state
    return [
        # "infinity": the only value infinity_client's model schema accepts.
        {"object": "model", "owned_by": "infinity", "created": state.started_at, **entry}
        for entry in state.engine.describe()
    ]


@models_router.get("/models", summary="Served models, their capabilities and queue stats")
async def models(request: Request) -> Response:
    return json_response({"object": "list", "data": _model_entries(request)})


@models_router.get("/models/{model_id:path}", summary="One served model (OpenAI's models.retrieve)")
async def model(model_id: str, request: Request) -> Response:
    entries = _model_entries(request)
    found = next((entry for entry in entries if model_id in (entry["id"], *entry["aliases"])), None)
    if found is None:
        served = ", ".join(entry["id"] for entry in entries)
        raise ModelNotFoundError(f"model {model_id!r} is not served here; served models: {served}",
                                 param="model")
    return json_response(found)


@models_router.get("/", summary="What this server is: its models, and links to the rest")
async def front_page(request: Request) -> Response:
    from infinity_cloud.core.version import __version__

    base = request.url.path.rstrip("/")
    return json_response({
        "name": "infinity-cloud", "version": __version__,
        "models": [{key: entry.get(key) for key in ("id", "aliases", "state", "capabilities", "backend",
                                                    "dtype", "device", "dimensions")}
                   for entry in request.app.state.engine.describe()],
        "links": {name: f"{base}/{path}" for name, path in (
            ("docs", "docs"), ("openapi", "openapi.json"), ("models", "v1/models"),
            ("embeddings", "v1/embeddings"), ("rerank", "v1/rerank"), ("health", "health"),
            ("metrics", "metrics"),
        )},
    })


def _health(request: Request) -> Response:
    engine = request.app.state.engine
    models = [{"id": m["id"], "state": m["state"], **({"error": m["error"]} if "error" in m else {})}
              for m in engine.describe()]
    if engine.healthy:
        return json_response({"status": "ok", "models": models})
    unwell = [m for m in models if m["state"] != "ready" or "error" in m]
    problems = [f"{m['id']}: {m.get('error') or m['state']}" for m in unwell]
    if not engine.admits_minimal:
        problems.append(
            "the memory budget has not admitted a minimal request for longer than the deadline "
            f"({engine.memory.held_bytes // 2**20} MB held by requests in progress; /metrics has the "
            "process's resident memory and the budget)"
        )
    retry = ModelNotReadyError.retry_after_s
    message = f"not ready: {'; '.join(problems) or 'no model is loaded'}"
    body = error_body(message, "model_not_ready", 503, models=models, status="unavailable")
    return json_response(body, 503, {"Retry-After": str(retry)})


@health_router.get("/health", summary="200 when every model is loaded and its worker alive, else 503")
async def health(request: Request) -> Response:
    return _health(request)


@health_router.get("/ping", summary="SageMaker's health check: the same as /health")
async def ping(request: Request) -> Response:
    return _health(request)


# Behind the API key, as the SageMaker routes are (only /health and /ping are open).
@health_router.get("/execution-parameters", summary="SageMaker Batch Transform: the mini-batches to send",
                   responses=error_responses(statuses=(401,)))
async def execution_parameters(request: Request) -> Response:
    """The mini-batch size and how many at once (`MaxPayloadInMB`, `MaxConcurrentTransforms`),
    from what the memory budget leaves requests on the idle server and the body limit."""
    engine = request.app.state.engine
    settings = transform_settings(engine.memory.room_for_requests(), engine.limits.max_payload_bytes)
    return json_response(settings.as_execution_parameters())


# HEAD as load balancers probe: the same answer, kept out of the document (one operation a
# path and method there; a route for both methods gave both one operation id).
@health_router.head("/health", include_in_schema=False)
@health_router.head("/ping", include_in_schema=False)
async def health_head(request: Request) -> Response:
    return _health(request)


@metrics_router.get(
    # A bare Response class: FastAPI gives the error responses its media type, which is JSON.
    "/metrics", summary="Prometheus metrics", response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus' text format"}},
)
async def metrics(request: Request) -> Response:
    state = request.app.state
    queues = {m["id"]: m.get("stats", {}) for m in state.engine.describe()}
    body = state.metrics.render(queues, state.engine.memory)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
