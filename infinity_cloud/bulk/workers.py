"""What the runners that place engines elsewhere (Ray actors, Modal containers) share.

The driver plans the shards (byte offsets and row groups, never the rows) and leaves out
those already written (`plan_job`); each worker holds one engine for its life and reads,
embeds and writes whole shards (`ShardWorker`); the driver counts what the workers report
(`collect`) and writes the summary into the manifest (`finish`). Which shards are done, and
that each is written whole, is the Dataset's rule alone: a lost worker, a killed driver or
a platform's retry loses or rewrites only shards not yet written, and a run started again
embeds those.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.bulk import sources
from infinity_cloud.bulk.dataset import Dataset
from infinity_cloud.bulk.job import EmbedJob, embed_shard, rows_digest
from infinity_cloud.bulk.local_runner import bulk_spec, check_model
from infinity_cloud.bulk.meter import Meter
from infinity_cloud.bulk.outcome import check_errors, conclude
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.progress import slow_step


def job_to_json(job: EmbedJob) -> str:
    return json.dumps(dataclasses.asdict(job))


def job_from_json(text: str) -> EmbedJob:
    fields = json.loads(text)
    return EmbedJob(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def plan_to_json(plan: sources.ShardPlan) -> str:
    return json.dumps(dataclasses.asdict(plan))


def plan_from_json(text: str) -> sources.ShardPlan:
    data = json.loads(text)
    segments = tuple(sources.Segment(**s) for s in data["segments"])
    return sources.ShardPlan(data["shard"], data["first"], segments)


class ShardWorker:
    """One engine, loaded once, that reads, embeds and writes whole shards. A worker needs
    the job's options and output, not its file list: each plan names the files it reads."""

    def __init__(self, spec: DeploymentSpec, job: EmbedJob) -> None:
        from infinity_cloud.engine import Engine

        self.job = job
        self.loop = asyncio.new_event_loop()
        self.engine = self.loop.run_until_complete(Engine(bulk_spec(spec, job)).start())
        self.facts = self.engine.describe()[0]
        try:
            check_model(self.facts, job)
        except Exception:
            self.close()
            raise
        self.dataset = Dataset(job.out, {})

    def run(self, plan: sources.ShardPlan) -> dict[str, Any]:
        """Embed and write one shard; what it did (`ShardResult.report`, the shard and which
        engine), as plain JSON values."""
        rows = sources.read_shard(plan, self.job.text_field, self.job.id_field, self.job.keep)
        result = self.loop.run_until_complete(embed_shard(self.engine, self.job, rows))
        self.dataset.write_shard(plan.shard, result.table, result.errors, result.digest)
        return {"shard": plan.shard, **result.report(len(rows)), "backend": self.facts["backend"],
                "dtype": self.facts["dtype"]}

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.stop())
        self.loop.close()


@dataclass
class PlannedJob:
    """A job as its driver sees it: the dataset, the shards done before and those to do."""

    dataset: Dataset
    done: set[int]
    todo: list[sources.ShardPlan]
    meter: Meter
    inputs: list[dict[str, Any]]  # the input files' stamps as planned
    engines: set[str] = field(default_factory=set)  # "backend dtype" of each engine that reported


def plan_job(spec: DeploymentSpec, job: EmbedJob) -> PlannedJob:
    """Open (or check) the dataset and plan the shards not yet written."""
    dataset = Dataset(job.out, job.fingerprint(spec.models[0]))
    inputs = sources.stamps(job.files)
    done = dataset.open(inputs)
    planned = list(sources.plan(job.files, job.shard_rows))
    if dataset.changed:  # this machine reads the rows of the shards written, to compare
        current = {p.shard: rows_digest(sources.read_shard(p, job.text_field, job.id_field, job.keep))
                   for p in planned if p.shard in done}
        done = dataset.drop_changed(done, current)
    todo = [p for p in planned if p.shard not in done]
    total = sum(s.count for p in planned for s in p.segments)
    left = sum(s.count for p in todo for s in p.segments)
    meter = Meter(total, before=total - left, errors_before=dataset.errors(done))
    return PlannedJob(dataset, done, todo, meter, inputs)


def collect(planned: PlannedJob, reports: Iterable[Mapping[str, Any]], job: EmbedJob) -> None:
    """Count the workers' reports as they come, with progress; stop once the job cannot end
    well (leaving the iterable raises into it, which is how Ray and Modal cancel the shards
    still to do). Until the first report, the workers are loading the model (an export can
    take minutes): a step of its own, not a bar at 0."""
    reports = iter(reports)
    with slow_step("starting the workers: each loads the model (an export, once, can take minutes)"):
        first = next(reports, None)
    if first is None:
        return
    with planned.meter:
        for report in itertools.chain([first], reports):
            planned.meter.add(report)
            planned.engines.add(f"{report['backend']} {report['dtype']}")
            check_errors(planned.meter, job, planned.dataset.out)


def finish(
    planned: PlannedJob, spec: DeploymentSpec, runner: str, workers: int, job: EmbedJob, **more: Any
) -> dict[str, Any]:
    """The summary, also written into the manifest (`outcome.conclude`: a job that did nothing
    or set aside too many rows fails here)."""
    return conclude(planned.dataset, planned.meter, job, planned.inputs, workers=workers,
                    shards_skipped=len(planned.done), runner=runner, model=spec.models[0].model_id,
                    engines=sorted(planned.engines), **more)
