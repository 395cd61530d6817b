"""`infinity-cloud embed --runner sagemaker`: a Batch Transform job on a SageMaker model made
by `deploy sagemaker` (the same image answers endpoints and jobs). The shards not yet written
go to S3 as JSON Lines (one text a line), the job embeds them (SplitType=Line,
BatchStrategy=MultiRecord, AssembleWith=Line: one answer line per input line, in order), and
each shard's answers become its Parquet file, written whole as the local runner writes it, so
the output and its resume are the same whichever runner made them.

The mini-batch size and how many at once are left to the container: a job that does not set
MaxPayloadInMB and MaxConcurrentTransforms gets what its `/execution-parameters` asks for
(AWS, "Use Your Own Inference Code with Batch Transform"), which is sized from the memory
budget of the instance it runs on. Each job stages under a prefix of its own, so a resume
sends only the shards not yet written. A job that fails or is stopped has its completed
output objects collected before the failure is reported: those shards are not sent again."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from infinity_cloud.bulk import sources
from infinity_cloud.bulk.dataset import Dataset, filesystem
from infinity_cloud.bulk.job import EmbedJob, chunk_table, dense_column, shard_outcome, shard_table
from infinity_cloud.bulk.meter import Meter
from infinity_cloud.bulk.outcome import conclude
from infinity_cloud.bulk.workers import plan_job
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.targets.aws import AwsError, aws_calls, clients

POLL_S = 15.0
JSON_LINES = "application/jsonlines"


def input_key(staging: str, job: str, shard: int) -> str:
    """Where job `job` reads a shard's texts: a prefix of its own, so that a resumed job's
    input is only what is left to do."""
    return f"{staging}/{job}/input/part-{shard:06d}.jsonl"


def output_key(staging: str, job: str, shard: int) -> str:
    """Where the job writes a shard's answers: the input's name and `.out` (AWS's rule)."""
    return f"{staging}/{job}/output/part-{shard:06d}.jsonl.out"


def run_batch_transform(
    spec: DeploymentSpec, job: EmbedJob, *, model_name: str, instance_type: str, instance_count: int,
    staging: str, region: str | None = None, poll_s: float = POLL_S,
) -> dict[str, Any]:
    """Stage the shards not yet written, run one transform job over them, and write each
    shard's answers into the dataset."""
    staging = staging.rstrip("/")
    if not staging.startswith("s3://"):
        raise ConfigError(f"--staging {staging!r}: a Batch Transform job reads and writes S3: give "
                          "s3://BUCKET/PREFIX")
    planned = plan_job(spec, job)
    dataset, done, todo, meter = planned.dataset, planned.done, planned.todo, planned.meter
    if todo:
        fs, _ = filesystem(staging)
        name = f"embed-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"  # and its staging prefix
        # A chunking job's records ask the container for their chunks (`batch_transform._chunking`).
        chunking = {} if job.chunk_tokens is None else {
            "chunk_tokens": job.chunk_tokens, "overlap_tokens": job.overlap_tokens,
            "late_chunking": job.late_chunking}
        for shard in todo:  # one object a shard: its good rows' texts, one a line
            rows = sources.read_shard(shard, job.text_field, job.id_field, job.keep)
            lines = "".join(json.dumps({"text": r.text, **chunking}) + "\n"
                            for r in rows if r.text is not None)
            with fs.open_output_stream(input_key(staging, name, shard.shard).removeprefix("s3://")) as handle:
                handle.write(lines.encode())
        client = clients(region)("sagemaker")
        with aws_calls("create the transform job"):
            client.create_transform_job(
                TransformJobName=name, ModelName=model_name, BatchStrategy="MultiRecord",
                TransformInput={"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
                                                                "S3Uri": f"{staging}/{name}/input/"}},
                                "ContentType": JSON_LINES, "SplitType": "Line", "CompressionType": "None"},
                TransformOutput={"S3OutputPath": f"{staging}/{name}/output/", "Accept": JSON_LINES,
                                 "AssembleWith": "Line"},
                TransformResources={"InstanceType": instance_type, "InstanceCount": instance_count},
            )
        failure = _wait(client, name, poll_s)
        # A failed or stopped job wrote the objects it finished: those shards are kept.
        finished = todo if failure is None else [s for s in todo if _written(fs, staging, name, s.shard)]
        answers = {shard.shard: _answers(fs, staging, name, shard.shard) for shard in finished}
        found = (len(a["embedding"]) for lines in answers.values() for answer in lines
                 for a in answer.get("chunks", [answer]) if "embedding" in a)
        width = next(found, 0)
        with meter:
            for shard in finished:
                _collect(dataset, job, shard, answers.pop(shard.shard), width, meter)
        if failure is not None:
            raise AwsError(f"{failure}; the {len(finished)} of its {len(todo)} shards it finished are "
                           "written: the same command again sends only the rest")
    return conclude(dataset, meter, job, planned.inputs, workers=instance_count, shards_skipped=len(done),
                    runner="sagemaker", model=spec.models[0].model_id, sagemaker_model=model_name)


