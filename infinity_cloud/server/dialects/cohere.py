"""Cohere's embed (`/v1/embed`, `/v2/embed`: the cohere SDK, langchain-cohere, litellm's
`cohere/` models) and rerank v2 (`/v2/rerank`); its v1 rerank shares `/v1/rerank` with Jina's."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, StrictStr, model_validator
from starlette.responses import Response

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import InvalidInputError
from infinity_cloud.core.results import EmbeddingResult, EmbeddingsByType, RerankResult
from infinity_cloud.engine.asks import EmbedAsk, Embeddings
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
from infinity_cloud.server.encoding import by_type_json, json_response
from infinity_cloud.server.engine_calls import answer, in_own_terms
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.openapi import Checked, Limit
from infinity_cloud.server.parsing import JsonRoute
from infinity_cloud.tasks.hybrid import OUTPUTS
from infinity_cloud.tasks.quantization import EMBEDDING_TYPES


class CohereEmbedRequest(_Request):
    """Cohere's embed (v1 and v2): texts, and how they will be used."""

    model_config = ConfigDict(json_schema_extra=one_list_of("texts", "images"))

    texts: Texts | None = Field(None, description="the texts to embed (or images)")
    input_type: (
        Literal["search_document", "search_query", "classification", "clustering", "image"] | None
    ) = Field(None, description="mapped to the model's matching prompt when it declares one")
    embedding_types: list[Annotated[StrictStr, Checked(enum=[*EMBEDDING_TYPES, *OUTPUTS])]] | None = Field(
        None, description="float, int8, uint8 (calibrated per model, offline), binary, ubinary; and a "
        "bge-m3 model's sparse and multi_vector, all from one pass"
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


def cohere_embed_body(result: Embeddings, texts: list[str], version: int) -> dict[str, Any]:
    """Cohere's shapes: v1 in the model's float type gives a bare float list
    (`embeddings_floats`); otherwise `embeddings` maps each type to its vectors (those asked
    in `embedding_types`, else the model's own)."""
    body: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "texts": texts,
        "meta": {"api_version": {"version": str(version)},
                 "billed_units": {"input_tokens": result.prompt_tokens}},
    }
    if isinstance(result, EmbeddingsByType):
        embeddings = {kind: [by_type_json(v) for v in values] if kind in OUTPUTS else values
                      for kind, values in result.by_type.items()}
        return {**body, "response_type": "embeddings_by_type", "embeddings": embeddings}
    assert isinstance(result, EmbeddingResult)  # a dense model: what the ask accepts
    if result.dtype == "float32" and version == 1:
        return {**body, "response_type": "embeddings_floats", "embeddings": result.embeddings}
    kind = "float" if result.dtype == "float32" else result.dtype
    return {**body, "response_type": "embeddings_by_type", "embeddings": {kind: result.embeddings}}


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


def embed_ask(body: CohereEmbedRequest) -> EmbedAsk:
    """The request in the engine's terms: texts with their use, or images (Cohere v2 sends
    them as data URIs); `embedding_types`, answered by type, else the model's own type."""
    if body.truncate == "START":
        raise InvalidInputError(
            "truncate START (dropping the start of long texts) is not supported; use END or NONE",
            param="truncate",
        )
    inputs, modality = (body.images, "image") if body.images else (body.texts or [], "text")
    return EmbedAsk(inputs, body.model, accepts=(Capability.EMBED,), dimensions=body.output_dimension,
                    truncate=body.truncate != "NONE", modality=modality, use=body.input_type,
                    dtype=tuple(body.embedding_types) if body.embedding_types is not None else None,
                    wait=False)


# The engine's names for Cohere's fields where they differ; its remedy for a too-long text.
FIELD_NAMES = {"dimensions": "output_dimension", "truncate": "truncate"}


async def cohere_embed(body: CohereEmbedRequest, request: Request, version: int) -> Response:
    ask = embed_ask(body)
    with in_own_terms(FIELD_NAMES, truncate_value="END"):
        result = await answer(request, body.model, len(ask.inputs),
                              request.app.state.engine.embeddings(ask), ask.accepts)
    return json_response(cohere_embed_body(result, body.texts or [], version))


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
                          max_tokens_per_doc=body.max_tokens_per_doc, instruction=body.instruction)
    return json_response(rerank_body(result, documents, with_documents=body.return_documents, version=2))


DIALECT = Dialect("Cohere", mounts=(Mount(router),))
