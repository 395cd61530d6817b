"""Cohere's embed API (`/v1/embed`, `/v2/embed`): the cohere SDK, langchain-cohere, litellm's
`cohere/` models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.capability import Capability
from infinity_cloud.errors import InvalidInputError
from infinity_cloud.server.calls import answer
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute
from infinity_cloud.server.protocol import CohereEmbedRequest
from infinity_cloud.server.responses import cohere_embed_body
from infinity_cloud.tasks.embed import prompt_for_use
from infinity_cloud.tasks.quantization import EMBEDDING_TYPES
from infinity_cloud.validation import check_embedding_types

router = APIRouter(tags=["embeddings"], route_class=JsonRoute, responses=error_responses())

async def cohere_embed(body: CohereEmbedRequest, request: Request, version: int) -> Response:
    engine = request.app.state.engine
    model = engine.model(body.model, Capability.EMBED).name
    if body.truncate == "START":
        raise InvalidInputError(
            "truncate START (dropping the start of long texts) is not supported; use END or NONE",
            param="truncate",
        )
    check_embedding_types(body.embedding_types or (), EMBEDDING_TYPES)  # before any work
    if body.images:  # Cohere v2 sends images as data URIs, for a model that embeds images
        inputs, modality, prompt = body.images, "image", None
    else:
        inputs, modality = body.texts or [], "text"
        prompt = prompt_for_use(body.input_type, engine.prompts(model))
    result = await answer(request, "embed", model, len(inputs), engine.embed(
        inputs, model, dimensions=body.output_dimension, truncate=body.truncate != "NONE",
        prompt_name=prompt, modality=modality, wait=False,
        # The types asked are made from floats; without any, the model's --embedding-dtype.
        output_dtype=None if body.embedding_types is None else "float32",
    ))
    types = body.embedding_types
    if types is None:
        by_type = None if result.dtype == "float32" else {result.dtype: result.embeddings}
    else:
        by_type = {t: await engine.quantize(result, t, body.output_dimension, wait=False) for t in types}
    return json_response(cohere_embed_body(result, body.texts or [], by_type, version))


@router.post("/v1/embed", summary="Embed texts (Cohere v1 shape)")
async def embed_v1(body: CohereEmbedRequest, request: Request) -> Response:
    return await cohere_embed(body, request, 1)


@router.post("/v2/embed", summary="Embed texts (Cohere v2 shape)")
async def embed_v2(body: CohereEmbedRequest, request: Request) -> Response:
    return await cohere_embed(body, request, 2)
