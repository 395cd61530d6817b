"""Cohere's embed (`/v1/embed`, `/v2/embed`: the cohere SDK, langchain-cohere, litellm's
`cohere/` models) and rerank v2 (`/v2/rerank`); its v1 rerank shares `/v1/rerank` with Jina's."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, StrictStr, model_validator
from starlette.responses import Response

from infinity_cloud.capability import Capability
from infinity_cloud.errors import InvalidInputError
from infinity_cloud.results import EmbeddingResult, EmbeddingsByType, RerankResult
from infinity_cloud.server.dialects.common import (
    Item,
    NonNegative,
    RerankRequest,
    Texts,
    _Request,
    envelope,
    one_list_of,
    ranked,
)
from infinity_cloud.server.dialects.registry import Dialect, Mount
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.engine_calls import answer, truncation_named
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.openapi import Checked, Limit
from infinity_cloud.server.parsing import JsonRoute
from infinity_cloud.tasks.embed import prompt_for_use
from infinity_cloud.tasks.quantization import EMBEDDING_TYPES


class CohereEmbedRequest(_Request):
    """Cohere's embed (v1 and v2): texts, and how they will be used."""

    model_config = ConfigDict(json_schema_extra=one_list_of("texts", "images"))

    texts: Texts | None = Field(None, description="the texts to embed (or images)")
    input_type: (
        Literal["search_document", "search_query", "classification", "clustering", "image"] | None
    ) = Field(None, description="mapped to the model's matching prompt when it declares one")
    embedding_types: list[Annotated[StrictStr, Checked(enum=list(EMBEDDING_TYPES))]] | None = Field(
        None, description="float, int8, uint8 (calibrated per model, offline), binary, ubinary"
    )
    truncate: Literal["NONE", "START", "END"] = Field("END", description="NONE: too long is a 400")
    output_dimension: NonNegative | None = Field(None, description="Matryoshka truncation")
    images: Annotated[
        list[Item], Checked(minItems=1, maxItems=Limit("max_inputs_per_request", "max_media_per_request"))
    ] | None = Field(None, description="data URIs, for a model that embeds images")

    @model_validator(mode="after")
    def _texts_or_images(self) -> CohereEmbedRequest:
        if (self.texts is None) == (self.images is None):
            raise ValueError("send either 'texts' or 'images'")
        return self


def cohere_embed_body(
    result: EmbeddingResult | EmbeddingsByType, texts: list[str], by_type: dict[str, np.ndarray] | None,
    version: int,
) -> dict[str, Any]:
    """Cohere's shapes: v1 without `embedding_types` gives a bare float list
    (`embeddings_floats`); otherwise `embeddings` maps each asked type to its vectors."""
    body: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "texts": texts,
        "meta": {"api_version": {"version": str(version)},
                 "billed_units": {"input_tokens": result.prompt_tokens}},
    }
    if by_type is None:
        assert isinstance(result, EmbeddingResult)
    if version == 1 and by_type is None:
        return {**body, "response_type": "embeddings_floats", "embeddings": result.embeddings}
    by_type = by_type or {"float": result.embeddings}
    return {**body, "response_type": "embeddings_by_type", "embeddings": by_type}


def rerank_body(result: RerankResult, documents: list[str], *, with_documents: bool, version: int
                ) -> dict[str, Any]:
    """`document: {"text": ...}` when `with_documents`; our envelope and Cohere's `meta`, so
    Cohere's SDK and Jina's clients (which read `/v1/rerank`'s answer too) parse it."""
    results = [{"index": r.index, "relevance_score": r.score,
                **({"document": {"text": documents[r.index]}} if with_documents else {})}
               for r in result.results]
    return {
        **envelope("rerank", result.model, result.prompt_tokens), "results": results,
        "meta": {"api_version": {"version": str(version)},
                 "billed_units": {"search_units": 1, "input_tokens": result.prompt_tokens}},
    }


router = APIRouter(route_class=JsonRoute, responses=error_responses())


async def cohere_embed(body: CohereEmbedRequest, request: Request, version: int) -> Response:
    engine = request.app.state.engine
    model = engine.model(body.model, Capability.EMBED).name
    if body.truncate == "START":
        raise InvalidInputError(
            "truncate START (dropping the start of long texts) is not supported; use END or NONE",
            param="truncate",
        )
    if body.images:  # Cohere v2 sends images as data URIs, for a model that embeds images
        inputs, modality, prompt = body.images, "image", None
    else:
        inputs, modality = body.texts or [], "text"
        prompt = prompt_for_use(body.input_type, engine.prompts(model))
    options = {"dimensions": body.output_dimension, "truncate": body.truncate != "NONE",
               "prompt_name": prompt, "modality": modality, "wait": False}
    with truncation_named("truncate", "END"):
        if body.embedding_types is None:  # the model's --embedding-dtype
            result = await answer(request, "embed", model, len(inputs),
                                  engine.embed(inputs, model, **options))
            by_type = None if result.dtype == "float32" else {result.dtype: result.embeddings}
        else:
            typed = await answer(request, "embed", model, len(inputs),
                                 engine.embed_by_type(inputs, body.embedding_types, model, **options))
            result, by_type = typed, typed.by_type
    return json_response(cohere_embed_body(result, body.texts or [], by_type, version))


@router.post("/v1/embed", tags=["embeddings"], summary="Embed texts (Cohere v1 shape)")
async def embed_v1(body: CohereEmbedRequest, request: Request) -> Response:
    return await cohere_embed(body, request, 1)


@router.post("/v2/embed", tags=["embeddings"], summary="Embed texts (Cohere v2 shape)")
async def embed_v2(body: CohereEmbedRequest, request: Request) -> Response:
    return await cohere_embed(body, request, 2)


@router.post("/v2/rerank", tags=["rerank"], summary="Rerank documents (Cohere v2 shape)")
async def rerank_v2(body: RerankRequest, request: Request) -> Response:
    documents = body.docs()
    result = await ranked(request, body.model, body.query, documents, top_n=body.top_n,
                          raw_scores=body.raw_scores, truncate=body.truncate, modality=body.modality,
                          max_tokens_per_doc=body.max_tokens_per_doc)
    return json_response(rerank_body(result, documents, with_documents=body.return_documents, version=2))


DIALECT = Dialect("Cohere", mounts=(Mount(router),))
