"""Jina's rerank (`/v1/rerank`, which Cohere's v1 SDK calls too): langchain's JinaRerank,
llama-index's JinaRerank. Jina's embeddings are OpenAI's request (its `task`, `late_chunking`
and `normalized` are refused or accepted in dialects/common.UNSERVED_FIELDS)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.server.dialects import cohere
from infinity_cloud.server.dialects.common import RerankRequest, ranked
from infinity_cloud.server.dialects.registry import Dialect, Mount
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute

router = APIRouter(tags=["rerank"], route_class=JsonRoute, responses=error_responses())


@router.post("/v1/rerank", summary="Rerank documents (Jina and Cohere v1 shape)")
async def rerank_v1(body: RerankRequest, request: Request) -> Response:
    documents = body.docs()
    result = await ranked(request, body.model, body.query, documents, top_n=body.top_n,
                          raw_scores=body.raw_scores, truncate=body.truncate, modality=body.modality,
                          max_tokens_per_doc=body.max_tokens_per_doc, instruction=body.instruction)
    # Jina's answer always carries the documents; Cohere v1's SDK reads them when there.
    return json_response(cohere.rerank_body(result, documents, with_documents=True, version=1))


DIALECT = Dialect("Jina", mounts=(Mount(router),))
