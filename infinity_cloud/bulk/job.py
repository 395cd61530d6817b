"""What a bulk embedding job is (its inputs, output and options), how its input splits into
shards, and how one shard is embedded by an engine: the one piece every runner (this
machine, a Ray actor) shares."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from infinity_cloud.bulk.sources import Row, media_url
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.per_input import setting_aside
from infinity_cloud.core.version import __version__
from infinity_cloud.engine.asks import ChunkedEmbedAsk, EmbedAsk
from infinity_cloud.families import input_kinds

if TYPE_CHECKING:
    from infinity_cloud.engine import Engine

DEFAULT_SHARD_ROWS = 1000
# The model's settings that change its vectors (the rest: batching, queueing, naming).
ANSWER_FIELDS = ("model_id", "revision", "backend", "device", "dtype", "pooling", "normalize", "max_length",
                 "trust_remote_code", "embedding_dtype")


@dataclass(frozen=True)
class EmbedJob:
    files: tuple[str, ...]  # the input files, expanded and in order
    out: str
    text_field: str = "text"
    id_field: str = "id"
    keep: tuple[str, ...] = ()  # input fields copied beside each vector
    shard_rows: int = DEFAULT_SHARD_ROWS
    max_errors: int | None = None
    output_dtype: str | None = None  # float32 (default), int8, uint8, binary, ubinary
    prompt_name: str | None = None  # one of the model's named prompts ("query", "passage", ...)
    truncate: bool = True  # off: a text past the model's length is a bad row
    # A kind of input (`families.input_kinds`); of a fetched kind (image, audio), the field
    # holds a path, s3:// URI, URL or data: URI.
    modality: str = "text"
    max_error_rate: float = 0.01  # a job with a larger share of bad rows fails (`outcome.verdict`)
    # A model that makes several outputs in one pass (bge-m3): those written, each its column
    # ("dense" in `embedding`, "sparse", "multi_vector"), from one pass; none: the model's one kind.
    outputs: tuple[str, ...] = ()
    # Set: each text is cut into chunks of at most this many of the model's own tokens, a row
    # each (`embed_chunks`); consecutive chunks share `overlap_tokens`.
    chunk_tokens: int | None = None
    overlap_tokens: int = 0
    late_chunking: bool = False  # each chunk read in its document's context (Jina's late chunking)

    def fingerprint(self, model: ModelSpec) -> dict[str, Any]:
        """What the vectors depend on, and where the rows come from: a run that differs in any
        of these must not add shards to this job's output. The model as the spec names it
        (which runner resolves `auto` where is told per shard: `engines` in the summary)."""
        options = asdict(self)
        for name in ("out", "max_errors", "max_error_rate"):  # where it goes, and when to stop, change no row
            options.pop(name)
        if self.chunk_tokens is None:  # a job that does not chunk is the job it was before chunking was
            for name in ("chunk_tokens", "overlap_tokens", "late_chunking"):
                options.pop(name)
        options["files"] = list(self.files)
        options["keep"] = list(self.keep)
        if self.outputs:  # absent otherwise: a dataset written before it resumes as it was
            options["outputs"] = list(self.outputs)
        else:
            options.pop("outputs")
        served = model.model_dump(mode="json", include=set(ANSWER_FIELDS))
        return {**options, "model": served, "infinity_cloud": __version__}


def shards(rows: Iterable[Row], size: int, skip: set[int] = frozenset()) -> Iterator[tuple[int, list[Row]]]:  # type: ignore[assignment]
    """The rows in shards of `size` by their place in the input; those in `skip` (done) are
    read past, not returned."""
    batch: list[Row] = []
    for row in rows:
        shard = row.number // size
        if shard in skip:
            continue
        if batch and batch[0].number // size != shard:
            yield batch[0].number // size, batch
            batch = []
        batch.append(row)
    if batch:
        yield batch[0].number // size, batch


def rows_digest(rows: Iterable[Row]) -> str:
    """What a shard was made from (each row's place, id, text or problem, and kept fields), as
    a digest: a resume compares it with the rows now at the shard's place (`Dataset.drop_changed`).
    One JSON text for the shard: a few microseconds a row, beside the hundreds its embedding takes."""
    made_of = json.dumps([(r.number, r.id, r.text, r.problem, r.kept) for r in rows], default=str)
    return hashlib.blake2b(made_of.encode(), digest_size=16).hexdigest()


@dataclass
class ShardResult:
    table: Any  # pyarrow.Table: id, row, embedding, and the kept fields
    errors: list[dict[str, Any]]
    tokens: int
    digest: str  # `rows_digest` of the shard's rows
    missing: int = 0  # bad rows for want of the text field
    fields: frozenset[str] = frozenset()  # the fields those rows had

    def report(self, rows: int) -> dict[str, Any]:
        """What a runner counts of it (`Meter.add`)."""
        return {"rows": rows, "tokens": self.tokens, "errors": len(self.errors), "missing": self.missing,
                "fields": sorted(self.fields), "first_error": self.errors[0] if self.errors else None}


def shard_outcome(rows: list[Row], table: Any, errors: list[dict[str, Any]], tokens: int) -> ShardResult:
    """A shard's result with what the job's verdict reads of its rows."""
    lacking = [r for r in rows if r.fields]
    return ShardResult(table, errors, tokens, rows_digest(rows), len(lacking),
                       frozenset(f for r in lacking for f in r.fields))


async def embed_shard(
    engine: Engine, job: EmbedJob, rows: list[Row], model: str | None = None
) -> ShardResult:
    """Embed the shard's good rows in one call (the engine batches them by length within its
    token budget), setting aside each row the model refuses on its own (too long with
    truncation off, past the character limit) with the reason, and each bad row from the input."""
    errors = [{"row": r.number, "id": r.id, "error": r.problem} for r in rows if r.text is None]
    good = [r for r in rows if r.text is not None]
    if job.chunk_tokens is not None:
        return await embed_chunks(engine, job, rows, good, errors, model)
    inputs = [r.text for r in good]
    facts = engine.facts_of(model)  # the table's kind and width, even for a shard of refused rows
    capability, dimensions = facts.capability, facts.dimensions
    if job.modality != "text" and capability == "sparse":  # before any file is read
        raise ConfigError(f"a sparse model embeds text, not {job.modality}: drop --modality")
    if job.modality in (kinds := input_kinds()) and kinds[job.modality].fetched:  # else the value as it is
        good, inputs = await _fetched(good, inputs, errors)
    # The engine checks each text as it checks the server's (an empty one is refused, one of
    # spaces is a text); the reason names the row by its place in the input, not in the call.
    result, kept, refused = await setting_aside(
        lambda texts: engine.embeddings(embed_ask(texts, job, model)), inputs,
        name=lambda i: f"row {good[i].number}",
    )
    errors += [{"row": good[i].number, "id": good[i].id, "error": reason} for i, reason in refused.items()]
    errors.sort(key=lambda e: e["row"])
    table = _table([good[i] for i in kept], result, capability, dimensions, job)
    return shard_outcome(rows, table, errors, result.prompt_tokens if result else 0)


async def _fetched(good: list[Row], inputs: list[str], errors: list[dict[str, Any]]
                   ) -> tuple[list[Row], list[str]]:
    """The rows whose media file could be read, and each one's data URL; a file that cannot be
    is a bad row (added to `errors`). Read off the event loop the engine batches on."""
    found = await asyncio.to_thread(lambda: [media_url(value) for value in inputs])
    pairs = list(zip(good, found, strict=True))
    errors += [{"row": r.number, "id": r.id, "error": why} for r, (_, why) in pairs if why]
    return [r for r, (url, _) in pairs if url is not None], [url for url, _ in found if url is not None]


async def embed_chunks(
    engine: Engine, job: EmbedJob, rows: list[Row], good: list[Row], errors: list[dict[str, Any]],
    model: str | None = None,
) -> ShardResult:
    """The shard's good rows cut into chunks of the model's own tokens, a table row per chunk
    (`chunk_table`), in one `Engine.chunked_embeddings` call; a row the model refuses on its
    own (nothing to embed) is set aside with the reason."""
    import numpy as np

    width = engine.facts_of(model).dimensions
    result, kept, refused = await setting_aside(
        lambda texts: engine.chunked_embeddings(chunked_ask(texts, job, model)), [r.text for r in good],
        name=lambda i: f"row {good[i].number}",
    )
    errors += [{"row": good[i].number, "id": good[i].id, "error": reason} for i, reason in refused.items()]
    errors.sort(key=lambda e: e["row"])
    vectors = result.embeddings if result else np.zeros((0, width), np.float32)
    spans = result.spans if result else []
    table = chunk_table([good[i] for i in kept], spans, dense_column(vectors, width), job)
    return shard_outcome(rows, table, errors, result.prompt_tokens if result else 0)


def chunked_ask(texts: list[str], job: EmbedJob, model: str | None) -> ChunkedEmbedAsk:
    return ChunkedEmbedAsk(texts, model, chunk_tokens=job.chunk_tokens, overlap_tokens=job.overlap_tokens,
                           prompt_name=job.prompt_name, late=job.late_chunking)


def chunk_table(
    rows: list[Row], spans: list[list[tuple[int, int, int]]], embedding: Any, job: EmbedJob
) -> Any:
    """A chunked shard as columns, a row per chunk in document order: `id` and `row` (its
    document's), `chunk` (its number in the document, from 0), `start` and `end` (character
    offsets into the document's text), `tokens` (its own), `text` (the document's characters
    [start, end)), `embedding`, then the document's kept fields."""
    import pyarrow as pa

    owners = [(row, number, span) for row, chunks in zip(rows, spans, strict=True)
              for number, span in enumerate(chunks)]
    columns: dict[str, Any] = {
        "id": pa.array([str(r.id) for r, _, _ in owners], pa.string()),
        "row": pa.array([r.number for r, _, _ in owners], pa.int64()),
        "chunk": pa.array([n for _, n, _ in owners], pa.int32()),
        "start": pa.array([s[0] for _, _, s in owners], pa.int64()),
        "end": pa.array([s[1] for _, _, s in owners], pa.int64()),
        "tokens": pa.array([s[2] for _, _, s in owners], pa.int32()),
        "text": pa.array([r.text[s[0]:s[1]] for r, _, s in owners], pa.string()),  # type: ignore[index]
        "embedding": embedding,
    }
    for name in job.keep:
        columns[name] = pa.array([r.kept.get(name) for r, _, _ in owners])
    return pa.table(columns)


