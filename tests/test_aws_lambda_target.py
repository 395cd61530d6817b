"""The Lambda target: `build aws-lambda` makes an image context whose handler, run exactly
as the image would (a fresh process, LAMBDA_TASK_ROOT at the build folder, the Dockerfile's
ENV, the CMD's handler), serves real API Gateway REST v1, HTTP API v2 / Function URL, ALB and
direct events through the real mangum, with the local server's answers, building the engine
once across invocations."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import serve_in_process
from lambda_runtime_standin import image_env
from typer.testing import CliRunner

from infinity_cloud.backends.exports import CACHE_ENV
from infinity_cloud.cli import app as cli
from infinity_cloud.core.config import build_spec

runner = CliRunner()
TEXTS = ["what is a panda?", "a bear from China", "x"]
REQUESTS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "embed": ("POST", "/embeddings", {"model": "emb", "input": TEXTS}),
    "embed-v1": ("POST", "/v1/embeddings", {"model": "emb", "input": TEXTS, "encoding_format": "base64"}),
    "rerank": ("POST", "/rerank", {"model": "rr", "query": "panda", "documents": TEXTS}),
    "classify": ("POST", "/classify", {"model": "cl", "input": TEXTS}),
    "bad": ("POST", "/embeddings", {"model": "emb"}),
    "unknown-model": ("POST", "/embeddings", {"model": "nope", "input": ["x"]}),
    "health": ("GET", "/health", None),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_embedder: Path, tiny_reranker: Path,
          tiny_classifier: Path) -> Path:
    out = tmp_path_factory.mktemp("lambda")
    args = ["build", "aws-lambda", "--out", str(out), "--memory", "3538"]
    for path, name in ((tiny_embedder, "emb"), (tiny_reranker, "rr"), (tiny_classifier, "cl")):
        args += ["--model-id", str(path), "--served-model-name", name]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    return out


HARNESS = """
import importlib, json, sys
from infinity_cloud.engine import Engine
loads, closes = [], []
load, close = Engine.load, Engine.close
Engine.load = lambda self: (loads.append(1), load(self))[1]
Engine.close = lambda self: (closes.append(1), close(self))[1]
module_name, _, function = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module_name), function)
events = json.load(open(sys.argv[2]))
answers = [handler(event, None) for event in events]
heavy = sorted(m for m in ("torch", "transformers", "onnx", "openvino") if m in sys.modules)
print(json.dumps({"answers": answers, "loads": len(loads), "closes": len(closes), "heavy": heavy,
                  "package": importlib.import_module("infinity_cloud").__file__}))
