"""`infinity-cloud embed --runner sagemaker`: the job's calls against moto (S3 and SageMaker, run
as a server, so that pyarrow's own S3 client, which writes the dataset, reaches it too),
and its work done by a stand-in for the Batch Transform agent that feeds the real server, as
AWS documents the agent (docs.aws.amazon.com/sagemaker/latest/dg/batch-transform.html and
your-algorithms-batch-code.html): it asks GET /execution-parameters, splits each input object
into lines (SplitType=Line), posts them a mini-batch at a time (BatchStrategy=MultiRecord, at
most MaxPayloadInMB, here made small so that every object takes several) with the job's
ContentType, and writes what comes back, line by line, to OUTPUT/KEY.out (AssembleWith=Line).
moto completes the job at once and writes nothing: the stand-in runs while the job is created.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import server_process
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.targets import aws

moto = pytest.importorskip("moto")
runner = CliRunner()
BUCKET = "corpus-bucket"
MB = 2**20


@dataclass
class Agent:
    """The Batch Transform agent's work for one job, against the container at `server`. As
    AWS documents it: the settings the job leaves unset (MaxPayloadInMB,
    MaxConcurrentTransforms) come from the container's GET /execution-parameters, within
    CreateTransformJob's bounds (MaxPayloadInMB at most 100, and times MaxConcurrentTransforms
    at most 100: docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTransformJob.html);
    each input object is split into lines (SplitType=Line) and posted in mini-batches as full
    as MaxPayloadInMB allows (BatchStrategy=MultiRecord), MaxConcurrentTransforms at once; each
    object's answers are written whole to OUTPUT/KEY.out once it is done (AssembleWith=Line).
    `fail_after` objects written, the job fails (an invocation failed): the objects done are in
    S3, the others are not."""

    server: str
    s3: Any
    fail_after: int | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def run(self, params: dict[str, Any]) -> None:
        settings = httpx.get(f"{self.server}/execution-parameters", timeout=30).json()
        assert settings["BatchStrategy"] == "MULTI_RECORD" and params["BatchStrategy"] == "MultiRecord"
        payload_mb = params.get("MaxPayloadInMB") or settings["MaxPayloadInMB"]
        concurrent = params.get("MaxConcurrentTransforms") or settings["MaxConcurrentTransforms"]
        assert 1 <= payload_mb <= 100 and payload_mb * concurrent <= 100
        assert params["TransformInput"]["SplitType"] == "Line"
        assert params["TransformOutput"]["AssembleWith"] == "Line"
        source = params["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"].removeprefix("s3://")
        bucket, prefix = source.split("/", 1)
        out_bucket, out_prefix = params["TransformOutput"]["S3OutputPath"].removeprefix("s3://").split("/", 1)
        job = {**params, "payload_mb": payload_mb, "concurrent": concurrent, "objects": [], "records": 0,
               "most_in_flight": 0, "status": "Completed"}
        self.jobs.append(job)
        in_flight, lock = 0, threading.Lock()

        def post(body: str) -> str:
            nonlocal in_flight
            with lock:
                in_flight += 1
                job["most_in_flight"] = max(job["most_in_flight"], in_flight)
            try:
                response = httpx.post(f"{self.server}/invocations", content=body, timeout=600,
                                      headers={"Content-Type": params["TransformInput"]["ContentType"]})
            finally:
                with lock:
                    in_flight -= 1
            assert response.status_code == 200, response.text
            return response.text

        with ThreadPoolExecutor(concurrent) as pool:
            for item in self.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
                if self.fail_after is not None and len(job["objects"]) == self.fail_after:
                    job["status"] = "Failed"
                    return
                lines = self.s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read().decode()
                batches = mini_batches(lines.splitlines(keepends=True), payload_mb * MB)
                answered = "".join(pool.map(post, batches))
                assert answered.count("\n") == lines.count("\n")
                name = item["Key"].removeprefix(prefix)
                job["objects"].append(name)
                job["records"] += lines.count("\n")
                job["mini_batches"] = job.get("mini_batches", 0) + len(batches)
                self.s3.put_object(Bucket=out_bucket, Key=f"{out_prefix}{name}.out", Body=answered)

    def hook(self, client: Any) -> None:
        """The agent runs when the job is created (moto completes it at once and writes
        nothing); the job then reads as the agent ended it."""
        client.meta.events.register("provide-client-params.sagemaker.CreateTransformJob",
                                    lambda params, **_: self.run(params))

        def status(parsed: dict[str, Any], **_: Any) -> None:
            if self.jobs and self.jobs[-1]["status"] == "Failed":
                parsed["TransformJobStatus"] = "Failed"
                parsed["FailureReason"] = "ClientError: See job logs for more information"

        client.meta.events.register("after-call.sagemaker.DescribeTransformJob",
                                    lambda parsed, **kw: status(parsed, **kw))


def mini_batches(lines: list[str], payload_bytes: int) -> list[str]:
    """Whole lines, as many as fit `payload_bytes` a mini-batch."""
    batches, batch = [], ""
    for line in lines:
        if batch and len(batch) + len(line) > payload_bytes:
            batches.append(batch)
            batch = ""
        batch += line
    return [*batches, batch] if batch else batches


@pytest.fixture
def moto_server(fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    import logging

    monkeypatch.setattr(logging.getLogger("werkzeug"), "disabled", True)  # a line per request
    """moto as a server on this machine, which boto3 and pyarrow's own S3 client both reach
    (AWS_ENDPOINT_URL): our dataset is read and written with pyarrow."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    httpx.post(f"http://{host}:{port}/moto-api/reset")  # moto's state is the process's: start empty
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    try:
        yield
    finally:
        server.stop()