def embed_ask(texts: list[str], job: EmbedJob, model: str | None) -> EmbedAsk:
    """The job's rows as the engine's ask: whatever kind of embedding the model makes (a
    multi-vector model reads texts as documents, ColPali page images); the outputs asked of a
    model that makes several, by type, from one pass."""
    dtype: str | tuple[str, ...] | None = job.output_dtype
    if job.outputs:
        dtype = tuple(_dense_type(job) if output == "dense" else output for output in job.outputs)
    return EmbedAsk(texts, model, accepts=(Capability.EMBED, Capability.SPARSE, Capability.MULTI_VECTOR),
                    truncate=job.truncate, modality=job.modality,  # type: ignore[arg-type]
                    prompt_name=job.prompt_name, dtype=dtype)


def _dense_type(job: EmbedJob) -> str:
    """The dense column's type by its name among several (float for float32)."""
    return job.output_dtype if job.output_dtype not in (None, "float32") else "float"  # type: ignore[return-value]


def _table(rows: list[Row], result: Any, capability: str, dimensions: int, job: EmbedJob) -> Any:
    """The shard's `embedding` column for the model's kind of vectors, of one type in every
    shard (the model's width, whatever rows this one has), in a `shard_table`; with
    `job.outputs`, a column each (`embedding` the dense one)."""
    import numpy as np

    if job.outputs:
        by_type = result.by_type if result else {}
        columns = {
            "embedding" if output == "dense" else output: _column(
                "embed" if output == "dense" else output,
                by_type.get(_dense_type(job) if output == "dense" else output, []), dimensions, job)
            for output in job.outputs
        }
        return shard_table(rows, columns, job)
    vectors = result.embeddings if result else []
    if capability == "embed" and not result:
        vectors = np.zeros((0, dimensions))
    return shard_table(rows, {"embedding": _column(capability, vectors, dimensions, job)}, job)