"""


def run_handler(out: Path, events: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    env, handler = image_env(out)
    events_file = tmp_path / "events.json"
    events_file.write_text(json.dumps(events))
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, handler, str(events_file)], capture_output=True, text=True,
        timeout=300, cwd=tmp_path,
        # The image's own package copy first, as in ${LAMBDA_TASK_ROOT}; its pinned dependencies
        # are this venv's.
        env={**os.environ, **env, "PYTHONPATH": str(out)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def v1_event(method: str, path: str, body: str | None, base64_body: bool = False) -> dict[str, Any]:
    return {
        "resource": "/{proxy+}", "path": path, "httpMethod": method,
        "headers": {"Content-Type": "application/json", "Host": "abc.execute-api.us-east-1.amazonaws.com"},
        "multiValueHeaders": {}, "queryStringParameters": None, "multiValueQueryStringParameters": None,
        "pathParameters": {"proxy": path.lstrip("/")}, "stageVariables": None,
        "requestContext": {"resourcePath": "/{proxy+}", "httpMethod": method, "path": f"/prod{path}",
                           "stage": "prod", "identity": {"sourceIp": "203.0.113.9"}, "requestId": "r1"},
        "body": body, "isBase64Encoded": base64_body,
    }


def v2_event(method: str, path: str, body: str | None, base64_body: bool = False) -> dict[str, Any]:
    """HTTP API v2, which is also what a Function URL sends."""
    return {
        "version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
        "headers": {"content-type": "application/json", "host": "xyz.lambda-url.us-east-1.on.aws"},
        "requestContext": {"http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                                    "sourceIp": "203.0.113.9", "userAgent": "test"},
                           "domainName": "xyz.lambda-url.us-east-1.on.aws", "requestId": "r2"},
        "body": body, "isBase64Encoded": base64_body,
    }


def alb_event(method: str, path: str, body: str | None, base64_body: bool = False) -> dict[str, Any]:
    return {
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:us-east-1:1:tg/t/1"}},
        "httpMethod": method, "path": path, "queryStringParameters": {},
        "headers": {"content-type": "application/json", "host": "alb.example.com"},
        "body": body or "", "isBase64Encoded": base64_body,
    }


SHAPES = {"rest-v1": v1_event, "http-v2": v2_event, "alb": alb_event}


def decoded(answer: dict[str, Any]) -> tuple[int, Any]:
    body = answer["body"]
    if answer.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    return answer["statusCode"], json.loads(body) if body else None


def without_volatile(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: without_volatile(v) for k, v in body.items() if k not in ("id", "created", "request_id")}
    return body


@pytest.fixture(scope="module")
def local_answers(built: Path, tiny_embedder: Path, tiny_reranker: Path, tiny_classifier: Path
                  ) -> dict[str, tuple[int, Any]]:
    """The local server's answers to the same requests, from the same spec and the original
    models (the image holds their exports, not their weights)."""
    import asyncio

    data = yaml.safe_load((built / "infinity-cloud.yaml").read_text())
    originals = {"emb": tiny_embedder, "rr": tiny_reranker, "cl": tiny_classifier}
    for model in data["models"]:
        model["model_id"] = str(originals[model["served_model_name"]])

    async def ask() -> dict[str, tuple[int, Any]]:
        async with serve_in_process(build_spec(data)) as client:
            answers = {}
            for name, (method, path, body) in REQUESTS.items():
                response = await client.request(method, path, json=body)
                answers[name] = (response.status_code, response.json())
            return answers

    with pytest.MonkeyPatch.context() as patch:  # the exports `build` made, as the image has them
        patch.setenv(CACHE_ENV, str(built / "exports"))
        return asyncio.run(ask())


def test_every_event_shape_answers_as_the_local_server(
    built: Path, local_answers: dict[str, tuple[int, Any]], tmp_path: Path
) -> None:
    events, expected = [], []
    for shape, make in SHAPES.items():
        for name, (method, path, body) in REQUESTS.items():
            events.append(make(method, path, json.dumps(body) if body is not None else None))
            expected.append((shape, name))
    result = run_handler(built, events, tmp_path)
    assert result["package"].startswith(str(built))  # the image's own copy of the package ran
    for (shape, name), answer in zip(expected, result["answers"], strict=True):
        status, body = decoded(answer)
        want_status, want_body = local_answers[name]
        assert status == want_status, (shape, name, body)
        if name == "health":
            assert body["status"] == want_body["status"] == "ok"
        else:
            assert without_volatile(body) == without_volatile(want_body), (shape, name)
    # Built once, at import (the init phase); never stopped by an invocation; no torch.
    assert (result["loads"], result["closes"]) == (1, 0)
    assert result["heavy"] == []


def test_base64_bodies_oversize_bodies_and_direct_invocations(
    built: Path, local_answers: dict[str, tuple[int, Any]], tmp_path: Path
) -> None:
    body = json.dumps(REQUESTS["embed"][2])
    encoded = base64.b64encode(body.encode()).decode()
    big = json.dumps({"model": "emb", "input": ["x" * 1000] * 6500})  # over Lambda's 6 MB
    events = [
        v2_event("POST", "/embeddings", encoded, base64_body=True),
        v1_event("POST", "/embeddings", encoded, base64_body=True),
        v2_event("POST", "/embeddings", big),
        {"route": "embeddings", "body": REQUESTS["embed"][2]},
        {"route": "rerank", "body": REQUESTS["rerank"][2]},
        {"route": "health"},
        {"route": "embeddings", "body": {"model": "emb"}},
    ]
    answers = run_handler(built, events, tmp_path)["answers"]
    for answer in answers[:2]:
        assert decoded(answer) == (200, decoded(answer)[1])
        assert without_volatile(decoded(answer)[1]) == without_volatile(local_answers["embed"][1])
    status, error = decoded(answers[2])
    assert status == 413 and "over the limit of 6291456 bytes" in error["error"]["message"]
    direct = answers[3:]
    assert direct[0]["statusCode"] == 200
    assert without_volatile(direct[0]["body"]) == without_volatile(local_answers["embed"][1])
    assert without_volatile(direct[1]["body"]) == without_volatile(local_answers["rerank"][1])
    assert direct[2]["statusCode"] == 200 and direct[2]["body"]["status"] == "ok"
    assert direct[3]["statusCode"] == 422 and direct[3]["body"]["error"]["param"] is not None


def test_an_answer_is_bounded_by_what_its_event_source_passes_back(built: Path, tmp_path: Path) -> None:
    """An ALB takes 1 MB of a Lambda function's answer (more is a 502), a function URL 6 MB:
    a request whose answer could pass its event's bound is a 413 before any work, and an
    answer the estimate does not cover (documents sent back, escaped in Lambda's envelope) is
    measured and refused with a 413 naming the ALB's limit, shaped for the ALB by mangum."""
    embed = json.dumps({"model": "emb", "input": [f"text {i}" for i in range(2000)]})  # 32 dims: ~1.3 MB
    rerank = json.dumps({"model": "rr", "query": "panda", "documents": ["\u00e9" * 2000] * 100,
                         "return_documents": True})  # 0.4 MB sent, 1.2 MB back once escaped
    events = [alb_event("POST", "/embeddings", embed), v2_event("POST", "/embeddings", embed),
              alb_event("POST", "/rerank", rerank), v2_event("POST", "/rerank", rerank),
              v1_event("POST", "/rerank", rerank)]
    answers = run_handler(built, events, tmp_path)["answers"]
    status, error = decoded(answers[0])
    assert status == 413 and "response limit of 0.9 MB" in error["error"]["message"]  # 95 % of 10^6
    assert decoded(answers[1])[0] == 200 and len(decoded(answers[1])[1]["data"]) == 2000
    status, error = decoded(answers[2])
    assert status == 413 and error["error"]["type"] == "payload_too_large"
    assert "more than an Application Load Balancer's 1 MB" in error["error"]["message"]
    assert "split the request into at least 2" in error["error"]["message"]
    assert set(answers[2]) == set(answers[0])  # shaped as the app's own ALB answers
    for answer in answers[3:]:
        status, body = decoded(answer)
        assert status == 200 and len(body["results"]) == 100
        assert len(json.dumps(answer)) > 1_000_000  # what the ALB would have refused


def test_the_image_holds_one_copy_of_the_weights(built: Path, tiny_embedder: Path) -> None:
    """The runtime exports only: no weights in the model folders, no intermediate ONNX."""
    for folder in (built / "models").iterdir():
        assert not [p.name for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".onnx")]
        assert (folder / "tokenizer.json").is_file() and (folder / "config.json").is_file()
    kinds = sorted(p.name.split("-")[0] for p in (built / "exports").iterdir() if p.is_dir())
    assert kinds == ["onnxruntime"] * 3, kinds


