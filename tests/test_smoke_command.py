"""`infinity-cloud smoke TARGET`: deploy (or take the running endpoint), check embeddings,
rerank and classify through the platform against the same spec run here, time it, delete
what it made. Offline: a real server process for local; for SageMaker moto's control plane
and the real container entrypoint behind a stand-in of the runtime endpoint; for Lambda
moto's control plane and the built image's own handler answering `lambda.invoke`."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from botocore.response import StreamingBody
from conftest import FAKE, server_process
from lambda_runtime_standin import LambdaRuntime
from moto import mock_aws
from test_sagemaker_deploy import RuntimeStandIn
from test_sagemaker_target import Serve, write_config
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.targets.aws_lambda import lambda_api
from infinity_cloud.targets.sagemaker import sagemaker_api

runner = CliRunner()
REGION = "us-east-1"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/infinity-cloud:1"
ROLE = "arn:aws:iam::123456789012:role/exec"


def models(embedder: Path, reranker: Path, classifier: Path, backend: str = "onnx") -> list[str]:
    args = []
    for path, name in ((embedder, "emb"), (reranker, "rr"), (classifier, "cl")):
        args += ["--model-id", str(path), "--served-model-name", name]
    return [*args, "--backend", backend]


def test_smoke_local_checks_a_running_server(tiny_embedder: Path, tiny_reranker: Path, tiny_classifier: Path):
    flags = models(tiny_embedder, tiny_reranker, tiny_classifier)
    with server_process(*flags) as url:
        port = url.rsplit(":", 1)[1]
        result = runner.invoke(cli, ["smoke", "local", "--port", port, *flags])
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert lines[0].startswith(f"deployed: taking the server at {url}")
        embedded = "embeddings: emb, 4 texts, worst cosine to the local run 1.0000"
        assert any(line.startswith(embedded) for line in lines)
        assert any(line.startswith("rerank: rr, 3 documents, the same ranking") for line in lines)
        assert any(line.startswith("classify: cl, 4 texts, top labels the same") for line in lines)
        assert any(line.startswith("latency: embeddings of one text, 5 calls") for line in lines)
        assert lines[-1] == "smoke: every check held"


def test_smoke_fails_when_the_endpoint_answers_otherwise(tiny_embedder: Path) -> None:
    """A server whose model is not the spec's (here a stand-in backend): exit 1, and why."""
    other = ["--model-id", str(tiny_embedder), "--served-model-name", "emb", "--backend", FAKE]
    with server_process(*other) as url:
        port = url.rsplit(":", 1)[1]
        result = runner.invoke(cli, ["smoke", "local", "--port", port, "--model-id", str(tiny_embedder),
                                     "--served-model-name", "emb", "--backend", "onnx"])
    assert result.exit_code == 1, result.output
    assert "(FAILED)" in result.output and "smoke: FAILED (emb: embeddings' cosine" in result.output


@pytest.fixture
def sagemaker_runtime(tmp_path: Path, tiny_embedder: Path, tiny_reranker: Path, tiny_classifier: Path,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The container the image runs (its real `serve`), reached through a stand-in of
    SageMaker's runtime endpoint, with the spec's models and backend."""
    served = [{"model_id": str(path), "served_model_name": name, "backend": "onnx"}
              for path, name in ((tiny_embedder, "emb"), (tiny_reranker, "rr"), (tiny_classifier, "cl"))]
    container = Serve(write_config(tmp_path, served))
    handler = type("Handler", (RuntimeStandIn,), {"container_url": container.url})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(sagemaker_api, "POLL_S", 0.0)
    try:
        container.wait_ready()
        yield
    finally:
        server.shutdown()
        container.stop()


@mock_aws
def test_smoke_sagemaker_deploys_checks_and_deletes(
    fake_aws_credentials: None, sagemaker_runtime: None, tmp_path: Path, tiny_embedder: Path,
    tiny_reranker: Path, tiny_classifier: Path,
) -> None:
    flags = [*models(tiny_embedder, tiny_reranker, tiny_classifier), "--instance-type", "ml.m5.large",
             "--image-uri", IMAGE, "--role", ROLE, "--region", REGION, "--endpoint-name", "emb"]
    result = runner.invoke(cli, ["smoke", "sagemaker", "--out", str(tmp_path / "build"), *flags])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("deploy: SageMaker endpoint 'emb' in") for line in lines)
    assert sum(line.startswith(("embeddings: emb", "rerank: rr", "classify: cl")) for line in lines) == 3
    assert "delete: SageMaker endpoint 'emb' and what its deploy made" in lines
    sm = boto3.client("sagemaker", region_name=REGION)
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []

    kept = runner.invoke(cli, ["smoke", "sagemaker", "--out", str(tmp_path / "build"), *flags, "--keep"])
    assert kept.exit_code == 0 and "kept: SageMaker endpoint 'emb'" in kept.output
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["emb"]
    again = runner.invoke(cli, ["smoke", "sagemaker", *flags, "--deployed"])  # the one running now
    assert again.exit_code == 0 and "deploy:" not in again.output and "delete:" not in again.output
    # Without --deployed, an endpoint that is there is not replaced, nor deleted after.
    refused = runner.invoke(cli, ["smoke", "sagemaker", "--out", str(tmp_path / "build"), *flags])
    assert refused.exit_code == 2 and "exists already" in refused.output and "--deployed" in refused.output
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["emb"]


@mock_aws
def test_smoke_aws_lambda_deploys_checks_and_deletes(
    fake_aws_credentials: None, tmp_path: Path, tiny_embedder: Path, tiny_reranker: Path,
    tiny_classifier: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """lambda.invoke is answered by the built image's own handler (moto runs functions in
    Docker only), in a process of its own as Lambda runs it: from the task root, with its
    environment."""
    out = tmp_path / "build"
    monkeypatch.setattr(lambda_api, "POLL_S", 0.0)
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "lambda.amazonaws.com"}}]}
    role = boto3.client("iam", region_name=REGION).create_role(
        RoleName="exec", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    flags = [*models(tiny_embedder, tiny_reranker, tiny_classifier), "--image-uri", IMAGE, "--role", role,
             "--region", REGION, "--function-name", "emb"]
    function = LambdaRuntime(out, tmp_path)

    make_call = BaseClient._make_api_call

    def api_call(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        if self.meta.service_model.service_name == "lambda" and operation == "Invoke":
            payload = json.dumps(function.invoke(json.loads(params["Payload"]))).encode()
            return {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(payload), len(payload))}
        return make_call(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", api_call)
    try:
        result = runner.invoke(cli, ["smoke", "aws-lambda", "--out", str(out), *flags])
    finally:
        function.close()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("deploy: Lambda function 'emb' in") for line in lines)
    assert sum(line.startswith(("embeddings: emb", "rerank: rr", "classify: cl")) for line in lines) == 3
    assert lines[-2:] == ["delete: Lambda function 'emb' and what its deploy made", "smoke: every check held"]
    assert boto3.client("lambda", region_name=REGION).list_functions()["Functions"] == []
    assert function.invocations, "the handler answered"