def _column(capability: str, vectors: Any, dimensions: int, job: EmbedJob) -> Any:
    """One kind of vectors as a column: sparse, multi-vector, or dense of the job's type."""
    import numpy as np
    import pyarrow as pa

    if capability == "sparse":
        return pa.array(
            [{"indices": v.indices.astype(np.int64), "values": v.values.astype(np.float32)} for v in vectors],
            pa.struct([("indices", pa.list_(pa.int64())), ("values", pa.list_(pa.float32()))]),
        )
    if capability == "multi_vector":
        return pa.array([v.astype(np.float32).tolist() for v in vectors],
                        pa.list_(pa.list_(pa.float32(), dimensions)))
    kind = job.output_dtype or "float32"
    width = dimensions // 8 if kind in ("binary", "ubinary") else dimensions
    return dense_column(vectors if len(vectors) else np.zeros((0, width)), width, kind)


def dense_column(matrix: Any, width: int, kind: str = "float32") -> Any:
    """Dense vectors as `fixed_size_list<element, width>` (int8 for int8 and binary, uint8 for
    uint8 and ubinary, float32 else)."""
    import numpy as np
    import pyarrow as pa

    element = {"float32": pa.float32(), "int8": pa.int8(), "binary": pa.int8()}.get(kind, pa.uint8())
    flat = pa.array(np.ascontiguousarray(matrix).reshape(-1), element)
    return pa.FixedSizeListArray.from_arrays(flat, width)


def shard_table(rows: list[Row], embeddings: dict[str, Any], job: EmbedJob) -> Any:
    """The shard as columns: `id` (the input's, as text), `row` (its place in the input),
    the embeddings' (`embedding`, or each output's), then the kept fields."""
    import pyarrow as pa

    columns: dict[str, Any] = {
        "id": pa.array([str(r.id) for r in rows], pa.string()),
        "row": pa.array([r.number for r in rows], pa.int64()),
        **embeddings,
    }
    for name in job.keep:
        columns[name] = pa.array([r.kept.get(name) for r in rows])
    return pa.table(columns)
