"""Hugging Face text-embeddings-inference's API: huggingface_hub's InferenceClient, llama-index's
TextEmbeddingsInference, chromadb's HuggingFaceEmbeddingServer, litellm's `huggingface/`.

Its routes answer errors in TEI's shape. Its `/rerank` (with `texts`) is a body on Infinity's
path (with `documents`), which dialects.registry tells apart.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.responses import Response

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import (
    InfinityCloudError,
    InvalidInputError,
    ModelNotReadyError,
)
from infinity_cloud.core.results import ClassifyResult
from infinity_cloud.core.version import __version__
from infinity_cloud.engine.asks import ClassifyAsk, EmbedAsk, SimilarityAsk, TokenizeAsk
from infinity_cloud.server.dialects.common import (
    NonNegative,
    Text,
    Texts,
    TokenId,
    _Request,
    label_rows,
    ranked,
)
from infinity_cloud.server.dialects.registry import Body, Dialect, Mount
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.engine_calls import answer, in_own_terms
from infinity_cloud.server.errors import ErrorBody, error_response, error_responses, handled
from infinity_cloud.server.openapi import Checked, Limit
from infinity_cloud.server.parsing import JsonRoute


class TeiErrorBody(BaseModel):
    """Errors on TEI's routes, in TEI's shape."""

    error: str
    error_type: str


# TEI's error kinds, by our status.
_TEI_KINDS = {429: "Overloaded", 503: "Unhealthy", 500: "Backend"}


def in_tei_shape(response: Response) -> Response:
    """One of our error answers as TEI gives errors: {"error": message, "error_type": kind}.
    The status stays ours (a client mistake is a 4xx either way)."""
    message = orjson.loads(bytes(response.body))["error"]["message"]
    kind = _TEI_KINDS.get(response.status_code, "Validation")
    headers = {k: v for k, v in response.headers.items() if k.lower() in ("retry-after", "www-authenticate")}
    return json_response({"error": message, "error_type": kind}, response.status_code, headers)


# TEI's truncation side: only "right" is served, so the document offers only it; "left" is
# refused with a 400 that says so (check_direction), not ignored.
Direction = Annotated[Literal["right", "left", "Right", "Left"], Checked(enum=["right", "Right"])]


class _TeiInputs(_Request):
    inputs: Text | Texts

    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else self.inputs


class _TeiTruncation(_TeiInputs):
    truncate: StrictBool = Field(True, description="cut inputs to the model's limit (TEI's default is a 4xx)")
    truncation_direction: Direction = "right"


class TeiEmbedRequest(_TeiTruncation):
    normalize: StrictBool = True
    prompt_name: str | None = Field(None, description="one of the model's sentence-transformers prompts")
    dimensions: NonNegative | None = None


class TeiEmbedSparseRequest(_TeiTruncation):
    prompt_name: str | None = Field(None, description="one of the model's sentence-transformers prompts")


class TeiPredictRequest(_TeiTruncation):
    raw_scores: StrictBool = False


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source_sentence: Text
    # Embedded with the source sentence, in one request's count.
    sentences: Annotated[list[Text], Checked(minItems=1, maxItems=Limit("max_inputs_per_request", less=1))]


class TeiSimilarityRequest(_TeiTruncation):
    """TEI's `/similarity` (huggingface_hub's `sentence_similarity`): the cosine of the source
    sentence's embedding to each sentence's."""

    inputs: SimilarityInputs  # type: ignore[assignment]  # TEI's shape for this route
    prompt_name: str | None = Field(None, description="one of the model's sentence-transformers prompts")


class TeiAnyRequest(TeiEmbedRequest):
    """`POST /`: embed's fields, and predict's for a classifier; a sentence-similarity body
    (`inputs: {source_sentence, sentences}`) is answered as `/similarity` answers it."""

    inputs: Text | Texts | SimilarityInputs  # type: ignore[assignment]
    raw_scores: StrictBool = False


class TeiTokenizeRequest(_TeiInputs):
    add_special_tokens: StrictBool = True
    prompt_name: str | None = None


class TeiDecodeRequest(_Request):
    ids: list[TokenId] | list[list[TokenId]]
    skip_special_tokens: StrictBool = True


class TeiRerankRequest(_Request):
    """TEI's `/rerank`: `texts`, where Infinity's sends `documents` on the same path."""

    query: Text
    texts: Texts = Field(..., description="the documents to rank")
    top_n: NonNegative | None = Field(None, description="how many results; absent or 0 = all (the "
                                      "rerankers library's TEI provider sends it)")
    return_text: StrictBool = Field(False, description="each result's text with it")
    raw_scores: StrictBool = Field(False, description="logits instead of sigmoid scores")
    truncate: StrictBool = True
    truncation_direction: Direction = "right"



class TeiRoute(JsonRoute):
    """Errors (ours, and request validation) answered in TEI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def in_tei_terms(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = await handled(request, exc)
                if response is None:
                    raise
                return in_tei_shape(response)

        return in_tei_terms


router = APIRouter(tags=["tei"], route_class=TeiRoute, responses=error_responses(TeiErrorBody))


def check_direction(direction: str) -> None:
    if direction.lower() == "left":
        raise InvalidInputError("truncation_direction left is not supported; use right",
                                param="truncation_direction")


# TEI serves one model and ignores the name, so its clients send one of their own: each ask
# says so (`any_name`), and a name that is no served model's goes to the one served model that
# does the route's task, where exactly one does (`Fleet.lookup`).


def embed_ask(body: TeiEmbedRequest) -> EmbedAsk:
    # TEI normalises unless told not to, whatever the model's own head does.
    return EmbedAsk(body.texts(), body.model, accepts=(Capability.EMBED,), dimensions=body.dimensions,
                    truncate=body.truncate, prompt_name=body.prompt_name, normalize=body.normalize,
                    wait=False, any_name=True)


def predict_ask(body: TeiPredictRequest | TeiAnyRequest) -> ClassifyAsk:
    return ClassifyAsk(body.texts(), body.model, raw_scores=body.raw_scores, truncate=body.truncate,
                       any_name=True)


def predict_rows(result: ClassifyResult, inputs: str | list[str]) -> Response:
    rows = label_rows(result)
    return json_response(rows[0] if isinstance(inputs, str) else rows)


@router.post("/embed", summary="Embed texts (TEI's shape: a list of vectors)")
async def embed(body: TeiEmbedRequest, request: Request) -> Response:
    check_direction(body.truncation_direction)
    ask = embed_ask(body)
    result = await answer(request, ask.model, len(ask.inputs),
                          request.app.state.engine.embeddings(ask), ask.accepts, any_name=True)
    return json_response(result.embeddings)


@router.post("/predict", summary="Classify texts (TEI's shape)")
async def predict(body: TeiPredictRequest, request: Request) -> Response:
    check_direction(body.truncation_direction)
    ask = predict_ask(body)
    result = await answer(request, ask.model, len(ask.inputs),
                          request.app.state.engine.classify(ask), (Capability.CLASSIFY,), any_name=True)
    return predict_rows(result, body.inputs)


@router.post("/", summary="TEI's route by model type: embed for embedders, predict for classifiers")
async def by_model_type(body: TeiAnyRequest, request: Request) -> Response:
    if isinstance(body.inputs, SimilarityInputs):
        return await similarity(TeiSimilarityRequest.model_validate(body.model_dump()), request)
    check_direction(body.truncation_direction)
    asks = (embed_ask(body), predict_ask(body))  # one call: the engine answers the one its model does
    result = await answer(
        request, body.model, len(asks[0].inputs), request.app.state.engine.by_model_type(asks),
        (Capability.EMBED, Capability.CLASSIFY), any_name=True,
    )
    if isinstance(result, ClassifyResult):
        return predict_rows(result, body.inputs)  # type: ignore[arg-type]
    return json_response(result.embeddings)


# The parameter is named as GET /models/{model_id}'s: one path of the document, two methods.
@router.post("/models/{model_id:path}", summary="TEI's / for the model the path names "
             "(huggingface_hub: InferenceClient(model=BASE + '/models/NAME'))")
async def by_model_in_path(model_id: str, body: TeiAnyRequest, request: Request) -> Response:
    return await by_model_type(body.model_copy(update={"model": model_id}), request)


@router.post("/similarity", summary="Cosine of a source sentence to each sentence (TEI's shape)")
async def similarity(body: TeiSimilarityRequest, request: Request) -> Response:
    check_direction(body.truncation_direction)
    ask = SimilarityAsk(body.inputs.source_sentence, body.inputs.sentences, body.model,
                        truncate=body.truncate, prompt_name=body.prompt_name, any_name=True)
    with in_own_terms({"sentences": "inputs.sentences"}):
        result = await answer(request, ask.model, len(ask.sentences) + 1,
                              request.app.state.engine.similarity(ask), (Capability.EMBED,), any_name=True)
    return json_response(result.scores.tolist())


@router.post("/embed_all", summary="Per-token embeddings of a multi-vector (ColBERT) model (TEI's shape)")
async def embed_all(body: TeiEmbedSparseRequest, request: Request) -> Response:
    check_direction(body.truncation_direction)
    ask = EmbedAsk(body.texts(), body.model, accepts=(Capability.MULTI_VECTOR,), truncate=body.truncate,
                   use="document", prompt_name=body.prompt_name, any_name=True)
    result = await answer(request, ask.model, len(ask.inputs),
                          request.app.state.engine.embeddings(ask), ask.accepts, any_name=True)
    return json_response(result.embeddings)  # per text: (its tokens, dimensions)


@router.post("/embed_sparse", summary="Sparse embeddings of a SPLADE model (TEI's shape)")
async def embed_sparse(body: TeiEmbedSparseRequest, request: Request) -> Response:
    check_direction(body.truncation_direction)
    ask = EmbedAsk(body.texts(), body.model, accepts=(Capability.SPARSE,), truncate=body.truncate,
                   prompt_name=body.prompt_name, any_name=True)
    result = await answer(request, ask.model, len(ask.inputs),
                          request.app.state.engine.embeddings(ask), ask.accepts, any_name=True)
    return json_response([
        [{"index": int(i), "value": float(v)} for i, v in zip(row.indices, row.values, strict=True)]
        for row in result.embeddings
    ])


@router.post("/tokenize", summary="Tokens with character spans (TEI's shape)")
async def tokenize(body: TeiTokenizeRequest, request: Request) -> Response:
    rows = await request.app.state.engine.tokenize(TokenizeAsk(
        body.texts(), body.model, add_special_tokens=body.add_special_tokens, prompt_name=body.prompt_name,
    ))
    return json_response([[{"id": t.id, "text": t.text, "special": t.special, "start": t.start,
                            "stop": t.stop} for t in row] for row in rows])


@router.post("/decode", summary="Token ids back to text (TEI's shape)")
async def decode(body: TeiDecodeRequest, request: Request) -> Response:
    ids = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
    texts = request.app.state.engine.decode(ids, body.model, skip_special_tokens=body.skip_special_tokens)
    return json_response(texts)


# TEI's names for a pooling where they differ from ours.
_TEI_POOLING = {"lasttoken": "last_token"}


@router.get("/info", summary="The served model (TEI's shape)")
async def info(request: Request) -> Response:
    state = request.app.state
    loaded = state.engine.facts()
    if not loaded:
        raise ModelNotReadyError("no model has loaded yet")
    facts = loaded[0]  # TEI serves one model; its first here
    labels = {str(i): label for i, label in enumerate(facts.labels)}
    model_type = {  # TEI's kinds; SPLADE is its "splade" pooling, per-token vectors none at all
        "embed": {"embedding": {"pooling": _TEI_POOLING.get(facts.pooling or "mean", facts.pooling)}},
        "sparse": {"embedding": {"pooling": "splade"}},
        "multi_vector": {"embedding": {"pooling": "none"}},
        "rerank": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
        "classify": {"classifier": {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}},
    }[facts.capability]
    spec = next(m for m in state.spec.models if m.name == facts.name)
    return json_response({
        "model_id": facts.name, "model_sha": None, "model_dtype": facts.dtype,
        "model_type": model_type, "max_concurrent_requests": spec.queue_size,
        "max_input_length": facts.max_input_tokens, "max_batch_tokens": spec.batch_tokens,
        "max_batch_requests": None, "max_client_batch_size": state.spec.server.limits.max_inputs_per_request,
        "auto_truncate": True, "tokenization_workers": 1, "version": __version__, "sha": None,
        "docker_label": None,
    })


async def rerank_tei(body: TeiRerankRequest, request: Request) -> Response:
    """TEI's list of {index, score[, text]}, best first; its errors in TEI's shape."""
    try:
        check_direction(body.truncation_direction)
        result = await ranked(request, body.model, body.query, body.texts, top_n=body.top_n,
                              raw_scores=body.raw_scores, truncate=body.truncate, any_name=True)
    except InfinityCloudError as exc:  # the path is Infinity's too, so not a TeiRoute
        return in_tei_shape(error_response(exc))
    return json_response([
        {"index": r.index, "score": r.score, **({"text": body.texts[r.index]} if body.return_text else {})}
        for r in result.results
    ])


def _is_teis(data: dict[str, Any]) -> bool:
    return data.get("texts") is not None


DIALECT = Dialect("TEI", mounts=(Mount(router),), bodies=(
    # Its errors in TEI's shape, but a 422 in ours: the path's parsing is Infinity's.
    Body("/rerank", TeiRerankRequest, rerank_tei, _is_teis,
         responses=error_responses(TeiErrorBody, validation=ErrorBody)),
))
