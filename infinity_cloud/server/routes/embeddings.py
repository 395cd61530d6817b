from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.server.calls import answer
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.protocol import EmbeddingRequest
from infinity_cloud.server.responses import embeddings_body

router = APIRouter(tags=["embeddings"])


def from_openai_sdk(request: Request) -> bool:
    """OpenAI's SDKs (Python, Node; langchain-openai, llama-index and haystack use them) name
    themselves in these headers; their token ids are OpenAI's cl100k_base ids."""
    headers = request.headers
    return "x-stainless-lang" in headers or headers.get("user-agent", "").startswith("OpenAI/")


@router.post("/embeddings", summary="Embed texts or token ids (OpenAI-compatible)")
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    inputs = body.inputs()
    result = await answer(request, "embeddings", body.model, len(inputs), request.app.state.engine.embed(
        inputs, body.model, dimensions=body.dimensions, truncate=body.truncate, modality=body.modality,
        openai_sender=from_openai_sdk(request),
    ))
    return json_response(embeddings_body(result, body.encoding_format))
