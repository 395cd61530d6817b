"""Chunked embeddings: documents cut into chunks of the model's own tokens (`text.chunking`),
each chunk embedded as the dense embedder embeds a text. The chunks are cut in the tokenizer
pool from the documents' own token ids, so no chunk is truncated and none is tokenized twice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from infinity_cloud.admission.validation import check_dimensions, check_texts
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError
from infinity_cloud.core.family import Tower
from infinity_cloud.core.results import ChunkedEmbeddingResult
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.numerics.pooling import l2_normalize, truncate_dimensions
from infinity_cloud.tasks.base import (
    JSON_BYTES_PER_NUMBER,
    PACKED_BYTES_PER_NUMBER,
    Cost,
    length_cost,
    prompt_tokens,
    require_tower,
)
from infinity_cloud.tasks.embed import EmbedTask, dense_vectors, prompted

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served


@dataclass(frozen=True)
class ChunkedCall:
    documents: Sequence[str]
    chunk_tokens: int | None = None  # None: the room the window leaves
    overlap_tokens: int = 0
    dimensions: int | None = None
    prompt_name: str | None = None
    packed: bool = False
    # Late chunking (`tasks.late_chunking`): each chunk pooled from the whole document's token
    # states; `pieces`: the documents are one document's consecutive pieces (Jina's shape).
    late: bool = False
    pieces: bool = False


@dataclass(eq=False, slots=True)
class ChunkInput(Encoded):
    """A chunk's model input, with where it came from: document `document`'s characters
    [start, end), `own` of its tokens."""

    document: int = 0
    start: int = 0
    end: int = 0
    own: int = 0


def call_prompt(call: ChunkedCall, served: Served) -> str:
    return prompted(served, [""], call.prompt_name)[0]


def room(call: ChunkedCall, served: Served) -> int:
    """The most tokens of a document a chunk may hold: the window less the model's special
    tokens and the prompt's."""
    tokenizer = served.loaded.tokenizer
    return tokenizer.room - tokenizer.prompt_length(call_prompt(call, served))


def chunk_size(call: ChunkedCall, served: Served) -> int:
    """`call.chunk_tokens`, checked against the room (a 400 naming it), or the room itself."""
    most = room(call, served)
    size = most if call.chunk_tokens is None else call.chunk_tokens
    if call.chunk_tokens is not None and not 1 <= size <= most:
        raise InvalidInputError(
            f"'chunk_tokens' is {size}, but a chunk of model {served.name!r} holds 1 to {most} tokens (its "
            f"window of {served.loaded.tokenizer.max_length} less its special tokens and prompt)",
            param="chunk_tokens",
        )
    if not 0 <= call.overlap_tokens < size:
        raise InvalidInputError(
            f"'overlap_tokens' is {call.overlap_tokens}; it must be at least 0 and below the chunk's "
            f"{size} tokens, so each chunk moves on",
            param="overlap_tokens",
        )
    return size


class ChunkedEmbedTask(EmbedTask):
    """A dense embedder's task (same head, same capability) over chunks of documents."""

    def check(self, call: ChunkedCall, served: Served, limits: LimitsSpec) -> None:  # type: ignore[override]
        require_tower(served, self.capability, "text")
        check_dimensions(call.dimensions, served.loaded.info.dimensions)
        check_texts(call.documents, limits, documents=True)
        chunk_size(call, served)

    def tower(self, call: ChunkedCall) -> Tower:  # type: ignore[override]
        return "text"

    def media(self, call: ChunkedCall, served: Served) -> Sequence[str]:  # type: ignore[override]
        return ()

    def cost(self, call: ChunkedCall, served: Served) -> Cost:  # type: ignore[override]
        lengths = [len(document) for document in call.documents]
        estimate = length_cost(lengths, max(lengths) + 2)  # about four characters a token, uncapped
        return with_answer(estimate, call, served, chunk_count(call, served, lengths))

    def encode(self, call: ChunkedCall, served: Served, limits: LimitsSpec) -> list[Any]:  # type: ignore[override]
        tokenizer = served.loaded.tokenizer
        cut = tokenizer.chunks(call.documents, chunk_size(call, served), call.overlap_tokens,
                               call_prompt(call, served))
        empty = next((d for d, pairs in enumerate(cut) if not pairs), None)
        if empty is not None:  # e.g. only characters the tokenizer drops: nothing to embed
            raise InvalidInputError(f"'input' item {empty} holds no token of model {served.name!r}'s "
                                    "tokenizer: nothing to embed", param="input", index=empty)
        return [ChunkInput(e.ids, e.type_ids, None, d, c.start, c.end, c.tokens)
                for d, pairs in enumerate(cut) for c, e in pairs]

    def finish(  # type: ignore[override]
        self, rows: list[np.ndarray], call: ChunkedCall, served: Served, encodings: list[ChunkInput]
    ) -> ChunkedEmbeddingResult:
        spans: list[list[tuple[int, int, int]]] = [[] for _ in call.documents]
        for chunk in encodings:
            spans[chunk.document].append((chunk.start, chunk.end, chunk.own))
        return answer(dense_vectors(rows), call, served, spans, prompt_tokens(encodings))


def chunk_count(call: ChunkedCall, served: Served, lengths: Sequence[int]) -> int:
    """About how many chunks documents of `lengths` characters are cut into (four characters
    a token), before they are tokenized."""
    step = max(1, chunk_size(call, served) - call.overlap_tokens)
    return sum(-(-tokens // step) for tokens in (length // 4 + 1 for length in lengths))


def with_answer(work: Cost, call: ChunkedCall, served: Served, chunks: int) -> Cost:
    """`work`, and the answer's `chunks` vectors as the caller asked them sent."""
    width = call.dimensions or served.loaded.info.dimensions or 0
    wire = PACKED_BYTES_PER_NUMBER if call.packed else JSON_BYTES_PER_NUMBER
    return work.answering(chunks * width, wire, items=chunks)


def answer(
    vectors: np.ndarray, call: ChunkedCall, served: Served, spans: list[list[tuple[int, int, int]]],
    tokens: int,
) -> ChunkedEmbeddingResult:
    """The chunks' vectors (before the model's Normalize) as the caller asked them: cut to
    `dimensions`, then normalised where the model normalises."""
    vectors = truncate_dimensions(vectors, call.dimensions, renormalize=False)
    if served.loaded.normalize:  # the model's Normalize module, after any Matryoshka cut
        vectors = l2_normalize(vectors)
    return ChunkedEmbeddingResult(served.name, vectors, spans, tokens)


CHUNKED = ChunkedEmbedTask()
