"""What a caller asks the engine, in the engine's own terms, and what it gets back. Each wire
dialect, the bulk job and every target translate a request to one of these and hand it to one
engine call (`Engine.embeddings`, `rerank`, `classify`, `tokenize`, `similarity`), which decides
the rest: which model, which kind of embedding it makes, the prompt or role a text's use means,
the output types, and what to refuse. A caller then only shapes the answer.

`any_name` on each: the name may be any (TEI's routes, whose clients send their own): one that
is no served model's goes to the one served model that does the ask's task, where exactly one
does (`Fleet.lookup`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infinity_cloud.capability import Capability
from infinity_cloud.results import (
    EmbeddingResult,
    EmbeddingsByType,
    MultiVectorResult,
    SparseEmbeddingResult,
)
from infinity_cloud.tasks.embed import Modality

# An embeddings request's answer: dense vectors (in one type, or several by type), sparse
# term weights, or a matrix per input.
Embeddings = EmbeddingResult | EmbeddingsByType | SparseEmbeddingResult | MultiVectorResult

# What a request may get when it does not say: a dense or a multi-vector model's embeddings.
ANY_EMBEDDING = (Capability.EMBED, Capability.MULTI_VECTOR)


@dataclass(frozen=True)
class EmbedAsk:
    """An embeddings request, whatever its dialect.

    `accepts`: the kinds of embedding the caller can take, first the one it means when the
    model makes none of them (its refusal then says why). `use`: what the texts are for
    (query, document, Cohere's search_query, ...): the model's prompt for that use where it
    declares one, a multi-vector model's role. `prompt_name`: one of the model's named
    prompts, by name. `dtype`: None, the model's --embedding-dtype; a type (float32, int8,
    uint8, binary, ubinary); or a tuple of types, answered by type (`EmbeddingsByType`).
    `normalize`: True, unit length whatever the model does; False, before its Normalize
    module; None, as the model does. `openai_sender`: token ids are OpenAI's cl100k_base ids.
    `packed`: the answer goes out as base64, which a response limit counts smaller. `wait`:
    for int8/uint8 ranges still being calibrated, else a 503 with Retry-After.

    The engine's refusals name these fields; a dialect whose fields are named otherwise maps
    the names back (server/engine_calls.in_own_terms)."""

    inputs: Sequence[str] | Sequence[Sequence[int]]
    model: str | None = None
    accepts: tuple[Capability, ...] = ANY_EMBEDDING
    dimensions: int | None = None
    truncate: bool = True
    modality: Modality = "text"
    use: str | None = None
    prompt_name: str | None = None
    dtype: str | tuple[str, ...] | None = None
    normalize: bool | None = None
    openai_sender: bool = False
    packed: bool = False
    wait: bool = True
    any_name: bool = False


@dataclass(frozen=True)
class RerankAsk:
    """A rerank request: a cross-encoder scores each pair; a multi-vector model (ColPali,
    ColBERT) scores the query against each document by late interaction (MaxSim sums, not
    probabilities), the documents read as `modality` (images: URLs or data URIs).
    `max_tokens_per_doc`: each text document cut to that many tokens first (Cohere's field)."""

    query: str
    documents: Sequence[str]
    model: str | None = None
    top_n: int | None = None
    raw_scores: bool = False
    truncate: bool = True
    modality: Modality = "text"
    max_tokens_per_doc: int | None = None
    any_name: bool = False


@dataclass(frozen=True)
class ClassifyAsk:
    """A classify request: each input's labels, best first (`raw_scores`: logits)."""

    inputs: Sequence[str]
    model: str | None = None
    raw_scores: bool = False
    truncate: bool = True
    any_name: bool = False


@dataclass(frozen=True)
class TokenizeAsk:
    """Each text (behind the model's prompt `prompt_name`) as the model's tokenizer splits it,
    with character spans."""

    texts: Sequence[str]
    model: str | None = None
    add_special_tokens: bool = True
    prompt_name: str | None = None
    any_name: bool = False


@dataclass(frozen=True)
class SimilarityAsk:
    """The cosine of `source`'s embedding to each of `sentences`' (sentence-transformers'
    `cos_sim` row; TEI's /similarity), embedded in one call."""

    source: str
    sentences: Sequence[str]
    model: str | None = None
    truncate: bool = True
    prompt_name: str | None = None
    any_name: bool = False


@dataclass(frozen=True)
class ChunkedEmbedAsk:
    """Documents cut into chunks of at most `chunk_tokens` of the model's own tokens (None: as
    many as its window holds beside its special tokens and the prompt), consecutive chunks
    sharing `overlap_tokens`, each chunk embedded on its own; never truncated. `use` and
    `prompt_name` choose the prompt as `EmbedAsk`'s do.

    `late`: late chunking, each chunk pooled from the token states of its whole document."""

    documents: Sequence[str]
    model: str | None = None
    chunk_tokens: int | None = None
    overlap_tokens: int = 0
    dimensions: int | None = None
    use: str | None = None
    prompt_name: str | None = None
    packed: bool = False
    any_name: bool = False
    late: bool = False


# Any of them: `Engine.by_model_type` answers whichever the model's task is.
Ask = EmbedAsk | RerankAsk | ClassifyAsk | TokenizeAsk | SimilarityAsk | ChunkedEmbedAsk


def capabilities_of(ask: Ask) -> tuple[Capability, ...]:
    """What a model must do to answer `ask`: a request that names no model gets the default of
    the models that do one of these (any model tokenizes)."""
    if isinstance(ask, EmbedAsk):
        return ask.accepts
    if isinstance(ask, RerankAsk):
        return (Capability.RERANK, Capability.MULTI_VECTOR)
    if isinstance(ask, ClassifyAsk):
        return (Capability.CLASSIFY,)
    if isinstance(ask, SimilarityAsk | ChunkedEmbedAsk):
        return (Capability.EMBED,)
    return tuple(Capability)


__all__ = ["ANY_EMBEDDING", "Ask", "ChunkedEmbedAsk", "ClassifyAsk", "EmbedAsk", "Embeddings", "RerankAsk",
           "SimilarityAsk", "TokenizeAsk", "capabilities_of"]
