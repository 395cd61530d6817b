"""The admin API: models loaded and unloaded while serving. Mounted only when the server has
admin keys (`--admin-key`, `--admin-key-file`), which are its own: an API key does not open it,
and an admin key opens nothing else (`server/auth.py`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from pydantic import ValidationError
from starlette.responses import Response

from infinity_cloud.core.config import ModelSpec, error_lines
from infinity_cloud.core.errors import InvalidInputError
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute

PREFIX = "/admin"
router = APIRouter(
    prefix=PREFIX, tags=["admin"], route_class=JsonRoute,
    responses=error_responses(statuses=(400, 401, 404, 408, 409, 413, 422, 500)),
)


@router.get("/models", summary="Every model, its state (loading, ready, draining, failed) and facts")
async def list_models(request: Request) -> Response:
    return json_response({"object": "list", "data": request.app.state.engine.describe()})


@router.post(
    "/models", status_code=202,
    summary="Load a model while serving: 202 at once; it answers 503 with Retry-After until ready",
)
async def load_model(request: Request, body: dict[str, Any] = Body(...)) -> Response:  # noqa: B008
    """The body is a model of the deployment spec (`model_id`, `served_model_name`, `backend`,
    `dtype`, ...). 409 when a name it takes is served; 413 when its weights would not fit the
    memory budget beside the loaded models."""
    try:
        spec = ModelSpec.model_validate(body)
    except ValidationError as exc:
        raise InvalidInputError("; ".join(error_lines(exc))) from None
    model = await request.app.state.engine.add_model(spec)
    return json_response({"object": "model", **model.describe()}, status=202)


@router.delete("/models/{name:path}", summary="Unload a model: drain what it was given, then free it")
async def unload_model(name: str, request: Request) -> Response:
    """New requests to it get 503 at once; those already admitted finish; then its memory is
    given back (`freed_bytes`: the process's resident memory before less after)."""
    return json_response({"object": "model.deleted", **await request.app.state.engine.remove_model(name)})
