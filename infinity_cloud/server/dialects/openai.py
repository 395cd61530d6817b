"""OpenAI's embeddings (`/embeddings`, `/v1/embeddings`): the openai SDK and every client
built on it (langchain-openai, llama-index, haystack, litellm), with Infinity's extensions
(modality, embedding_type, truncate) and Voyage's names for three of them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, StrictBool, model_validator
from starlette.responses import Response

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import InvalidInputError, UnsupportedError
from infinity_cloud.core.results import (
    ChunkedEmbeddingResult,
    EmbeddingResult,
    EmbeddingsByType,
    MultiVectorResult,
    SparseEmbeddingResult,
)
from infinity_cloud.engine.asks import ANY_EMBEDDING, ChunkedEmbedAsk, EmbedAsk, Embeddings
from infinity_cloud.server.dialects.common import (
    INPUTS,
    Item,
    Items,
    Kind,
    NonNegative,
    Positive,
    TokenIdList,
    _Request,
    envelope,
    not_both,
)
from infinity_cloud.server.dialects.registry import Dialect, Mount
from infinity_cloud.server.encoding import by_type_json, json_response, vector_base64
from infinity_cloud.server.engine_calls import answer, in_own_terms
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute

# Our names and Voyage's for the same fields: a request sends one of each pair.
VOYAGE_NAMES = (
    ("embedding_type", "output_dtype"), ("dimensions", "output_dimension"), ("truncate", "truncation"),
)


# The types `embedding_types` may name: dense types (Cohere's names), and the outputs a model
# that makes several in one pass (bge-m3) gives beside them.
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "sparse", "multi_vector"]


class EmbeddingRequest(_Request):
    model_config = ConfigDict(json_schema_extra=not_both(*VOYAGE_NAMES))

    input: Item | Items | TokenIdList | Annotated[list[TokenIdList], INPUTS] = Field(
        ..., description="a text, a list of texts, a list of token ids, or a list of such lists; with "
        "modality image or audio, URLs or data URIs (fewer per request: the server's media limit)"
    )
    encoding_format: Literal["float", "base64", "sparse"] = Field(
        "float", description="sparse: {indices, values} per input, for SPLADE models"
    )
    dimensions: NonNegative | None = Field(None, description="Matryoshka truncation; 0 = full")
    modality: Kind = "text"
    embedding_type: Literal["float32", "int8", "uint8", "binary", "ubinary"] | None = Field(
        None, description="quantised output for this request; default: the model's --embedding-dtype"
    )
    embedding_types: Annotated[list[EmbeddingType], Field(min_length=1)] | None = Field(
        None, description="several embeddings of each input at once, each item's `embedding` then an object "
        "by type: dense types, and a bge-m3 model's 'sparse' ({indices, values}) and 'multi_vector' (a "
        "vector per token), all from one pass of the model"
    )
    input_type: Literal["query", "document"] | None = Field(
        None, description="what the texts are for (Voyage): a multi-vector (ColBERT) model reads them as "
        "queries or documents; an embedder puts its sentence-transformers prompt for that use before "
        "them, where it declares one (none: the texts as they are)"
    )
    truncate: StrictBool = Field(True, description="cut inputs to the model's limit instead of a 400")
    user: str | None = None
    # Voyage's names for embedding_type, dimensions and truncate: its answer is OpenAI's, so
    # its embeddings are this request, not a body of its own.
    output_dtype: Literal["float", "int8", "uint8", "binary", "ubinary"] | None = Field(
        None, description="Voyage's embedding_type (float: float32)"
    )
    output_dimension: NonNegative | None = Field(None, description="Voyage's dimensions")
    truncation: StrictBool | None = Field(None, description="Voyage's truncate")
    late_chunking: StrictBool = Field(
        False, description="Jina's late chunking: the texts, joined by a space, are one document read "
        "once; each text's vector is pooled from its own tokens' states in that context"
    )

    @model_validator(mode="after")
    def _one_name_each(self) -> EmbeddingRequest:
        # Each field is valid alone: a pair that contradicts itself is a client's mistake the
        # schema cannot state, a 400 naming the field (as api.md's table has it), not a 422.
        for ours, voyage in VOYAGE_NAMES:
            if voyage in self.model_fields_set and ours in self.model_fields_set:
                raise InvalidInputError(f"send '{ours}' or Voyage's '{voyage}', not both", param=voyage)
        if self.embedding_types is not None:
            if self.kind is not None:
                raise InvalidInputError("send 'embedding_types' (several) or one embedding type, not both",
                                        param="embedding_types")
            if self.encoding_format != "float":
                raise InvalidInputError("'embedding_types' answers each type as JSON; send encoding_format "
                                        "'float'", param="encoding_format")
        return self

    @property
    def kinds(self) -> str | tuple[str, ...] | None:
        """The types asked: several (`embedding_types`), answered by type; else one, or None."""
        return tuple(self.embedding_types) if self.embedding_types is not None else self.kind

    @property
    def kind(self) -> str | None:
        """The embedding type asked for (None: the model's --embedding-dtype)."""
        if self.output_dtype is not None:
            return "float32" if self.output_dtype == "float" else self.output_dtype
        return self.embedding_type

    @property
    def dims(self) -> int | None:
        return self.output_dimension if self.output_dimension is not None else self.dimensions

    def field_names(self) -> dict[str, str]:
        """The engine's names for this request's fields where they differ (Voyage's where sent)."""
        names = {} if self.embedding_types is not None else {"embedding_types": "embedding_type"}
        for ours, voyage in (("embedding_types", "output_dtype"), ("dimensions", "output_dimension"),
                             ("truncate", "truncation")):
            if voyage in self.model_fields_set:
                names[ours] = voyage
        return names

    @property
    def truncates(self) -> bool:
        return self.truncate if self.truncation is None else self.truncation

    def inputs(self) -> list[str] | list[list[int]]:
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]  # type: ignore[list-item]  # one pre-tokenized input
        return self.input  # type: ignore[return-value]


