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
AGENT_PAYLOAD_BYTES = 300  # mini-batches of a few lines: several per object


def agent(server: str, s3: Any, params: dict[str, Any]) -> int:
    """The Batch Transform agent's work for one job, against the container at `server`;
    returns how many mini-batches it posted."""
    settings = httpx.get(f"{server}/execution-parameters", timeout=30).json()
    assert settings["BatchStrategy"] == "MULTI_RECORD" and params["BatchStrategy"] == "MultiRecord"
    source = params["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"].removeprefix("s3://")
    bucket, prefix = source.split("/", 1)
    out_bucket, out_prefix = params["TransformOutput"]["S3OutputPath"].removeprefix("s3://").split("/", 1)
    assert (
        params["TransformInput"]["SplitType"] == "Line"
        and params["TransformOutput"]["AssembleWith"] == "Line"
    )
    posted = 0
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        lines = (
            s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read().decode().splitlines(keepends=True)
        )
        batches, batch = [], ""
        for line in lines:
            if batch and len(batch) + len(line) > min(AGENT_PAYLOAD_BYTES, params["MaxPayloadInMB"] * 2**20):
                batches.append(batch)
                batch = ""
            batch += line
        if batch:
            batches.append(batch)
        answered = []
        for body in batches:
            response = httpx.post(
                f"{server}/invocations",
                content=body,
                timeout=60,
                headers={"Content-Type": params["TransformInput"]["ContentType"]},
            )
            assert response.status_code == 200, response.text
            answered.append(response.text.rstrip("\n"))
            posted += 1
        name = item["Key"].removeprefix(prefix)
        s3.put_object(Bucket=out_bucket, Key=f"{out_prefix}{name}.out", Body="\n".join(answered) + "\n")
    return posted


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


def test_a_batch_transform_job_embeds_an_s3_corpus_into_an_s3_dataset(
    tiny_embedder: Path, tmp_path: Path, moto_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    import pyarrow.parquet as pq

    records = [{"id": f"d{i}", "text": f"passage number {i} about shards"} for i in range(45)]
    records[7]["text"] = ""
    records[30] = {"id": "no-text"}
    s3 = s3_client()
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(
        Bucket=BUCKET, Key="corpus/part-1.jsonl", Body="".join(json.dumps(r) + "\n" for r in records[:25])
    )
    s3.put_object(
        Bucket=BUCKET, Key="corpus/part-2.jsonl", Body="".join(json.dumps(r) + "\n" for r in records[25:])
    )
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    sagemaker.create_model(
        ModelName="emb-20261204-000000",
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/ic:1"},
    )
    model = ["--model-id", str(tiny_embedder), "--backend", "torch", "--dtype", "float32"]
    made: list[dict[str, Any]] = []
    with server_process(*model) as server:
        real = aws.clients

        def hooked(region: str | None) -> Any:
            make = real(region)

            def client(service: str) -> Any:
                made_client = make(service)
                if service == "sagemaker":

                    def run_agent(params: dict[str, Any], **_: Any) -> None:
                        made.append({**params, "posted": agent(server, s3, params)})

                    made_client.meta.events.register(
                        "provide-client-params.sagemaker.CreateTransformJob", run_agent
                    )
                return made_client

            return client

        import infinity_cloud.targets.sagemaker.batch as batch

        monkeypatch.setattr(batch, "clients", hooked)
        result = runner.invoke(
            cli,
            [
                "embed",
                f"s3://{BUCKET}/corpus/",
                "--out",
                f"s3://{BUCKET}/vectors",
                *model,
                "--shard-rows",
                "20",
                "--runner",
                "sagemaker",
                "--region",
                "us-east-1",
                "--job-model",
                "emb-20261204-000000",
                "--max-error-rate",  # 2 bad rows of 45
                "0.1",
            ],
        )
        assert result.exit_code == 0, result.output
        texts = [r["text"] for i, r in enumerate(records) if i not in (7, 30)]
        want = httpx.post(f"{server}/embeddings", json={"input": texts}, timeout=60).json()["data"]
    (params,) = made
    assert params["posted"] > 3  # several mini-batches to each of the three objects
    assert params["ModelName"] == "emb-20261204-000000"
    assert params["TransformInput"]["ContentType"] == "application/jsonlines"
    assert params["TransformResources"] == {"InstanceType": "ml.c7i.xlarge", "InstanceCount": 1}
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["runner"] == "sagemaker" and summary["rows"] == 45 and summary["bad_rows"] == 2
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/part-")["Contents"]
    keys = sorted(o["Key"] for o in listed)
    assert keys == [f"vectors/part-{k:06d}.parquet" for k in range(3)]
    tables = []
    for key in keys:
        path = tmp_path / Path(key).name
        path.write_bytes(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        tables.append(pq.read_table(path))
    assert [r for t in tables for r in t["row"].to_pylist()] == [i for i in range(45) if i not in (7, 30)]
    got = np.array([v for t in tables for v in t["embedding"].to_pylist()])
    np.testing.assert_allclose(got, np.array([d["embedding"] for d in want]), rtol=1e-5, atol=1e-6)
    errors = s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/errors/")["Contents"]
    lines = [
        json.loads(x)
        for o in errors
        for x in s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read().decode().splitlines()
    ]
    # Row 7's reason is the endpoint's, for its place in the mini-batch it was sent in.
    assert [e["row"] for e in lines] == [7, 30] and lines[1]["error"] == "no 'text' field"
    assert lines[0]["error"].startswith("'input' item ") and lines[0]["error"].endswith(" is an empty string")
