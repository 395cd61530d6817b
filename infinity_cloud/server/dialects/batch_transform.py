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
from infinity_cloud.engine.asks import EmbedAsk

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


def _texts(lines: list[bytes], first: int) -> tuple[list[str], list[int], dict[int, bytes]]:
    """Each line's text (`{"text": ...}`, `{"input": ...}` or a JSON string), its place in
    `lines`, and the answer of each line that has none; lines are numbered from `first`."""
    texts: list[str] = []
    where: list[int] = []
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
        texts.append(text)
        where.append(i)
    return texts, where, answers


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
    own is answered with the reason, the others embedded in one `Engine.embeddings` call."""
    texts, where, answers = _texts(lines, first)
    result, kept, refused = await setting_aside(
        lambda batch: engine.embeddings(EmbedAsk(batch)), texts,
        name=lambda i: f"line {first + where[i]}",
    )
    for index, reason in refused.items():
        answers[where[index]] = _error(reason)
    if result is not None:
        for row, index in enumerate(kept):
            answers[where[index]] = orjson.dumps({"embedding": _vector(result, row)},
                                                 option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    return [answers[i] for i in range(len(lines))]


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