def _wait(client: Any, name: str, poll_s: float) -> str | None:
    """Until the job ends: None when it completed, else what it ended as and why."""
    started = time.perf_counter()
    while True:
        with aws_calls("read the transform job"):
            described = client.describe_transform_job(TransformJobName=name)
        status = described["TransformJobStatus"]
        if status == "Completed":
            return None
        if status in ("Failed", "Stopped"):
            reason = described.get("FailureReason", "no reason given")
            return (f"transform job {name} {status.lower()}: {reason} (its CloudWatch log group is "
                    "/aws/sagemaker/TransformJobs)")
        print(f"transform job {name}: {status} after {time.perf_counter() - started:.0f} s", flush=True)
        time.sleep(poll_s)


def _written(fs: Any, staging: str, job: str, shard: int) -> bool:
    """Whether the job wrote the shard's answers (an object appears whole: AWS writes each
    output object once its input is done)."""
    from pyarrow import fs as pafs

    info = fs.get_file_info(output_key(staging, job, shard).removeprefix("s3://"))
    return bool(info.type == pafs.FileType.File)


def _answers(fs: Any, staging: str, job: str, shard: int) -> list[dict[str, Any]]:
    with fs.open_input_stream(output_key(staging, job, shard).removeprefix("s3://")) as handle:
        return [json.loads(line) for line in handle.read().decode().splitlines() if line.strip()]


def _collect(
    dataset: Dataset, job: EmbedJob, shard: sources.ShardPlan, answers: list[dict[str, Any]], width: int,
    meter: Meter,
) -> None:
    """The shard's answer lines, matched to its good rows in order, as its Parquet file."""
    import numpy as np

    rows = sources.read_shard(shard, job.text_field, job.id_field, job.keep)
    good = [r for r in rows if r.text is not None]
    if len(answers) != len(good):
        raise AwsError(f"the job answered {len(answers)} lines for the {len(good)} of shard {shard.shard}: "
                       "its output cannot be matched to the input")
    errors = [{"row": r.number, "id": r.id, "error": r.problem} for r in rows if r.text is None]
    answer_key = "embedding" if job.chunk_tokens is None else "chunks"
    kept, vectors, spans = [], [], []
    for row, answer in zip(good, answers, strict=True):
        if answer_key in answer:
            kept.append(row)
            if job.chunk_tokens is None:
                vectors.append(answer["embedding"])
                continue
            spans.append([(c["start"], c["end"], c["tokens"]) for c in answer["chunks"]])
            vectors += [c["embedding"] for c in answer["chunks"]]
        else:
            errors.append({"row": row.number, "id": row.id, "error": answer.get("error", f"no {answer_key}")})
    errors.sort(key=lambda e: e["row"])
    matrix = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), width)
    column = dense_column(matrix, width)
    chunked = job.chunk_tokens is not None
    table = (chunk_table(kept, spans, column, job) if chunked
             else shard_table(kept, {"embedding": column}, job))
    result = shard_outcome(rows, table, errors, 0)
    dataset.write_shard(shard.shard, result.table, result.errors, result.digest)
    meter.add(result.report(len(rows)))
