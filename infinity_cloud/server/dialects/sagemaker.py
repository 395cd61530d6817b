"""SageMaker's single entry point (`/invocations`): any request body, forwarded to the route
it is for, which answers it as it answers its own (its dialects told apart as there)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from infinity_cloud.capability import ROUTE_NAMES, Capability
from infinity_cloud.errors import InvalidInputError, UnsupportedError
from infinity_cloud.server.dialects.batch_transform import answer_mini_batch
from infinity_cloud.server.dialects.common import RerankRequest
from infinity_cloud.server.dialects.infinity import ClassifyRequest
from infinity_cloud.server.dialects.openai import EmbeddingRequest
from infinity_cloud.server.dialects.registry import Dialect, Mount
from infinity_cloud.server.dialects.tei import TeiErrorBody
from infinity_cloud.server.errors import ErrorBody, error_responses
from infinity_cloud.server.parsing import JsonRoute, parse_json

# The routes a body may be for, by the custom attribute's name; their request models.
_ROUTES = {ROUTE_NAMES[Capability.EMBED]: EmbeddingRequest, ROUTE_NAMES[Capability.RERANK]: RerankRequest,
           ROUTE_NAMES[Capability.CLASSIFY]: ClassifyRequest}

# A TEI rerank body is answered as /rerank answers it: in TEI's shape but for a 422.
router = APIRouter(tags=["sagemaker"], route_class=JsonRoute,
                   responses=error_responses(ErrorBody | TeiErrorBody, validation=ErrorBody))


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
    facts = engine.facts_of(data.get("model") if isinstance(data.get("model"), str) else None,
                            Capability.EMBED, Capability.CLASSIFY, Capability.MULTI_VECTOR)
    capability = Capability(facts.capability)
    if "input" in data:
        return "classify" if capability is Capability.CLASSIFY else "embeddings"
    return ROUTE_NAMES.get(capability, "embeddings")


# The body is read here, not by FastAPI, so the document is told what it may be.
_OPENAPI = {
    "parameters": [{
        "name": "X-Amzn-SageMaker-Custom-Attributes", "in": "header", "required": False,
        "schema": {"type": "string"}, "description": f"route=<{'|'.join(_ROUTES)}>; else the body tells",
    }],
    "requestBody": {"required": True, "content": {"application/json": {"schema": {"anyOf": [
        {"$ref": f"#/components/schemas/{schema.__name__}"} for schema in _ROUTES.values()
    ]}}}},
}


# Batch Transform sends records split by line (SplitType=Line) several at a time
# (BatchStrategy=MultiRecord) with the job's ContentType; one of these makes a body JSON Lines.
JSON_LINES = ("application/jsonlines", "application/jsonl", "application/x-jsonlines", "application/x-ndjson")
# (What the Batch Transform agent is told to send, GET /execution-parameters, is answered
# beside /ping, in status_routes: it reads the memory budget, as /health does.)


@router.post(
    "/invocations", summary="SageMaker entry point: embeddings, rerank or classify", openapi_extra=_OPENAPI
)
async def invocations(request: Request) -> Response:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in JSON_LINES:
        return await answer_mini_batch(request.app.state.engine, await request.body())
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
    # The app's bodies of that path (dialects.registry.mount): its dialects told apart as there.
    bodies = request.app.state.bodies.get(f"/{route}")
    if bodies is None:  # an app built without the dialect that serves it
        raise UnsupportedError(f"route {route!r} is not served by this app", param="route")
    return await bodies.answer(data, request)


DIALECT = Dialect("SageMaker", mounts=(Mount(router),))
