"""Cohere's embed API (`/v1/embed`, `/v2/embed`): the cohere SDK, langchain-cohere, litellm's
`cohere/` models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.errors import InvalidInputError, UnsupportedError
from infinity_cloud.server.calls import answer
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.protocol import CohereEmbedRequest
from infinity_cloud.server.responses import cohere_embed_body
from infinity_cloud.tasks.quantization import PACKED_TYPES

router = APIRouter(tags=["embeddings"])

SERVED_TYPES = ("float", *PACKED_TYPES)
# Cohere's input types, and the sentence-transformers prompt names that mean the same.
PROMPTS_FOR = {
    "search_query": ("query", "search_query"),
    "search_document": ("document", "passage", "search_document"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


async def cohere_embed(body: CohereEmbedRequest, request: Request, version: int) -> Response:
    engine = request.app.state.engine
    if body.images or body.input_type == "image":
        raise UnsupportedError("images are not served here: this server embeds text", param="images")
    if body.truncate == "START":
        raise InvalidInputError(
            "truncate START (dropping the start of long texts) is not supported; use END or NONE",
            param="truncate",
        )
    unserved = [t for t in body.embedding_types or () if t not in SERVED_TYPES]
    if unserved:
        raise InvalidInputError(
            f"embedding type {unserved[0]!r} is not served; ask for {', '.join(SERVED_TYPES)} "
            "(int8 and uint8 need a calibration this server does not have yet)",
            param="embedding_types",
        )
    # A prompt the model declares for this use (e5's "query: ", ...); none: the text as is.
    declared = engine.prompts(body.model)
    prompt = next((p for p in PROMPTS_FOR.get(body.input_type or "", ()) if p in declared), None)
    result = await answer(request, "embed", body.model, len(body.texts), engine.embed(
        body.texts, body.model, dimensions=body.output_dimension, truncate=body.truncate != "NONE",
        prompt_name=prompt,
    ))
    return json_response(cohere_embed_body(result, body.texts, body.embedding_types, version))


@router.post("/v1/embed", summary="Embed texts (Cohere v1 shape)")
async def embed_v1(body: CohereEmbedRequest, request: Request) -> Response:
    return await cohere_embed(body, request, 1)


@router.post("/v2/embed", summary="Embed texts (Cohere v2 shape)")
async def embed_v2(body: CohereEmbedRequest, request: Request) -> Response:
    return await cohere_embed(body, request, 2)
