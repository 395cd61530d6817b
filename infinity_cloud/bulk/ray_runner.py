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

import json
import os
from typing import Any

from infinity_cloud.bulk.job import EmbedJob
from infinity_cloud.bulk.workers import (
    ShardWorker,
    collect,
    finish,
    job_from_json,
    job_to_json,
    plan_from_json,
    plan_job,
    plan_to_json,
)
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.install_hint import install_command


class ShardEmbedder:
    """A Ray actor: a `ShardWorker` (one engine, loaded once) fed one planned shard a batch."""

    def __init__(self, spec_json: str, job_json: str) -> None:
        self.worker = ShardWorker(DeploymentSpec.model_validate_json(spec_json), job_from_json(job_json))

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        # Each report as JSON text: its values (a bad row's id, the fields seen) vary in type
        # from shard to shard, which one Arrow column could not hold.
        return {"report": [json.dumps(self.worker.run(plan_from_json(str(p))), default=str)
                           for p in batch["plan"]]}


def run_ray(spec: DeploymentSpec, job: EmbedJob, actors: int | None = None) -> dict[str, Any]:
    """Run the job on Ray to its end (or to --max-errors); returns its summary."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--runner ray needs Ray: {install_command('ray')}") from None

    address = os.environ.get("RAY_ADDRESS")
    ray.init(address=address or None, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    try:
        return _run(ray, spec, job, actors)
    finally:
        if not address:  # a cluster started for this job ends with it
            ray.shutdown()


def _run(ray: Any, spec: DeploymentSpec, job: EmbedJob, actors: int | None) -> dict[str, Any]:
    planned = plan_job(spec, job)
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
    if planned.todo:
        items = [{"plan": plan_to_json(p)} for p in planned.todo]
        pipeline = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            ShardEmbedder,
            # The targets' sections stay behind: a worker serves the models alone, and reading a
            # section back would need the target registry.
            fn_constructor_kwargs={"spec_json": spec.model_dump_json(exclude=set(spec.sections())),
                                   "job_json": job_to_json(job)},
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
            **per_actor,
        )
        collect(planned, (json.loads(row["report"]) for row in pipeline.iter_rows()), job)
    return finish(planned, spec, "ray", actors, job)
