"""`infinity-cloud embed --runner ray`: a Ray Data pipeline on the cluster at `RAY_ADDRESS` (or
a local one started for the job). The driver plans the shards (byte offsets and row groups,
never the rows) and skips those already written; `map_batches` hands each shard to a pool of
actors (`ActorPoolStrategy`), each holding one engine for its life, which reads the shard's
rows itself, embeds them and writes the shard whole, as the local runner does: a lost worker
or a killed job loses only shards not yet written, and a run started again embeds those.

The dataset is written by the actors, shard by shard, not by Ray's `write_parquet`: it names
files by block and has no resume, where a shard's file is what makes every row land once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import Any

from infinity_cloud.bulk import sources
from infinity_cloud.bulk.dataset import Dataset
from infinity_cloud.bulk.job import EmbedJob, embed_shard
from infinity_cloud.bulk.local_runner import bulk_spec, check_model
from infinity_cloud.bulk.meter import Meter
from infinity_cloud.config import DeploymentSpec
from infinity_cloud.errors import ConfigError


class ShardEmbedder:
    """A Ray actor: one engine, loaded once, that embeds and writes whole shards."""

    def __init__(self, spec_json: str, job_json: str) -> None:
        from infinity_cloud.engine import Engine

        fields = json.loads(job_json)
        self.job = EmbedJob(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        spec = DeploymentSpec.model_validate_json(spec_json)
        self.loop = asyncio.new_event_loop()
        self.engine = self.loop.run_until_complete(Engine(bulk_spec(spec, self.job)).start())
        self.facts = self.engine.describe()[0]
        check_model(self.facts, self.job)
        self.dataset = Dataset(self.job.out, {})

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        keys = ("shard", "rows", "tokens", "errors", "backend", "dtype")
        out: dict[str, list[Any]] = {k: [] for k in keys}
        for planned in batch["plan"]:
            shard = _plan_from_json(str(planned))
            rows = sources.read_shard(shard, self.job.text_field, self.job.id_field, self.job.keep)
            result = self.loop.run_until_complete(embed_shard(self.engine, self.job, rows))
            self.dataset.write_shard(shard.shard, result.table, result.errors)
            for key, value in (("shard", shard.shard), ("rows", len(rows)), ("tokens", result.tokens),
                               ("errors", len(result.errors)), ("backend", self.facts["backend"]),
                               ("dtype", self.facts["dtype"])):
                out[key].append(value)
        return out


def _plan_from_json(text: str) -> sources.ShardPlan:
    data = json.loads(text)
    segments = tuple(sources.Segment(**s) for s in data["segments"])
    return sources.ShardPlan(data["shard"], data["first"], segments)


def run_ray(spec: DeploymentSpec, job: EmbedJob, actors: int | None = None) -> dict[str, Any]:
    """Run the job on Ray to its end (or to --max-errors); returns its summary."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--runner ray needs Ray: pip install 'infinity-cloud[ray]'") from None

    address = os.environ.get("RAY_ADDRESS")
    ray.init(address=address or None, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    try:
        return _run(ray, spec, job, actors)
    finally:
        if not address:  # a cluster started for this job ends with it
            ray.shutdown()


def _run(ray: Any, spec: DeploymentSpec, job: EmbedJob, actors: int | None) -> dict[str, Any]:
    dataset = Dataset(job.out, job.fingerprint(spec.models[0]))
    done = dataset.open()
    planned = list(sources.plan(job.files, job.shard_rows))
    plans = [p for p in planned if p.shard not in done]
    total = sum(s.count for p in planned for s in p.segments)
    gpu = spec.models[0].device.startswith("cuda")
    resources = ray.cluster_resources()
    if gpu:
        actors = actors or max(1, int(resources.get("GPU", 0)))
        per_actor: dict[str, Any] = {"num_gpus": 1, "num_cpus": 1}
    else:
        actors = actors or 1
        threads = max(1, int(resources.get("CPU", 1)) // actors)
        per_actor = {"num_cpus": threads}
        # Each engine runs on its share of the cores, not on all of them at once.
        models = tuple(m.model_copy(update={"backend_options": {"threads": threads, **m.backend_options}})
                       for m in spec.models)
        spec = spec.model_copy(update={"models": models})
    left = sum(s.count for p in plans for s in p.segments)
    meter = Meter(total, before=total - left, errors=dataset.errors())
    seen: set[tuple[str, str]] = set()
    if plans:
        items = [{"plan": json.dumps(dataclasses.asdict(p))} for p in plans]
        pipeline = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            ShardEmbedder,
            fn_constructor_kwargs={"spec_json": spec.model_dump_json(),
                                   "job_json": json.dumps(dataclasses.asdict(job))},
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
            **per_actor,
        )
        with meter:
            for batch in pipeline.iter_rows():
                meter.add(batch["rows"], batch["tokens"], batch["errors"])
                seen.add((batch["backend"], batch["dtype"]))
                if job.max_errors is not None and meter.errors > job.max_errors:
                    from infinity_cloud.bulk.local_runner import TooManyErrors

                    raise TooManyErrors(
                        f"{meter.errors} bad rows, more than --max-errors {job.max_errors}: see "
                        f"{dataset.out}/errors/; the shards done are kept, and a run with the same "
                        "arguments goes on from there"
                    )
    summary = {**meter.summary(workers=actors), "shards_skipped": len(done), "runner": "ray",
               "model": spec.models[0].model_id, "engines": sorted(f"{b} {d}" for b, d in seen)}
    dataset.finish(summary)
    return summary
