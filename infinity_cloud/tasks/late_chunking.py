"""Late chunking: each chunk of a document pooled from token states the model computed on the
whole document, so a chunk is read in its document's context (Jina's `late_chunking`).

The document is read once, in windows of the model's room (`chunking.windows`) that share
`WINDOW_OVERLAP` of their tokens where it is longer; each token's state is kept from the
window where it has the most context. Each chunk's own tokens are then pooled with the model's
pooling and Dense layers (sentence-transformers' Pooling -> Dense, over the chunk's span
instead of the text), and normalised as the model's Normalize says. The rows come from the
model's token-states tower (`models.token_states`), built on the first such call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError
from infinity_cloud.core.family import GraphOutput, ModelInfo, Tower
from infinity_cloud.core.results import ChunkedEmbeddingResult
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.tasks.base import (
    Cost,
    length_cost,
    prompt_tokens,
)
from infinity_cloud.tasks.chunked import (
    ChunkedCall,
    ChunkedEmbedTask,
    answer,
    call_prompt,
    chunk_count,
    chunk_size,
    room,
    with_answer,
)
from infinity_cloud.text.chunking import Chunk, cut

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served

# The tower whose rows are each input's token states (`models.token_states` builds it).
TOKEN_STATES_TOWER: Tower = "text:token_states"
# Tokens consecutive windows share, as a share of the window (1/8): a token at a cut is read
# with at least 1/16 of a window of context on that side; a longer document costs ~14 % more.
WINDOW_OVERLAP_SHARE = 8
# Bytes a token's state holds while a document's chunks are pooled (float32, and its copy).
STATE_BYTES_PER_WIDTH = 8


def window_overlap(room: int) -> int:
    return room // WINDOW_OVERLAP_SHARE


@dataclass(eq=False, slots=True)
class WindowInput(Encoded):
    """A window's model input: document `document`'s own tokens [first, ...) behind `lead`
    positions (special tokens, prompt); the states of tokens [keep_first, keep_stop) are kept
    from it. The first window of a document carries the document's `chunks`."""

    document: int = 0
    first: int = 0
    keep_first: int = 0
    keep_stop: int = 0
    lead: int = 0
    count: int = 0  # the document's own tokens
    chunks: tuple[Chunk, ...] = ()


def piece_chunks(pieces: Sequence[str], offsets: Sequence[tuple[int, int]]) -> tuple[Chunk, ...]:
    """The pieces of a document (`joined`), as chunks of its tokens: a token belongs to the piece
    its first character is in. A piece that holds no token is a 400 naming it."""
    chunks, at, token = [], 0, 0
    for index, piece in enumerate(pieces):
        start, end = at, at + len(piece)
        first = token
        while token < len(offsets) and offsets[token][0] < end:
            token += 1
        if token == first:
            raise InvalidInputError(f"'input' item {index} holds no token of the model's tokenizer: with "
                                    "late_chunking each input is pooled from its own tokens", param="input",
                                    index=index)
        chunks.append(Chunk(start, end, first, token))
        at = end + len(PIECE_SEPARATOR)
    return tuple(chunks)


# What joins Jina-shaped pieces into their document: a space, so no token spans two pieces
# (the pre-tokenizers that split words split there).
PIECE_SEPARATOR = " "


def documents_of(call: ChunkedCall) -> Sequence[str]:
    return [PIECE_SEPARATOR.join(call.documents)] if call.pieces else call.documents


class LateChunkedTask(ChunkedEmbedTask):
    """Chunks of documents, each pooled from its document's token states."""

    cached = False

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        return Head("tokens")  # the token states as the graph returns them (float32)

    def rows(self, batch: np.ndarray, items: Sequence[Any]) -> list[np.ndarray]:
        """Each window's token states, padding dropped."""
        return [np.ascontiguousarray(row[: len(item)]) for row, item in zip(batch, items, strict=True)]

    def tower(self, call: ChunkedCall) -> Tower:  # type: ignore[override]
        return TOKEN_STATES_TOWER

    def cost(self, call: ChunkedCall, served: Served) -> Cost:  # type: ignore[override]
        documents = documents_of(call)
        lengths = [len(document) for document in documents]
        estimate = length_cost(lengths, max(lengths) + 2)  # about four characters a token, uncapped
        tokens = estimate.tokens + estimate.tokens // WINDOW_OVERLAP_SHARE  # windows' overlaps
        width = served.loaded.info.hidden_size
        memory = estimate.memory + tokens * width * STATE_BYTES_PER_WIDTH
        states = Cost(tokens, memory, inputs=estimate.inputs)
        chunks = len(call.documents) if call.pieces else chunk_count(call, served, lengths)
        return with_answer(states, call, served, chunks)

    def encode(self, call: ChunkedCall, served: Served, limits: LimitsSpec) -> list[Any]:  # type: ignore[override]
        tokenizer, prompt = served.loaded.tokenizer, call_prompt(call, served)
        size, most = chunk_size(call, served), room(call, served)
        lead = tokenizer.lead_length(prompt)
        out: list[Any] = []
        for d, (offsets, windows) in enumerate(tokenizer.read_whole(
            documents_of(call), most, window_overlap(most), prompt
        )):
            if not windows:
                raise InvalidInputError(f"'input' item {d} holds no token of model {served.name!r}'s "
                                        "tokenizer: nothing to embed", param="input", index=d)
            chunks = (piece_chunks(call.documents, offsets) if call.pieces
                      else tuple(cut(documents_of(call)[d], offsets, size, call.overlap_tokens)))
            for i, (w, e) in enumerate(windows):
                out.append(WindowInput(e.ids, e.type_ids, None, d, w.first, w.keep_first, w.keep_stop, lead,
                                       len(offsets), chunks if i == 0 else ()))
        return out

    def finish(  # type: ignore[override]
        self, rows: list[np.ndarray], call: ChunkedCall, served: Served, encodings: list[WindowInput]
    ) -> ChunkedEmbeddingResult:
        info = served.loaded.info
        pooled = Head("pool", served.spec.pooling or info.pooling, info.dense)
        vectors, spans, states = [], [], np.empty((0, 0), np.float32)
        plans = [(row, w) for row, w in zip(rows, encodings, strict=True)]
        for index, (row, window) in enumerate(plans):
            if window.chunks or index == 0 or window.document != plans[index - 1][1].document:
                states = np.empty((window.count, row.shape[-1]), np.float32)
                chunks = window.chunks
            at = window.lead - window.first  # a document token's position in this window's input
            states[window.keep_first : window.keep_stop] = row[at + window.keep_first : at + window.keep_stop]
            last = index + 1 == len(plans) or plans[index + 1][1].document != window.document
            if last:
                vectors.append(_pool_chunks(states, chunks, pooled))
                spans.append([(c.start, c.end, c.tokens) for c in chunks])
        return answer(np.concatenate(vectors), call, served, spans, prompt_tokens(encodings))


def _pool_chunks(states: np.ndarray, chunks: Sequence[Chunk], head: Head) -> np.ndarray:
    """Each chunk's own tokens' states, pooled by `head` (the model's pooling and Dense)."""
    longest = max(c.tokens for c in chunks)
    batch = np.zeros((len(chunks), longest, states.shape[-1]), np.float32)
    mask = np.zeros((len(chunks), longest), np.int64)
    for i, c in enumerate(chunks):
        batch[i, : c.tokens] = states[c.first : c.stop]
        mask[i, : c.tokens] = 1
    return np.asarray(head(batch, mask))


LATE_CHUNKED = LateChunkedTask()
