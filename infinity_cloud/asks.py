"""What a caller asks the engine, in the engine's own terms, and what it gets back. Each wire
dialect translates its request body to one of these and hands it to one engine call
(`Engine.embeddings`), which decides the rest: which kind of embedding the model makes, the
prompt or role a text's use means, the output types, and what to refuse. A dialect then only
shapes the answer."""

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


__all__ = ["ANY_EMBEDDING", "EmbedAsk", "Embeddings"]
