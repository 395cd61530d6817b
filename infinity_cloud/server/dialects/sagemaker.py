"""SageMaker's single entry point (`/invocations`): any request body, forwarded to the route
it is for, which answers it as it answers its own (its dialects told apart as there)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from infinity_cloud.core.capability import ROUTE_NAMES, Capability
from infinity_cloud.core.errors import InvalidInputError, UnsupportedError
from infinity_cloud.core.results import ClassifyResult
from infinity_cloud.server.dialects.batch_transform import answer_mini_batch
from infinity_cloud.server.dialects.common import RerankRequest
from infinity_cloud.server.dialects.infinity import ClassifyRequest, classify_ask, classify_body
from infinity_cloud.server.dialects.openai import EmbeddingRequest, embed_ask, embeddings_response
from infinity_cloud.server.dialects.registry import Dialect, Mount, validated
from infinity_cloud.server.dialects.tei import TeiErrorBody
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.engine_calls import answer, in_own_terms
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
    """A body that is no request of any route (neither `query` nor `input`): the schema of
    what its model does, whose 422 names the field that model's route needs."""
    if "query" in data:
        return "rerank"
    facts = request.app.state.engine.facts_of(
        data.get("model") if isinstance(data.get("model"), str) else None,
        Capability.EMBED, Capability.CLASSIFY, Capability.MULTI_VECTOR,
    )
    return ROUTE_NAMES.get(Capability(facts.capability), "embeddings")


async def _embed_or_classify(request: Request, data: dict[str, Any]) -> Response:
    """A body with `input` and no route named: embeddings for an embedder, classify for a
    classifier, in one engine call (the engine answers the ask its model does). A body only
    one of the two schemas takes goes to that route."""
    try:
        as_classify: ClassifyRequest | None = validated(ClassifyRequest, data)  # type: ignore[assignment]
    except RequestValidationError:
        as_classify = None
    try:
        as_embed = validated(EmbeddingRequest, data)
    except RequestValidationError:
        if as_classify is None:
            raise
        return await _forward(request, "classify", data)
    assert isinstance(as_embed, EmbeddingRequest)
    if as_classify is None or as_embed.late_chunking or "/classify" not in request.app.state.bodies:
        return await _forward(request, "embeddings", data)
    embed = embed_ask(as_embed, request)
    with in_own_terms(as_embed.field_names()):
        result = await answer(
            request, as_embed.model, len(embed.inputs),
            request.app.state.engine.by_model_type((embed, classify_ask(as_classify))),
            (*embed.accepts, Capability.CLASSIFY),
        )
    if isinstance(result, ClassifyResult):
        return json_response(classify_body(result))
    return embeddings_response(result, as_embed.encoding_format)


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
    route = _route_from_header(request)
    if route is None and "input" in data and "query" not in data:
        return await _embed_or_classify(request, data)
    return await _forward(request, route or _route_from_body(request, data), data)


async def _forward(request: Request, route: str, data: dict[str, Any]) -> Response:
    """`data` answered by `route` as it answers its own (dialects.registry.mount's bodies of
    that path: its dialects told apart as there)."""
    bodies = request.app.state.bodies.get(f"/{route}")
    if bodies is None:  # an app built without the dialect that serves it
        raise UnsupportedError(f"route {route!r} is not served by this app", param="route")
    return await bodies.answer(data, request)


DIALECT = Dialect("SageMaker", mounts=(Mount(router),))
