"""A long document cut into chunks of at most N of the model's own tokens, with their
character offsets (`POST /v1/embeddings/chunked`, the bulk job's `--chunk-tokens`).

Pure arithmetic on a tokenizer's offsets: chunks are counted in the tokens the model will
read, so none overflows its window (character splitters either overflow and are truncated in
silence, or waste most of it). A cut snaps back to a sentence end, else to a space, within
the last tenth of a chunk, so a chunk rarely ends mid-word; consecutive chunks share
`overlap` tokens; together they cover every character a token came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# How far back (a share of the chunk) a cut may move to land on a sentence or word edge: far
# enough to find one in prose, near enough that a chunk keeps ~90 % of the window.
SNAP_SHARE = 0.1
_SENTENCE_END = frozenset(".!?;:\u3002\uff01\uff1f\u2026")


@dataclass(frozen=True)
class Chunk:
    """Tokens [first, stop) of a document, which came from its characters [start, end)."""

    start: int
    end: int
    first: int
    stop: int

    @property
    def tokens(self) -> int:
        return self.stop - self.first


def _edge(text: str, offsets: Sequence[tuple[int, int]], at: int) -> int:
    """How good a cut before token `at` is: 2 after a sentence's end, 1 at a space (or a
    token that carries its leading space, as byte-level and metaspace ones do), 0 mid-word."""
    before_end, (start, _) = offsets[at - 1][1], offsets[at]
    gap = text[before_end:start]
    if before_end and text[before_end - 1] in _SENTENCE_END and (gap or text[start:start + 1].isspace()):
        return 2
    if "\n" in gap:
        return 2
    return 1 if gap or text[start:start + 1].isspace() else 0


def _cut_before(text: str, offsets: Sequence[tuple[int, int]], first: int, limit: int, floor: int) -> int:
    """The token index to cut before: `limit`, or the best edge in the last tenth before it
    (the latest of the best kind), never at or below `floor` so each chunk moves on."""
    reach = max(1, int((limit - first) * SNAP_SHARE))
    best, best_kind = limit, _edge(text, offsets, limit)
    for at in range(limit - 1, max(limit - reach, floor + 1) - 1, -1):
        kind = _edge(text, offsets, at)
        if kind > best_kind:
            best, best_kind = at, kind
            if kind == 2:
                break
    return best


def cut(
    text: str, offsets: Sequence[tuple[int, int]], chunk_tokens: int, overlap_tokens: int = 0
) -> list[Chunk]:
    """`text`'s chunks from its tokens' character `offsets` (special tokens excluded), each of
    at most `chunk_tokens` tokens, consecutive ones sharing `overlap_tokens`. A text with no
    tokens (empty, or only what the tokenizer drops) has no chunks."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    if not 0 <= overlap_tokens < chunk_tokens:
        raise ValueError(f"overlap_tokens ({overlap_tokens}) must be at least 0 and below chunk_tokens "
                         f"({chunk_tokens})")
    count, chunks, first = len(offsets), [], 0
    while first < count:
        limit = first + chunk_tokens
        stop = count if limit >= count else _cut_before(text, offsets, first, limit, first + overlap_tokens)
        start, end = offsets[first][0], offsets[stop - 1][1]
        while start < end and text[start].isspace():  # a byte-level token's own leading space
            start += 1
        chunks.append(Chunk(start, end, first, stop))
        if stop == count:
            break
        first = stop - overlap_tokens
    return chunks


@dataclass(frozen=True)
class Window:
    """Tokens [first, stop) of a document read by the model at once; the states of tokens
    [keep_first, keep_stop) are taken from this reading (late chunking's context)."""

    first: int
    stop: int
    keep_first: int
    keep_stop: int


def windows(count: int, room: int, overlap: int) -> list[Window]:
    """A document of `count` tokens read in windows of at most `room` tokens, consecutive ones
    sharing `overlap`. Each token's state is kept from the window where it sits farthest from
    an edge it shares: the shared tokens are split at their middle, so no token is read with
    less than `overlap // 2` tokens of context on a cut side."""
    if room < 1:
        raise ValueError(f"room must be at least 1, not {room}")
    if not 0 <= overlap < room:
        raise ValueError(f"overlap ({overlap}) must be at least 0 and below the window ({room})")
    spans, first = [], 0
    while count:
        stop = min(first + room, count)
        spans.append((first, stop))
        if stop >= count:
            break
        first = stop - overlap
    out = []
    for i, (first, stop) in enumerate(spans):
        keep_first = first if i == 0 else first + overlap // 2
        keep_stop = stop if i == len(spans) - 1 else spans[i + 1][0] + overlap // 2
        out.append(Window(first, stop, keep_first, keep_stop))
    return out
