"""`infinity-cloud embed --runner local`: the engine in this process, through its Python API
(no HTTP), with several shards in flight so that its batcher always has a long queue to cut
length-sorted, token-budget batches from, and the writing of one shard overlaps the
embedding of the next."""

from __future__ import annotations

import asyncio
from typing import Any

from infinity_cloud.bulk import sources
from infinity_cloud.bulk.dataset import Dataset
from infinity_cloud.bulk.job import EmbedJob, embed_shard, rows_digest, shards
from infinity_cloud.bulk.meter import Meter
from infinity_cloud.bulk.outcome import check_errors, conclude
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError

# Shards embedded at once for each replica of the model (a GPU each: `models.replicas`):
# enough that its queue holds several thousand texts to sort by length, few enough that
# memory stays a few shards' worth.
IN_FLIGHT = 4
EMBEDDING_CAPABILITIES = ("embed", "sparse", "multi_vector")
# The queue's room per row of a chunking job: a 100,000-word document in 256-token chunks.
CHUNKS_PER_ROW = 1000


def bulk_spec(spec: DeploymentSpec, job: EmbedJob) -> DeploymentSpec:
    """The spec for a job: no model refuses its work for load or length (a job waits its
    turn: no queueing deadline, and no limit on one call's time, which a container's spec
    may carry for its platform's web requests), its queue holds the shards in flight, and a
    shard is one call."""
    # A chunking job's shard is as many inputs as its texts have chunks, which only their
    # tokens tell: its queue is bounded by the memory budget, not a count.
    room = IN_FLIGHT * job.shard_rows * (CHUNKS_PER_ROW if job.chunk_tokens is not None else 1)
    unlimited = {"deadline_s": None, "request_limit_s": None}
    models = tuple(
        m.model_copy(update={**unlimited, "queue_size": max(m.queue_size, room)}) for m in spec.models
    )
    limits = spec.server.limits
    limits = limits.model_copy(
        update={"max_inputs_per_request": max(limits.max_inputs_per_request, job.shard_rows)}
    )
    return spec.model_copy(
        update={"models": models, "server": spec.server.model_copy(update={"limits": limits})}
    )


def check_model(facts: dict[str, Any], job: EmbedJob) -> None:
    capability = facts["capabilities"][0]
    if capability not in EMBEDDING_CAPABILITIES:
        raise ConfigError(
            f"model {facts['id']} {'ranks' if capability == 'rerank' else 'classifies'} "
            "texts; a bulk job embeds them: give an embedding model"
        )
    if job.chunk_tokens is not None and (capability != "embed" or job.modality != "text"):
        raise ConfigError(f"--chunk-tokens cuts texts for a dense text embedder; model {facts['id']} makes "
                          f"{capability} embeddings" if capability != "embed" else
                          f"--chunk-tokens cuts texts, not {job.modality}: drop --modality")
    if job.chunk_tokens is not None and job.output_dtype not in (None, "float32"):
        raise ConfigError(f"--chunk-tokens writes float32 vectors, not the model's {job.output_dtype}")
    if job.output_dtype not in (None, "float32") and capability != "embed":
        raise ConfigError(f"--output-dtype {job.output_dtype} is for dense embeddings, not {capability}")


async def run_local(spec: DeploymentSpec, job: EmbedJob) -> dict[str, Any]:
    """Run the job to its end (or to --max-errors); returns its summary."""
    from infinity_cloud.engine import Engine

    async with Engine(bulk_spec(spec, job)) as engine:
        facts = engine.describe()[0]
        check_model(facts, job)
        dataset = Dataset(job.out, job.fingerprint(spec.models[0]))
        inputs = await asyncio.to_thread(sources.stamps, job.files)
        done = await asyncio.to_thread(dataset.open, inputs)
        if dataset.changed:
            done = await asyncio.to_thread(_unchanged, dataset, job, done)
        total = await asyncio.to_thread(sources.count_rows, job.files)
        before = sum(min(job.shard_rows, (total or 0) - s * job.shard_rows) for s in done) if total else 0
        meter = Meter(total, before=before, errors_before=await asyncio.to_thread(dataset.errors, done))
        with meter:
            # Each replica of the model (a GPU each: `models.replicas`) fed its own shards.
            in_flight = IN_FLIGHT * max(1, len(facts["stats"].get("devices", ())))
            await _embed_all(engine, job, dataset, done, meter, in_flight)
        more = {"shards_skipped": len(done), "model": facts["id"], "backend": facts["backend"],
                "dtype": facts["dtype"]}
        return await asyncio.to_thread(conclude, dataset, meter, job, inputs, **more)


def _unchanged(dataset: Dataset, job: EmbedJob, done: set[int]) -> set[int]:
    """The shards done whose rows are still those at their place in the (changed) input."""
    rows = sources.read_rows(job.files, job.text_field, job.id_field, job.keep)
    current = {shard: rows_digest(batch) for shard, batch in shards(rows, job.shard_rows) if shard in done}
    return dataset.drop_changed(done, current)


async def _embed_all(
    engine: Any, job: EmbedJob, dataset: Dataset, done: set[int], meter: Meter, in_flight: int
) -> None:
    rows = sources.read_rows(job.files, job.text_field, job.id_field, job.keep)
    pending: set[asyncio.Task[None]] = set()

    async def one(shard: int, batch: list[sources.Row]) -> None:
        result = await embed_shard(engine, job, batch)
        await asyncio.to_thread(dataset.write_shard, shard, result.table, result.errors, result.digest)
        meter.add(result.report(len(batch)))
        check_errors(meter, job, dataset.out)

    def first_failure(tasks: set[asyncio.Task[None]]) -> None:
        """A failed shard stops the job; its error is raised once, however many failed (a full
        disk fails every shard in flight), and each is retrieved."""
        failed = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
        if failed:
            raise failed[0]  # type: ignore[misc]

    try:
        # Reading the input runs in a thread: a large Parquet or S3 file never stalls the loop.
        iterator = shards(rows, job.shard_rows, done)
        while True:
            item = await asyncio.to_thread(next, iterator, None)
            if item is None:
                break
            while len(pending) >= in_flight:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                first_failure(finished)
            pending.add(asyncio.create_task(one(*item)))
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            first_failure(finished)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
