"""SageMaker's single entry point (`/invocations`): any request body, forwarded to the route
it is for, which answers it as it answers its own (its dialects told apart as there)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from infinity_cloud.asks import EmbedAsk
from infinity_cloud.capability import ROUTE_NAMES, Capability
from infinity_cloud.errors import InvalidInputError, UnsupportedError
from infinity_cloud.per_input import setting_aside
from infinity_cloud.server.dialects.common import RerankRequest
from infinity_cloud.server.dialects.infinity import ClassifyRequest
from infinity_cloud.server.dialects.openai import EmbeddingRequest
from infinity_cloud.server.dialects.registry import Dialect, Mount
from infinity_cloud.server.dialects.tei import TeiErrorBody
from infinity_cloud.server.encoding import json_response
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
# What this container tells the Batch Transform agent it does best (GET /execution-parameters):
# several mini-batches at once keep the batcher fed; 6 MB of text is thousands of records.
BATCH_CONCURRENCY = 4
BATCH_PAYLOAD_MB = 6


@router.get("/execution-parameters", summary="SageMaker Batch Transform: the settings it does best")
async def execution_parameters(request: Request) -> Response:
    limit_mb = request.app.state.engine.limits.max_payload_bytes // 2**20
    return json_response({"MaxConcurrentTransforms": BATCH_CONCURRENCY, "BatchStrategy": "MULTI_RECORD",
                          "MaxPayloadInMB": max(1, min(BATCH_PAYLOAD_MB, limit_mb))})


async def _json_lines(request: Request, body: bytes) -> Response:
    """A Batch Transform mini-batch: one record a line ({"text": ...}, {"input": ...} or a
    JSON string), answered one line each, in order ({"embedding": [...]}, or {"error": ...}
    for a record the model refuses), so the agent's output lines match its input lines."""
    lines = body.decode("utf-8").split("\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the newline that ends the last record
    texts: list[str] = []
    where: list[int] = []
    answers: list[dict[str, Any]] = [{} for _ in lines]
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError as exc:
            answers[number] = {"error": f"line {number + 1} is not JSON: {exc}"}
            continue
        text = record if isinstance(record, str) else (
            record.get("text", record.get("input")) if isinstance(record, dict) else None)
        if not isinstance(text, str):
            answers[number] = {"error": f"line {number + 1} has no text (a JSON string, or an object "
                                        "with a \"text\" field)"}
            continue
        texts.append(text)
        where.append(number)
    engine = request.app.state.engine
    result, kept, refused = await setting_aside(
        lambda batch: engine.embeddings(EmbedAsk(batch, accepts=(Capability.EMBED,))), texts)
    for index, reason in refused.items():
        answers[where[index]] = {"error": reason}
    if result is not None:
        for row, index in enumerate(kept):
            answers[where[index]] = {"embedding": result.embeddings[row].tolist()}
    out = b"".join(orjson.dumps(answer) + b"\n" for answer in answers)
    return Response(out, media_type="application/jsonlines")


@router.post(
    "/invocations", summary="SageMaker entry point: embeddings, rerank or classify", openapi_extra=_OPENAPI
)
async def invocations(request: Request) -> Response:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in JSON_LINES:
        return await _json_lines(request, await request.body())
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
