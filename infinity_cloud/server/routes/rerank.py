from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.errors import InfinityCloudError
from infinity_cloud.results import RerankResult
from infinity_cloud.server.calls import answer
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.errors import (
    ErrorBody,
    TeiErrorBody,
    error_response,
    error_responses,
    in_tei_shape,
)
from infinity_cloud.server.parsing import JsonRoute
from infinity_cloud.server.protocol import RerankRequest
from infinity_cloud.server.responses import rerank_body
from infinity_cloud.server.routes.tei import check_direction

router = APIRouter(tags=["rerank"], route_class=JsonRoute, responses=error_responses())


Style = Literal["infinity", "jina", "cohere"]


async def _ranked(body: RerankRequest, request: Request) -> tuple[RerankResult, list[str]]:
    """Every dialect's ranking, and the documents it ranked."""
    check_direction(body.truncation_direction)
    documents = body.docs()
    result = await answer(request, "rerank", body.model, len(documents), request.app.state.engine.rerank(
        body.query, documents, body.model,
        top_n=body.limit, raw_scores=body.raw_scores, truncate=body.truncates, modality=body.modality,
    ))
    return result, documents


async def rerank(body: RerankRequest, request: Request, style: Style) -> Response:
    result, documents = await _ranked(body, request)
    # Voyage's client (top_k, truncation) reads its own shape back.
    shape = "voyage" if body.voyage else style
    return json_response(rerank_body(result, documents, shape, body.return_documents))


# /rerank's errors (and those of any route that hands it a body): in TEI's shape for TEI's
# dialect, which the parsed body tells, so a 422 is in ours.
TEI_TOO = error_responses(ErrorBody | TeiErrorBody, validation=ErrorBody)


@router.post(
    "/rerank", summary="Rerank documents for a query (Infinity's shape; TEI's with `texts`)",
    responses=TEI_TOO,
)
async def rerank_infinity(body: RerankRequest, request: Request) -> Response:
    if body.tei:
        return await rerank_tei(body, request)
    return await rerank(body, request, "infinity")


async def rerank_tei(body: RerankRequest, request: Request) -> Response:
    """TEI's list of {index, score[, text]}, best first; its errors in TEI's shape."""
    try:
        result, texts = await _ranked(body, request)
    except InfinityCloudError as exc:  # the route is Infinity's too, so not a TeiRoute
        return in_tei_shape(error_response(exc))
    return json_response([
        {"index": r.index, "score": r.score, **({"text": texts[r.index]} if body.return_text else {})}
        for r in result.results
    ])


@router.post("/v1/rerank", summary="Rerank documents (Jina and Cohere v1 shape)")
async def rerank_v1(body: RerankRequest, request: Request) -> Response:
    return await rerank(body, request, "jina")


@router.post("/v2/rerank", summary="Rerank documents (Cohere v2 shape)")
async def rerank_v2(body: RerankRequest, request: Request) -> Response:
    return await rerank(body, request, "cohere")