def test_an_int8_image_holds_only_the_export_it_serves(tmp_path: Path, tiny_embedder: Path) -> None:
    """int8 is measured against a float32 export while it is built; the image keeps the verdict,
    not that export (on MiniLM, 90 MB beside the int8 one), and serves from what it keeps."""
    out = tmp_path / "image"
    result = runner.invoke(cli, ["build", "aws-lambda", "--out", str(out), "--model-id", str(tiny_embedder),
                                 "--served-model-name", "emb", "--dtype", "int8"])
    assert result.exit_code == 0, result.output
    manifests = [json.loads((folder / "manifest.json").read_text()) for folder in (out / "exports").iterdir()]
    kept = sorted((manifest["kind"], manifest["options"]["dtype"]) for manifest in manifests)
    assert kept == [("fidelity", "int8"), ("onnxruntime", "int8")], kept
    assert not [p for p in out.iterdir() if p.name.startswith("tmp")]  # nothing set aside is left
    answer = run_handler(out, [{"route": "embeddings", "body": {"model": "emb", "input": TEXTS}}], tmp_path)
    status, body = answer["answers"][0]["statusCode"], answer["answers"][0]["body"]
    assert status == 200 and len(body["data"]) == len(TEXTS)


def test_the_handler_runs_from_a_read_only_task_root(tmp_path: Path, tiny_embedder: Path) -> None:
    """As on Lambda: the task root read-only, only /tmp writable. The image's compile step
    leaves every module of the package a .pyc, and OpenVINO, finding no blob for this CPU
    (one compiled elsewhere), compiles into /tmp rather than failing to write its export."""
    out = tmp_path / "image"
    result = runner.invoke(cli, ["build", "aws-lambda", "--out", str(out), "--model-id", str(tiny_embedder),
                                 "--served-model-name", "emb", "--backend", "openvino"])
    assert result.exit_code == 0, result.output
    # What OpenVINO compiled for this CPU is not in the image: Lambda's compiles its own.
    assert not list((out / "exports").glob("*/compiled")) and len(list((out / "exports").iterdir())) == 1
    dockerfile = (out / "Dockerfile").read_text()
    (step,) = [line[4:] for line in dockerfile.splitlines() if line.startswith("RUN python3 -m compileall")]
    subprocess.run(step.replace("${LAMBDA_TASK_ROOT}", str(out)).replace("python3", sys.executable, 1),
                   shell=True, check=True)
    env, handler = image_env(out)
    (tmp_path / "tmp").mkdir()
    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"route": "embeddings", "body": {"model": "emb", "input": TEXTS}}]))
    python = [sys.executable, "-c", READ_ONLY_HARNESS, handler, str(events), str(out)]
    if os.geteuid() == 0:  # root writes through permissions: a read-only mount instead
        mount = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        command = ["unshare", "-m", "sh", "-c", mount, str(out), *python]
    else:
        subprocess.run(["chmod", "-R", "a-w", str(out)], check=True)
        command = python
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, **env, "PYTHONPATH": str(out), "TMPDIR": str(tmp_path / "tmp")})
    subprocess.run(["chmod", "-R", "u+w", str(out)], check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == 200 and len(report["data"]) == len(TEXTS)
    assert report["written"] is False, "the task root is read-only here"
    assert report["without_pyc"] == [], report["without_pyc"]
    assert "Read-only file system" not in done.stderr and "Permission denied" not in done.stderr
    assert list((tmp_path / "tmp" / "infinity-cloud-openvino").glob("*/*"))  # the blob went to /tmp
    print(f"cold start from a read-only task root: {report['init_s']:.2f} s")


READ_ONLY_HARNESS = """
import importlib, importlib.util, json, os, sys, time
started = time.perf_counter()
module_name, _, function = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module_name), function)
init_s = time.perf_counter() - started
answer = handler(json.load(open(sys.argv[2]))[0], None)
root = sys.argv[3]
without_pyc = sorted(
    name for name, module in list(sys.modules.items())
    if (getattr(module, "__file__", None) or "").startswith(root) and module.__file__.endswith(".py")
    and not os.path.exists(importlib.util.cache_from_source(module.__file__))
)
try:
    open(os.path.join(root, "probe"), "w").close()
    written = True
except OSError:
    written = False
print(json.dumps({"status": answer["statusCode"], "data": answer["body"]["data"], "init_s": init_s,
                  "without_pyc": without_pyc, "written": written}))
"""


def test_the_image_holds_no_torch_and_names_its_handler(built: Path) -> None:
    dockerfile = (built / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM public.ecr.aws/lambda/python:3.12" in dockerfile
    assert 'CMD ["infinity_cloud.targets.aws_lambda.handler.handler"]' in dockerfile
    pins = {re.split(r"[=\[]", line)[0] for line in (built / "requirements.txt").read_text().splitlines()}
    assert {"onnxruntime", "mangum", "fastapi", "pillow", "soundfile"} <= pins
    assert not pins & {"torch", "transformers", "onnx", "openvino"}
    for line in dockerfile.splitlines():  # the build context is complete
        if line.startswith("COPY "):
            assert (built / line.split()[1]).exists(), line
    served = yaml.safe_load((built / "infinity-cloud.yaml").read_text())
    model = served["models"][0]
    assert model["model_id"].startswith("models/") and model["backend"] == "onnx"
    assert model["dtype"] == "float32" and model["backend_options"]["threads"] == 2  # 3,538 MB: 2 vCPUs
    assert served["server"]["limits"]["max_payload_bytes"] == 6 * 1024 * 1024
    # Answers that could pass Lambda's 6 MB are refused before any work (test_http_errors).
    assert served["server"]["limits"]["max_response_bytes"] == int(6 * 1024 * 1024 * 0.95)
    assert served["server"]["limits"]["memory_budget_mb"] == int(3538 * 0.9)  # the function's memory


def sam_template(folder: Path) -> dict[str, Any]:
    """The rendered template as YAML, CloudFormation's short tags (!GetAtt) kept as {tag: value}."""
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, tag, node: {tag: loader.construct_scalar(node)})
    return yaml.load((folder / "template.yaml").read_text(), Loader=Loader)


def test_the_sam_template_declares_the_function_and_its_url(built: Path) -> None:
    template = sam_template(built)
    assert template["Transform"] == "AWS::Serverless-2016-10-31"
    function = template["Resources"]["Function"]
    assert function["Type"] == "AWS::Serverless::Function"
    properties = function["Properties"]
    assert (properties["PackageType"], properties["MemorySize"], properties["Architectures"]) == (
        "Image", 3538, ["x86_64"])
    assert properties["FunctionUrlConfig"]["AuthType"] == "AWS_IAM"
    assert function["Metadata"]["Dockerfile"] == "Dockerfile"
    assert template["Outputs"]["FunctionUrl"]["Value"] == {"GetAtt": "FunctionUrl.FunctionUrl"}
    assert "AutoPublishAlias" not in properties  # no provisioned concurrency asked for


def sam_properties(folder: Path) -> dict[str, Any]:
    return sam_template(folder)["Resources"]["Function"]["Properties"]


def test_the_sam_template_follows_the_spec(tmp_path: Path, tiny_embedder: Path) -> None:
    """Provisioned concurrency on an auto-published alias; the URL's auth, or no URL."""
    base = ["build", "aws-lambda", "--model-id", str(tiny_embedder)]
    result = runner.invoke(cli, [*base, "--out", str(tmp_path / "a"), "--provisioned-concurrency", "3",
                                 "--auth", "NONE"])
    assert result.exit_code == 0, result.output
    properties = sam_properties(tmp_path / "a")
    assert properties["AutoPublishAlias"] == "live"
    assert properties["ProvisionedConcurrencyConfig"] == {"ProvisionedConcurrentExecutions": 3}
    assert properties["FunctionUrlConfig"]["AuthType"] == "NONE"
    result = runner.invoke(cli, [*base, "--out", str(tmp_path / "b"), "--no-function-url"])
    assert result.exit_code == 0, result.output
    assert "FunctionUrlConfig" not in sam_properties(tmp_path / "b")
    assert "Outputs" not in (tmp_path / "b" / "template.yaml").read_text()


@pytest.mark.parametrize(("flags", "message"), [
    (["--backend", "torch"], "serves without torch"),
    (["--api-key", "k"], "INFINITY_CLOUD_ENDPOINT_KEYS"),
    (["--memory", "64"], "greater than or equal to 128"),
])
def test_what_lambda_cannot_serve_is_refused(tmp_path: Path, flags: list[str], message: str) -> None:
    result = runner.invoke(cli, ["build", "aws-lambda", "--out", str(tmp_path / "o"), *flags])
    assert result.exit_code == 2 and message in result.output, result.output


def test_the_example_spec_builds(tmp_path: Path, minilm_dir: Path) -> None:
    from conftest import ROOT

    data = yaml.safe_load((ROOT / "examples/aws_lambda/infinity-cloud.yaml").read_text())
    data["models"][0]["model_id"] = str(minilm_dir)  # the hub's copy is out of reach here
    config = tmp_path / "infinity-cloud.yaml"
    config.write_text(yaml.safe_dump(data))
    args = ["build", "aws-lambda", "--config", str(config), "--out", str(tmp_path / "o")]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "FunctionName: minilm-embedder" in (tmp_path / "o" / "template.yaml").read_text()
