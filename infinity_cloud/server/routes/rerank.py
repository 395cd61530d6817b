from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.server.calls import answer
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.protocol import RerankRequest
from infinity_cloud.server.responses import rerank_body

router = APIRouter(tags=["rerank"])


Style = Literal["infinity", "jina", "cohere"]


async def rerank(body: RerankRequest, request: Request, style: Style) -> Response:
    documents = body.texts()
    result = await answer(request, "rerank", body.model, len(documents), request.app.state.engine.rerank(
        body.query, documents, body.model,
        top_n=body.top_n, raw_scores=body.raw_scores, truncate=body.truncate,
    ))
    return json_response(rerank_body(result, documents, style, body.return_documents))


@router.post("/rerank", summary="Rerank documents for a query (Infinity's shape)")
async def rerank_infinity(body: RerankRequest, request: Request) -> Response:
    return await rerank(body, request, "infinity")


@router.post("/v1/rerank", summary="Rerank documents (Jina and Cohere v1 shape)")
async def rerank_v1(body: RerankRequest, request: Request) -> Response:
    return await rerank(body, request, "jina")


@router.post("/v2/rerank", summary="Rerank documents (Cohere v2 shape)")
async def rerank_v2(body: RerankRequest, request: Request) -> Response:
    return await rerank(body, request, "cohere")
