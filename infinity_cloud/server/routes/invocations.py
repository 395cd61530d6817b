"""SageMaker's single entry point: any request body, routed to the matching handler."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from infinity_cloud.capability import CALLS, Capability
from infinity_cloud.errors import InvalidInputError
from infinity_cloud.server.parsing import JsonRoute, parse_json
from infinity_cloud.server.protocol import ClassifyRequest, EmbeddingRequest, RerankRequest
from infinity_cloud.server.routes.classify import classify
from infinity_cloud.server.routes.embeddings import embeddings
from infinity_cloud.server.routes.rerank import TEI_TOO, rerank_infinity

# A TEI rerank body is answered as /rerank answers it.
router = APIRouter(tags=["sagemaker"], route_class=JsonRoute, responses=TEI_TOO)

_HANDLERS: dict[Capability, tuple[type[BaseModel], Any]] = {
    Capability.EMBED: (EmbeddingRequest, embeddings),
    Capability.RERANK: (RerankRequest, rerank_infinity),
    Capability.CLASSIFY: (ClassifyRequest, classify),
}
_ROUTES = {CALLS[capability]: handler for capability, handler in _HANDLERS.items()}


def _route_from_header(request: Request) -> str | None:
    attributes = request.headers.get("x-amzn-sagemaker-custom-attributes", "")
    for part in attributes.split(","):
        key, _, value = part.strip().partition("=")
        if key.strip() == "route":
            route = value.strip().strip("/")
            if route not in _ROUTES:
                raise InvalidInputError(
                    f"custom attribute route={route!r} is not one of {', '.join(_ROUTES)}", param="route"
                )
            return route
    return None


def _route_from_body(request: Request, data: dict[str, Any]) -> str:
    engine = request.app.state.engine
    if "query" in data:
        return "rerank"
    model = engine.model(data.get("model") if isinstance(data.get("model"), str) else None,
                         Capability.EMBED, Capability.CLASSIFY, Capability.MULTI_VECTOR)
    if "input" in data:
        return "classify" if model.capability is Capability.CLASSIFY else "embeddings"
    return CALLS.get(model.capability, "embeddings")


# The body is read here, not by FastAPI, so the document is told what it may be.
_OPENAPI = {
    "parameters": [{
        "name": "X-Amzn-SageMaker-Custom-Attributes", "in": "header", "required": False,
        "schema": {"type": "string"}, "description": f"route=<{'|'.join(_ROUTES)}>; else the body tells",
    }],
    "requestBody": {"required": True, "content": {"application/json": {"schema": {"anyOf": [
        {"$ref": f"#/components/schemas/{schema.__name__}"} for schema, _ in _ROUTES.values()
    ]}}}},
}


@router.post(
    "/invocations", summary="SageMaker entry point: embeddings, rerank or classify", openapi_extra=_OPENAPI
)
async def invocations(request: Request) -> Response:
    try:
        data = parse_json(await request.body())
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": f"JSON decode error: {exc}", "input": None}]
        ) from None
    if not isinstance(data, dict):
        raise RequestValidationError(
            [{"type": "dict_type", "loc": ("body",), "msg": "the body must be a JSON object", "input": None}]
        )
    route = _route_from_header(request) or _route_from_body(request, data)
    schema, handler = _ROUTES[route]
    try:
        body = schema.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        ) from None
    return await handler(body, request)
