"""Infinity's own routes (its infinity_client, langchain's InfinityEmbeddings and
InfinityRerank): `/rerank`, `/classify`, `/embeddings_image`, `/embeddings_audio`. Its
`/embeddings` is OpenAI's (dialects/openai.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, StrictBool
from starlette.responses import Response

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.results import ClassifyResult, RerankResult
from infinity_cloud.engine.asks import ClassifyAsk
from infinity_cloud.server.dialects.common import (
    RerankRequest,
    Text,
    Texts,
    _Request,
    envelope,
    label_rows,
    ranked,
)
from infinity_cloud.server.dialects.openai import EmbeddingRequest, embeddings
from infinity_cloud.server.dialects.registry import Dialect, Mount
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.engine_calls import answer
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute


class ClassifyRequest(_Request):
    input: Text | Texts
    raw_scores: StrictBool = Field(False, description="logits instead of softmax scores")
    truncate: StrictBool = True

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


def classify_body(result: ClassifyResult) -> dict[str, Any]:
    return {**envelope("classify", result.model, result.prompt_tokens), "data": label_rows(result)}


def classify_ask(body: ClassifyRequest) -> ClassifyAsk:
    return ClassifyAsk(body.inputs(), body.model, raw_scores=body.raw_scores, truncate=body.truncate)


def rerank_body(result: RerankResult, documents: list[str], return_documents: bool) -> dict[str, Any]:
    """Each result's `document` a string, or null unless asked for."""
    results = [{"index": r.index, "relevance_score": r.score,
                "document": documents[r.index] if return_documents else None} for r in result.results]
    return {**envelope("rerank", result.model, result.prompt_tokens), "results": results}


# Served at the root and under /v1, as OpenAI's embeddings are.
router = APIRouter(route_class=JsonRoute, responses=error_responses())
# At the root only: /v1/rerank is Jina's.
root_router = APIRouter(tags=["rerank"], route_class=JsonRoute, responses=error_responses())


@router.post("/classify", tags=["classify"], summary="Classify texts: every label's score, highest first")
async def classify(body: ClassifyRequest, request: Request) -> Response:
    ask = classify_ask(body)
    result = await answer(request, body.model, len(ask.inputs),
                          request.app.state.engine.classify(ask), (Capability.CLASSIFY,))
    return json_response(classify_body(result))


# Infinity's own routes for media (its infinity_client calls them): /embeddings with the modality set.
@router.post("/embeddings_image", tags=["embeddings"],
             summary="Embed images (Infinity's route): URLs or data URIs")
async def embeddings_image(body: EmbeddingRequest, request: Request) -> Response:
    return await embeddings(body.model_copy(update={"modality": "image"}), request)


@router.post("/embeddings_audio", tags=["embeddings"],
             summary="Embed audio (Infinity's route): URLs or data URIs")
async def embeddings_audio(body: EmbeddingRequest, request: Request) -> Response:
    return await embeddings(body.model_copy(update={"modality": "audio"}), request)


@root_router.post("/rerank", summary="Rerank documents for a query (Infinity's shape; TEI's with `texts`)")
async def rerank_infinity(body: RerankRequest, request: Request) -> Response:
    documents = body.docs()
    result = await ranked(request, body.model, body.query, documents, top_n=body.top_n,
                          raw_scores=body.raw_scores, truncate=body.truncate, modality=body.modality,
                          max_tokens_per_doc=body.max_tokens_per_doc, instruction=body.instruction)
    return json_response(rerank_body(result, documents, body.return_documents))


DIALECT = Dialect("Infinity", mounts=(Mount(router, ("", "/v1")), Mount(root_router)))