def s3_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))


RECORDS = [{"id": f"d{i}", "text": f"passage number {i} about shards"} for i in range(45)]
RECORDS[7]["text"] = ""
RECORDS[30] = {"id": "no-text"}
GOOD_ROWS = [i for i in range(45) if i not in (7, 30)]


def a_corpus_and_a_model(s3: Any) -> None:
    """The corpus in two S3 objects, and the SageMaker model `deploy` would have made."""
    import boto3

    s3.create_bucket(Bucket=BUCKET)
    for key, part in (("corpus/part-1.jsonl", RECORDS[:25]), ("corpus/part-2.jsonl", RECORDS[25:])):
        s3.put_object(Bucket=BUCKET, Key=key, Body="".join(json.dumps(r) + "\n" for r in part))
    boto3.client("sagemaker", region_name="us-east-1").create_model(
        ModelName="emb-20261204-000000",
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/ic:1"},
    )


def embed_with_the_agent(
    agent: Agent, model: list[str], shard_rows: int, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """`embed --runner sagemaker` with its SageMaker client's jobs run by `agent`."""
    import infinity_cloud.targets.sagemaker.batch as batch

    real = aws.clients

    def hooked(region: str | None) -> Any:
        make = real(region)

        def client(service: str) -> Any:
            made = make(service)
            if service == "sagemaker":
                agent.hook(made)
            return made

        return client

    monkeypatch.setattr(batch, "clients", hooked)
    return runner.invoke(cli, [
        "embed", f"s3://{BUCKET}/corpus/", "--out", f"s3://{BUCKET}/vectors", *model,
        "--shard-rows", str(shard_rows), "--runner", "sagemaker", "--region", "us-east-1",
        "--job-model", "emb-20261204-000000",
        "--max-error-rate", "0.1",  # 2 bad rows of 45
    ])


def dataset_rows(s3: Any, tmp_path: Path) -> tuple[list[str], list[int], np.ndarray]:
    """The dataset's shard files, its rows in file order, and their vectors."""
    import pyarrow.parquet as pq

    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/part-").get("Contents", [])
    keys = sorted(o["Key"] for o in listed)
    tables = []
    for key in keys:
        path = tmp_path / Path(key).name
        path.write_bytes(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        tables.append(pq.read_table(path))
    rows = [r for t in tables for r in t["row"].to_pylist()]
    return keys, rows, np.array([v for t in tables for v in t["embedding"].to_pylist()])


MODEL_ARGS = ["--backend", "torch", "--dtype", "float32"]


def test_a_batch_transform_job_embeds_an_s3_corpus_into_an_s3_dataset(
    tiny_embedder: Path, tmp_path: Path, moto_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = s3_client()
    a_corpus_and_a_model(s3)
    model = ["--model-id", str(tiny_embedder), *MODEL_ARGS]
    with server_process(*model) as server:
        agent = Agent(server, s3)
        result = embed_with_the_agent(agent, model, 20, monkeypatch)
        assert result.exit_code == 0, result.output
        texts = [RECORDS[i]["text"] for i in GOOD_ROWS]
        want = httpx.post(f"{server}/embeddings", json={"input": texts}, timeout=60).json()["data"]
    (job,) = agent.jobs
    # The job leaves the mini-batch settings to the container, whose are within AWS's bounds;
    # a 6 MB mini-batch holds a whole object here.
    assert "MaxPayloadInMB" not in job and "MaxConcurrentTransforms" not in job
    assert job["payload_mb"] == 6 and job["mini_batches"] == 3 and job["most_in_flight"] <= job["concurrent"]
    assert job["ModelName"] == "emb-20261204-000000"
    assert job["TransformInput"]["ContentType"] == "application/jsonlines"
    assert job["TransformResources"] == {"InstanceType": "ml.c7i.xlarge", "InstanceCount": 1}
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["runner"] == "sagemaker" and summary["rows"] == 45 and summary["bad_rows"] == 2
    keys, rows, got = dataset_rows(s3, tmp_path)
    assert keys == [f"vectors/part-{k:06d}.parquet" for k in range(3)]
    assert rows == GOOD_ROWS
    np.testing.assert_allclose(got, np.array([d["embedding"] for d in want]), rtol=1e-5, atol=1e-6)
    errors = s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/errors/")["Contents"]
    lines = [
        json.loads(x)
        for o in errors
        for x in s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read().decode().splitlines()
    ]
    # Row 7's reason is the endpoint's, naming its line in the mini-batch it was sent in.
    assert [e["row"] for e in lines] == [7, 30] and lines[1]["error"] == "no 'text' field"
    assert lines[0]["error"].startswith("line ") and lines[0]["error"].endswith(" is an empty string")


def test_a_job_that_fails_half_way_keeps_what_it_finished_and_its_resume_sends_only_the_rest(
    tiny_embedder: Path, tmp_path: Path, moto_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five shards; the job fails after writing two of its output objects (as a real job's
    failed invocation ends it, the objects done kept in S3). The runner writes those two
    shards, then reports the failure; the same command again stages and sends only the other
    three, and every row is written exactly once."""
    s3 = s3_client()
    a_corpus_and_a_model(s3)
    model = ["--model-id", str(tiny_embedder), *MODEL_ARGS]
    with server_process(*model) as server:
        agent = Agent(server, s3, fail_after=2)
        failed = embed_with_the_agent(agent, model, 10, monkeypatch)
        assert failed.exit_code == 2, failed.output
        said = " ".join(failed.output.split())
        assert "failed: ClientError: See job logs for more information" in said
        assert "the 2 of its 5 shards it finished are written: the same command again sends only the rest" \
            in said
        keys, rows, _ = dataset_rows(s3, tmp_path)
        assert keys == ["vectors/part-000000.parquet", "vectors/part-000001.parquet"]
        assert rows == [i for i in GOOD_ROWS if i < 20]
        agent.fail_after = None
        resumed = embed_with_the_agent(agent, model, 10, monkeypatch)
        assert resumed.exit_code == 0, resumed.output
        texts = [RECORDS[i]["text"] for i in GOOD_ROWS]
        want = httpx.post(f"{server}/embeddings", json={"input": texts}, timeout=60).json()["data"]
    first, second = agent.jobs
    assert first["objects"] == ["part-000000.jsonl", "part-000001.jsonl"]
    # The resumed job's input is only what was missing: shards 2-4, their 23 good rows.
    assert second["objects"] == ["part-000002.jsonl", "part-000003.jsonl", "part-000004.jsonl"]
    assert second["records"] == len([i for i in GOOD_ROWS if i >= 20])
    summary = json.loads(resumed.stdout[resumed.stdout.index("{") :])
    assert summary["shards_skipped"] == 2 and summary["rows_before"] == 20
    keys, rows, got = dataset_rows(s3, tmp_path)
    assert keys == [f"vectors/part-{k:06d}.parquet" for k in range(5)]
    assert rows == GOOD_ROWS  # every row once, in order
    np.testing.assert_allclose(got, np.array([d["embedding"] for d in want]), rtol=1e-5, atol=1e-6)


def test_a_chunked_batch_transform_job_writes_the_chunks_the_container_cuts(
    tiny_embedder: Path, tmp_path: Path, moto_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--chunk-tokens` on SageMaker: each record asks the container for its chunks, and the
    dataset holds a row per chunk, with the offsets, tokens and vectors the server's own
    `/v1/embeddings/chunked` gives the same texts."""
    import pyarrow.parquet as pq

    s3 = s3_client()
    a_corpus_and_a_model(s3)
    model = ["--model-id", str(tiny_embedder), *MODEL_ARGS]
    with server_process(*model) as server:
        agent = Agent(server, s3)
        result = embed_with_the_agent(agent, [*model, "--chunk-tokens", "3", "--overlap-tokens", "1"], 20,
                                      monkeypatch)
        assert result.exit_code == 0, result.output
        texts = [RECORDS[i]["text"] for i in GOOD_ROWS]
        want = httpx.post(f"{server}/v1/embeddings/chunked", timeout=60,
                          json={"input": texts, "chunk_tokens": 3, "overlap_tokens": 1}).json()["data"]
        bad = httpx.post(f"{server}/invocations", headers={"Content-Type": "application/jsonlines"},
                         content=b'{"text": "a b", "chunk_tokens": "3"}\n', timeout=60)
    assert bad.status_code == 200 and "'chunk_tokens' is '3', not an integer" in bad.text
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/part-")["Contents"])
    tables = []
    for key in keys:
        (tmp_path / Path(key).name).write_bytes(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        tables.append(pq.read_table(tmp_path / Path(key).name))
    rows = [r for t in tables for r in t.to_pylist()]
    expected = [(row, n, c["start"], c["end"], c["tokens"], RECORDS[row]["text"][c["start"]:c["end"]])
                for row, doc in zip(GOOD_ROWS, want, strict=True) for n, c in enumerate(doc["chunks"])]
    assert [(r["row"], r["chunk"], r["start"], r["end"], r["tokens"], r["text"]) for r in rows] == expected
    assert len(rows) > 2 * len(GOOD_ROWS)
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows]),
                               np.array([c["embedding"] for doc in want for c in doc["chunks"]]), atol=1e-5)
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["rows"] == 45 and summary["bad_rows"] == 2