def embeddings_body(result: EmbeddingResult, encoding_format: Literal["float", "base64"]) -> dict[str, Any]:
    """OpenAI's shape; with base64 each vector's own bytes (float32, int8, uint8, or packed
    bits, as the result's dtype says)."""
    vectors = result.embeddings
    if encoding_format == "base64":
        data = [{"object": "embedding", "index": i, "embedding": vector_base64(v)}
                for i, v in enumerate(vectors)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {**envelope("list", result.model, result.prompt_tokens), "data": data}


def multi_vector_body(
    result: MultiVectorResult, encoding_format: Literal["float", "base64"]
) -> dict[str, Any]:
    """Per input a list of vectors; with base64 the row-major float32 matrix, and its `shape`."""
    data: list[dict[str, Any]] = []
    for i, matrix in enumerate(result.embeddings):
        item: dict[str, Any] = {"object": "embedding", "index": i}
        if encoding_format == "base64":
            item.update(embedding=vector_base64(matrix), shape=list(matrix.shape))
        else:
            item["embedding"] = matrix
        data.append(item)
    return {**envelope("list", result.model, result.prompt_tokens), "data": data}


def by_type_body(result: EmbeddingsByType) -> dict[str, Any]:
    """OpenAI's envelope, each item's `embedding` an object by type (`embedding_types`)."""
    count = len(next(iter(result.by_type.values())))
    data = [
        {"object": "embedding", "index": i,
         "embedding": {kind: by_type_json(values[i]) for kind, values in result.by_type.items()}}
        for i in range(count)
    ]
    return {**envelope("list", result.model, result.prompt_tokens), "data": data}


def sparse_embeddings_body(result: SparseEmbeddingResult) -> dict[str, Any]:
    """OpenAI's envelope, each embedding `{"indices": [...], "values": [...]}` (ids ascending)."""
    data = [
        {"object": "embedding", "index": i, "embedding": {"indices": v.indices, "values": v.values}}
        for i, v in enumerate(result.embeddings)
    ]
    return {**envelope("list", result.model, result.prompt_tokens), "data": data}


router = APIRouter(tags=["embeddings"], route_class=JsonRoute, responses=error_responses())


def from_openai_sdk(request: Request) -> bool:
    """OpenAI's SDKs (Python, Node; langchain-openai, llama-index and haystack use them) name
    themselves in these headers; their token ids are OpenAI's cl100k_base ids."""
    headers = request.headers
    return "x-stainless-lang" in headers or headers.get("user-agent", "").startswith("OpenAI/")


def embed_ask(body: EmbeddingRequest, request: Request) -> EmbedAsk:
    """The request in the engine's terms: `encoding_format: sparse` asks a SPLADE model,
    anything else a dense or a multi-vector one."""
    sparse = body.encoding_format == "sparse"
    return EmbedAsk(
        body.inputs(), body.model, accepts=(Capability.SPARSE,) if sparse else ANY_EMBEDDING,
        dimensions=body.dims, truncate=body.truncates, modality=body.modality, use=body.input_type,
        dtype=body.kinds, openai_sender=from_openai_sdk(request), packed=body.encoding_format == "base64",
        wait=False,
    )


def embeddings_response(result: Embeddings, encoding_format: str) -> Response:
    """OpenAI's shape for whichever kind of embedding the model made."""
    if isinstance(result, SparseEmbeddingResult):
        return json_response(sparse_embeddings_body(result))
    if isinstance(result, MultiVectorResult):
        return json_response(multi_vector_body(result, encoding_format))  # type: ignore[arg-type]
    if isinstance(result, EmbeddingsByType):
        return json_response(by_type_body(result))
    assert isinstance(result, EmbeddingResult)
    return json_response(embeddings_body(result, encoding_format))  # type: ignore[arg-type]


def late_chunking_ask(body: EmbeddingRequest) -> ChunkedEmbedAsk:
    """Jina's shape of late chunking: the texts are one document's pieces, a vector each."""
    if body.modality != "text":
        raise UnsupportedError(f"late_chunking reads texts, not modality {body.modality!r}", param="modality")
    if body.kind not in (None, "float32") or body.encoding_format == "sparse":
        sparse = body.encoding_format == "sparse"
        field = "encoding_format" if sparse else body.field_names()["embedding_types"]
        raise UnsupportedError("late_chunking answers float vectors (encoding_format float or base64)",
                               param=field)
    inputs = body.inputs()
    if not inputs or not all(isinstance(text, str) for text in inputs):
        raise InvalidInputError("late_chunking reads texts: send the document's pieces as a list of texts, "
                                "not token ids", param="input")
    return ChunkedEmbedAsk(inputs, body.model, dimensions=body.dims, use=body.input_type,  # type: ignore[arg-type]
                           packed=body.encoding_format == "base64", late=True, pieces=True)


async def late_chunked_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    """Jina's late chunking, answered in OpenAI's shape: a vector per input."""
    late = late_chunking_ask(body)
    with in_own_terms(body.field_names()):
        chunked = await answer(request, body.model, len(late.documents),
                               request.app.state.engine.chunked_embeddings(late), (Capability.EMBED,))
    vectors = EmbeddingResult(chunked.model, chunked.embeddings, chunked.prompt_tokens)
    return json_response(embeddings_body(vectors, body.encoding_format))  # type: ignore[arg-type]


@router.post("/embeddings", summary="Embed texts, token ids, images or audio (OpenAI-compatible)")
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    if body.late_chunking:
        return await late_chunked_embeddings(body, request)
    ask = embed_ask(body, request)
    with in_own_terms(body.field_names()):
        result = await answer(request, body.model, len(ask.inputs),
                              request.app.state.engine.embeddings(ask), ask.accepts)
    return embeddings_response(result, body.encoding_format)


class ChunkedEmbeddingRequest(_Request):
    input: Item | Items = Field(..., description="a document or a list of documents, each cut into chunks "
                                "of the model's own tokens (never truncated; bounded by the body's size)")
    chunk_tokens: Positive | None = Field(
        None, description="most tokens of a document a chunk holds; default: the model's window less its "
        "special tokens and prompt"
    )
    overlap_tokens: NonNegative = Field(0, description="tokens consecutive chunks share (below chunk_tokens)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: NonNegative | None = Field(None, description="Matryoshka truncation; 0 = full")
    input_type: Literal["query", "document"] | None = Field(
        None, description="what the documents are for: the model's prompt for that use, where it declares one"
    )
    prompt_name: str | None = Field(None, description="one of the model's named prompts")
    late_chunking: StrictBool = Field(
        False, description="pool each chunk from the token states of its whole document, read once (in "
        "overlapping windows of the model's length where it is longer): chunks in their document's context"
    )

    def documents(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


def chunked_body(result: ChunkedEmbeddingResult, encoding_format: str) -> dict[str, Any]:
    """Per document its chunks, in order: character offsets into it, its own tokens, a vector."""
    vectors = iter(result.embeddings)
    encode = vector_base64 if encoding_format == "base64" else (lambda vector: vector)
    data = [
        {"object": "chunked_embedding", "index": i, "chunks": [
            {"start": start, "end": end, "tokens": tokens, "embedding": encode(next(vectors))}
            for start, end, tokens in spans
        ]}
        for i, spans in enumerate(result.spans)
    ]
    return {**envelope("list", result.model, result.prompt_tokens), "data": data}


@router.post("/embeddings/chunked", summary="Cut documents into chunks of the model's own tokens and embed "
             "each chunk (character offsets, never truncated)")
async def chunked_embeddings(body: ChunkedEmbeddingRequest, request: Request) -> Response:
    ask = ChunkedEmbedAsk(body.documents(), body.model, chunk_tokens=body.chunk_tokens,
                          overlap_tokens=body.overlap_tokens, dimensions=body.dimensions, use=body.input_type,
                          prompt_name=body.prompt_name, packed=body.encoding_format == "base64",
                          late=body.late_chunking)
    result = await answer(request, body.model, len(ask.documents),
                          request.app.state.engine.chunked_embeddings(ask), (Capability.EMBED,))
    return json_response(chunked_body(result, body.encoding_format))


# At the root and under /v1: the OpenAI SDK is given `http://host/v1`, Infinity's clients the host.
DIALECT = Dialect("OpenAI", mounts=(Mount(router, ("", "/v1")),))
