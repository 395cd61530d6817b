from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from infinity_cloud.capability import Capability
from infinity_cloud.errors import UnsupportedError
from infinity_cloud.server.calls import answer
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute
from infinity_cloud.server.protocol import EmbeddingRequest
from infinity_cloud.server.responses import embeddings_body, multi_vector_body, sparse_embeddings_body
from infinity_cloud.tasks.embed import prompt_for_use

# What /embeddings serves without `encoding_format: sparse` (which asks a SPLADE model).
EMBEDDING_CAPABILITIES = (Capability.EMBED, Capability.MULTI_VECTOR)

router = APIRouter(tags=["embeddings"], route_class=JsonRoute, responses=error_responses())


def from_openai_sdk(request: Request) -> bool:
    """OpenAI's SDKs (Python, Node; langchain-openai, llama-index and haystack use them) name
    themselves in these headers; their token ids are OpenAI's cl100k_base ids."""
    headers = request.headers
    return "x-stainless-lang" in headers or headers.get("user-agent", "").startswith("OpenAI/")


@router.post("/embeddings", summary="Embed texts, token ids, images or audio (OpenAI-compatible)")
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    inputs, engine = body.inputs(), request.app.state.engine
    sparse_asked = body.encoding_format == "sparse"
    served = engine.model(body.model, *((Capability.SPARSE,) if sparse_asked else EMBEDDING_CAPABILITIES))
    model = served.name
    if sparse_asked:
        if body.modality != "text":
            raise UnsupportedError("sparse embeddings are of text; send modality 'text'", param="modality")
        sparse = await answer(request, "embeddings", model, len(inputs), engine.embed_sparse(
            inputs, model, truncate=body.truncates,
        ))
        return json_response(sparse_embeddings_body(sparse))
    if served.capability is Capability.MULTI_VECTOR:
        if body.dims:
            raise UnsupportedError("multi-vector embeddings are not truncated; omit 'dimensions'",
                                   param="dimensions")
        if body.kind not in (None, "float32"):
            raise UnsupportedError("multi-vector embeddings are float32; omit the embedding type",
                                   param="output_dtype" if body.output_dtype else "embedding_type")
        multi = await answer(request, "embeddings", model, len(inputs), engine.embed_multi_vector(
            inputs, model, modality=body.modality, truncate=body.truncates, role=body.input_type,
        ))
        return json_response(multi_vector_body(multi, body.encoding_format))
    # The request's embedding_type; the engine takes the model's --embedding-dtype otherwise.
    prompt = prompt_for_use(body.input_type, engine.prompts(model)) if body.modality == "text" else None
    result = await answer(request, "embeddings", model, len(inputs), engine.embed(
        inputs, model, dimensions=body.dims, truncate=body.truncates, modality=body.modality,
        openai_sender=from_openai_sdk(request), packed=body.encoding_format == "base64",
        prompt_name=prompt, output_dtype=body.kind, wait=False,
    ))
    return json_response(embeddings_body(result, result.embeddings, body.encoding_format))


# Infinity's own routes for media (its infinity_client calls them): /embeddings with the modality set.
@router.post("/embeddings_image", summary="Embed images (Infinity's route): URLs or data URIs")
async def embeddings_image(body: EmbeddingRequest, request: Request) -> Response:
    return await embeddings(body.model_copy(update={"modality": "image"}), request)


@router.post("/embeddings_audio", summary="Embed audio (Infinity's route): URLs or data URIs")
async def embeddings_audio(body: EmbeddingRequest, request: Request) -> Response:
    return await embeddings(body.model_copy(update={"modality": "audio"}), request)
