"""Voyage's rerank (the voyageai client, given `http://host/v1`): its body, with `top_k` and
`truncation`, on the rerank paths others own, answered in Voyage's shape. Voyage's embeddings
answer in OpenAI's shape, so its names there (output_dtype, output_dimension, truncation) are
fields of OpenAI's request (dialects/openai.py)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import Field, StrictBool
from starlette.responses import Response

from infinity_cloud.core.results import RerankResult
from infinity_cloud.server.dialects.common import NonNegative, _DocumentsRerank, ranked
from infinity_cloud.server.dialects.registry import Body, Dialect
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.engine_calls import in_own_terms


class VoyageRerankRequest(_DocumentsRerank):
    top_k: NonNegative | None = Field(None, description="how many results; absent or 0 = all")
    truncation: StrictBool = Field(True, description="cut documents to the model's limit instead of a 400")


def rerank_body(result: RerankResult, documents: list[str], return_documents: bool) -> dict[str, Any]:
    """A `data` list, `document` a string on request, `usage.total_tokens`."""
    data = [{"index": r.index, "relevance_score": r.score,
             **({"document": documents[r.index]} if return_documents else {})} for r in result.results]
    return {"object": "list", "data": data, "model": result.model,
            "usage": {"total_tokens": result.prompt_tokens}}


async def rerank_voyage(body: VoyageRerankRequest, request: Request) -> Response:
    documents = body.docs()
    with in_own_terms({"truncate": "truncation", "top_n": "top_k"}):
        result = await ranked(request, body.model, body.query, documents, top_n=body.top_k,
                              raw_scores=body.raw_scores, truncate=body.truncation, modality=body.modality)
    return json_response(rerank_body(result, documents, body.return_documents))


def _is_voyages(data: dict[str, Any]) -> bool:
    return data.get("top_k") is not None or data.get("truncation") is not None


# The client posts to `/v1/rerank`; the same body on the other rerank paths is answered alike.
DIALECT = Dialect("Voyage", bodies=tuple(
    Body(path, VoyageRerankRequest, rerank_voyage, _is_voyages)
    for path in ("/v1/rerank", "/rerank", "/v2/rerank")
))
