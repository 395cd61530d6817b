"""SageMaker Batch Transform's mini-batches (`/invocations` with a JSON Lines body, records split
by line, several at a time) and what this container tells the agent to send
(`/execution-parameters`).

A mini-batch holds as many records as fit the job's MaxPayloadInMB (6 MB: 60,000 records of
100 bytes), far more than one engine call takes, so its records are cut into engine-sized
batches (the per-request input limit), each one `Engine.embeddings` call, and the answer is
streamed a line a record, in record order, as each batch is done: what is held at once is the
body, one batch's records and vectors, and the lines not yet sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from infinity_cloud.core.errors import MemoryExhaustedError, QueueFullError
from infinity_cloud.core.per_input import setting_aside
from infinity_cloud.core.results import SparseEmbeddingResult
from infinity_cloud.engine.asks import ChunkedEmbedAsk, EmbedAsk

MB = 2**20
# SageMaker's own bounds (CreateTransformJob): MaxPayloadInMB at most 100, and
# MaxConcurrentTransforms x MaxPayloadInMB at most 100; its default payload is 6 MB.
PLATFORM_PAYLOAD_MB = 100
DEFAULT_PAYLOAD_MB = 6
# Mini-batches at once: enough to keep the batcher fed while one is parsed or sent (the engine
# interleaves them); more only take memory.
MOST_CONCURRENT = 4
# What one mini-batch in flight takes, per byte of it: its body (and the copy its reading
# makes), two engine batches' records, vectors and answer lines, the engine's work on them.
# Measured (benchmarks/batch_transform_rss.py): 6 MB of 100-byte records raised the server's
# peak resident memory 42 MB over idle.
HELD_PER_PAYLOAD_BYTE = 7
# Lines sent a piece at a time: each piece one write to the socket, none of a batch's size.
RECORDS_PER_PIECE = 256
# An engine batch after the first refused for load (the 200 is sent by then): tried again
# after the refusal's Retry-After, this many times, then the answer is cut off (the agent
# sees a failed invocation and retries it).
LOAD_RETRIES = 30


@dataclass(frozen=True)
class TransformSettings:
    """What the Batch Transform agent is told to send: `payload_mb` a mini-batch, `concurrent`
    of them at once."""

    payload_mb: int
    concurrent: int

    def as_execution_parameters(self) -> dict[str, Any]:
        return {"MaxConcurrentTransforms": self.concurrent, "BatchStrategy": "MULTI_RECORD",
                "MaxPayloadInMB": self.payload_mb}


def transform_settings(room_bytes: int | None, payload_limit_bytes: int) -> TransformSettings:
    """The mini-batch size and concurrency that fit `room_bytes` (what requests may take of the
    memory budget on an idle server; None: no budget), each mini-batch holding about
    `HELD_PER_PAYLOAD_BYTE` times its size, within the body limit and SageMaker's bounds."""
    payload = max(1, min(DEFAULT_PAYLOAD_MB, payload_limit_bytes // MB, PLATFORM_PAYLOAD_MB))
    concurrent = min(MOST_CONCURRENT, PLATFORM_PAYLOAD_MB // payload)
    if room_bytes is not None:
        per_mb = HELD_PER_PAYLOAD_BYTE * MB
        payload = max(1, min(payload, room_bytes // per_mb))  # one mini-batch must fit
        concurrent = max(1, min(concurrent, room_bytes // (payload * per_mb)))
    return TransformSettings(payload, concurrent)


def records(body: bytes, size: int) -> Iterator[list[bytes]]:
    """The body's lines (the newline that ends the last one is no record), `size` at a time;
    each batch's lines are copied out of the body only when it is reached."""
    start, end_of_body, batch = 0, len(body), []
    while start < end_of_body:
        end = body.find(b"\n", start)
        end = end_of_body if end < 0 else end
        batch.append(body[start:end])
        start = end + 1
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# A record's fields that ask for its text cut into chunks (`ChunkedEmbedAsk`), and their types.
CHUNK_FIELDS = {"chunk_tokens": int, "overlap_tokens": int, "late_chunking": bool}
Chunking = tuple[int, int, bool] | None  # a record's chunk_tokens, overlap_tokens, late_chunking


def _chunking(record: Any) -> Chunking | str:
    """A record's chunking (None: embedded whole), or why its chunk fields are not."""
    if not isinstance(record, dict) or "chunk_tokens" not in record:
        return None
    for name, kind in CHUNK_FIELDS.items():
        value = record.get(name)
        if value is not None and (type(value) is not kind):
            return f"'{name}' is {value!r}, not {'an integer' if kind is int else 'true or false'}"
    return record["chunk_tokens"], record.get("overlap_tokens") or 0, bool(record.get("late_chunking"))


def _texts(lines: list[bytes], first: int) -> tuple[list[str], list[int], dict[int, bytes], list[Chunking]]:
    """Each line's text (`{"text": ...}`, `{"input": ...}` or a JSON string), its place in
    `lines`, its chunking, and the answer of each line that has none; lines are numbered from
    `first`."""
    texts: list[str] = []
    where: list[int] = []
    chunking: list[Chunking] = []
    answers: dict[int, bytes] = {}
    for i, line in enumerate(lines):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            answers[i] = _error(f"line {first + i} is not JSON: {exc}")
            continue
        text = record if isinstance(record, str) else (
            record.get("text", record.get("input")) if isinstance(record, dict) else None)
        if not isinstance(text, str):
            answers[i] = _error(f"line {first + i} has no text (a JSON string, or an object with a "
                                "\"text\" field)")
            continue
        chunks = _chunking(record)
        if isinstance(chunks, str):
            answers[i] = _error(f"line {first + i}: {chunks}")
            continue
        texts.append(text)
        where.append(i)
        chunking.append(chunks)
    return texts, where, answers, chunking


def _error(reason: str) -> bytes:
    return orjson.dumps({"error": reason}) + b"\n"


def _vector(result: Any, row: int) -> Any:
    """Row `row` of an embeddings result as JSON takes it: a dense vector, a multi-vector
    matrix, or a sparse vector's indices and values."""
    if isinstance(result, SparseEmbeddingResult):
        vector = result.embeddings[row]
        return {"indices": vector.indices.tolist(), "values": vector.values.tolist()}
    return result.embeddings[row]


async def _answer(engine: Any, lines: list[bytes], first: int) -> list[bytes]:
    """One engine batch: each line's answer line, in order. A record the model refuses on its
    own is answered with the reason, the others embedded in one engine call per chunking
    (`Engine.embeddings`, or `Engine.chunked_embeddings` for records that ask for chunks:
    {"chunks": [{"start", "end", "tokens", "embedding"}, ...]})."""
    texts, all_where, answers, chunking = _texts(lines, first)
    for chunks in dict.fromkeys(chunking):
        at = [i for i, c in enumerate(chunking) if c == chunks]
        where = [all_where[i] for i in at]
        result, kept, refused = await setting_aside(
            lambda batch, chunks=chunks: _call(engine, batch, chunks), [texts[i] for i in at],
            name=lambda i, where=where: f"line {first + where[i]}",
        )
        for index, reason in refused.items():
            answers[where[index]] = _error(reason)
        if result is None:
            continue
        if chunks is None:
            for row, index in enumerate(kept):
                answers[where[index]] = orjson.dumps({"embedding": _vector(result, row)},
                                                     option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
            continue
        vectors = iter(result.embeddings)
        for spans, index in zip(result.spans, kept, strict=True):
            chunked = [{"start": s, "end": e, "tokens": t, "embedding": next(vectors)} for s, e, t in spans]
            answers[where[index]] = orjson.dumps({"chunks": chunked},
                                                 option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    return [answers[i] for i in range(len(lines))]


def _call(engine: Any, texts: list[str], chunks: Chunking) -> Any:
    return _embedded(engine, texts) if chunks is None else _chunked(engine, texts, *chunks)


def _embedded(engine: Any, texts: list[str]) -> Any:
    return engine.embeddings(EmbedAsk(texts))


def _chunked(
    engine: Any, texts: list[str], chunk_tokens: int, overlap_tokens: int, late_chunking: bool
) -> Any:
    return engine.chunked_embeddings(ChunkedEmbedAsk(
        texts, chunk_tokens=chunk_tokens, overlap_tokens=overlap_tokens, late=late_chunking))


async def _answer_admitted(engine: Any, lines: list[bytes], first: int) -> list[bytes]:
    """`_answer`, waiting out refusals for load: the answer's 200 is already sent."""
    for _ in range(LOAD_RETRIES):
        try:
            return await _answer(engine, lines, first)
        except (QueueFullError, MemoryExhaustedError) as exc:
            await asyncio.sleep(getattr(exc, "retry_after_s", 1))
    return await _answer(engine, lines, first)


def _pieces(answered: list[bytes]) -> Iterator[bytes]:
    for start in range(0, len(answered), RECORDS_PER_PIECE):
        yield b"".join(answered[start:start + RECORDS_PER_PIECE])


async def answer_mini_batch(engine: Any, body: bytes) -> StreamingResponse:
    """A mini-batch's answer, one line a record, in order ({"embedding": ...}, or {"error": ...}
    for a record the model refuses or that is not one), streamed as each engine batch is done;
    the next batch is asked for while one is sent, so the model is not left idle (two batches'
    vectors held at most). The first batch is answered before the status is sent, so what
    refuses the whole request (an option the model lacks, no model loaded, load) keeps its status."""
    batches = records(body, engine.limits.max_inputs_per_request)
    numbered = 1

    def next_batch(admitted: bool) -> asyncio.Task[list[bytes]] | None:
        nonlocal numbered
        lines = next(batches, None)
        if lines is None:
            return None
        first, numbered = numbered, numbered + len(lines)
        answer = _answer_admitted if admitted else _answer
        return asyncio.ensure_future(answer(engine, lines, first))

    head = next_batch(admitted=False)
    answered = await head if head is not None else []

    async def stream(answered: list[bytes]) -> AsyncIterator[bytes]:
        pending = next_batch(admitted=True)
        try:
            while True:
                for piece in _pieces(answered):
                    yield piece
                if pending is None:
                    return
                answered = await pending
                pending = next_batch(admitted=True)
        finally:  # the client went, or a batch failed: the one asked for is not needed
            if pending is not None:
                pending.cancel()

    return StreamingResponse(stream(answered), media_type="application/jsonlines")
