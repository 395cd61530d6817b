"""The SageMaker container: `build sagemaker` renders a complete build context per variant,
and its `serve` entrypoint, run as a real process on SAGEMAKER_BIND_TO_PORT, keeps the
bring-your-own-container contract: /ping at once (503 while loading, 200 once loaded),
/invocations routed by custom attribute or body with the same answers as the local server,
SageMaker's payload limits as 413, and SIGTERM letting in-flight requests finish."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from conftest import FAKE, ROOT, free_port, serve_in_process, spec_of
from typer.testing import CliRunner

from infinity_cloud.backends.cuda_check import CudaFacts, cuda_problem
from infinity_cloud.cli import app as cli
from infinity_cloud.core.config import ModelSpec, load_spec
from infinity_cloud.targets.base import IMAGE_DEVICE_ENV
from infinity_cloud.targets.sagemaker.serve import with_model_data
from infinity_cloud.targets.sagemaker.spec import REALTIME_PAYLOAD_BYTES, SERVERLESS_PAYLOAD_BYTES

runner = CliRunner()
# uvicorn drains, then re-raises the signal it caught, so the process ends as SIGTERM asks.
STOPPED_BY_SIGTERM = (0, -signal.SIGTERM)
TEXTS = ["what is a panda?", "a bear from China", "x"]


def build(out: Path, *args: str) -> str:
    result = runner.invoke(cli, ["build", "sagemaker", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return (out / "Dockerfile").read_text()


def stages(dockerfile: str) -> list[str]:
    return re.split(r"^FROM ", dockerfile, flags=re.M)[1:]


def assert_context_is_complete(out: Path, dockerfile: str) -> None:
    """Every COPY source is in the build context (a stage's own files aside)."""
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            source = line.split()[1]
            assert (out / source).exists(), f"{source} is missing from {out}"


# -- the rendered build context ------------------------------------------------------------


def test_gpu_image_carries_cuda_torch_and_serves_in_exec_form(tmp_path: Path, tiny_embedder: Path) -> None:
    dockerfile = build(tmp_path, "--model-id", str(tiny_embedder), "--instance-type", "ml.g5.xlarge")
    assert len(stages(dockerfile)) == 1
    # PyPI's CUDA 13 build, which the 580 driver of the endpoint's machine image runs.
    cuda = r'^RUN pip install --no-cache-dir "torch==[\d.]+"$'
    assert re.search(cuda, dockerfile, re.M)
    assert "download.pytorch.org" not in dockerfile
    assert f"{IMAGE_DEVICE_ENV}=cuda" in dockerfile  # it refuses to serve on the CPU
    assert dockerfile.rstrip().endswith('ENTRYPOINT ["serve"]') and "EXPOSE 8080" in dockerfile
    assert os.access(tmp_path / "serve", os.X_OK)
    assert "exec python -m infinity_cloud.targets.sagemaker.serve" in (tmp_path / "serve").read_text()
    served = yaml.safe_load((tmp_path / "infinity-cloud.yaml").read_text())
    assert served["models"][0]["model_id"].startswith("/models/local/")  # baked into the image
    assert served["server"]["limits"]["max_payload_bytes"] == REALTIME_PAYLOAD_BYTES
    assert "sagemaker" not in served  # what it serves, not how it is deployed
    assert_context_is_complete(tmp_path, dockerfile)


@pytest.mark.parametrize(("flags", "limit"), [
    (["--instance-type", "ml.c7i.xlarge"], REALTIME_PAYLOAD_BYTES),
    (["--serverless"], SERVERLESS_PAYLOAD_BYTES),
])
def test_cpu_and_serverless_images_run_without_torch(
    tmp_path: Path, tiny_embedder: Path, flags: list[str], limit: int
) -> None:
    dockerfile = build(tmp_path, "--model-id", str(tiny_embedder), *flags)
    convert, run = stages(dockerfile)
    assert " AS convert" in convert.splitlines()[0] and "python -m infinity_cloud download" in convert
    assert "torch" in convert and "--index-url https://download.pytorch.org/whl/cpu" in convert
    assert IMAGE_DEVICE_ENV not in dockerfile
    # The run stage installs only the serving requirements and takes the exports over.
    assert "torch" not in run.replace("no torch", "")
    assert "COPY --from=convert /opt/exports /opt/exports" in run and 'ENTRYPOINT ["serve"]' in run
    serving = (tmp_path / "requirements-serving.txt").read_text().splitlines()
    names = {line.split("==")[0] for line in serving}
    assert "openvino" in names and not names & {"torch", "transformers", "onnx", "onnxruntime"}
    assert {"pillow", "httpx", "soundfile", "soxr"} <= names  # image and audio models serve too
    assert all("==" in line for line in serving)
    served = yaml.safe_load((tmp_path / "infinity-cloud.yaml").read_text())
    assert served["server"]["limits"]["max_payload_bytes"] == limit
    # Serverless: the endpoint's memory setting; an instance: its container's limit, read at run time.
    budget = served["server"]["limits"].get("memory_budget_mb")
    assert budget == (int(6144 * 0.9) if "--serverless" in flags else None)
    assert_context_is_complete(tmp_path, dockerfile)


def test_hub_models_are_fetched_before_the_package_is_copied(tmp_path: Path) -> None:
    dockerfile = build(tmp_path, "--model-id", "BAAI/bge-small-en-v1.5", "--instance-type", "ml.g6.xlarge")
    assert dockerfile.index("snapshot_download") < dockerfile.index("COPY infinity_cloud")
    assert '"BAAI/bge-small-en-v1.5"' in dockerfile


@pytest.mark.parametrize(("flags", "message"), [
    (["--instance-type", "ml.inf2.xlarge"], "give --batch-buckets and --length-buckets"),
    (["--instance-type", "ml.inf2.xlarge", "--backend", "onnx", "--batch-buckets", "1",
      "--length-buckets", "8"], "packaged for cpu containers only"),
    (["--instance-type", "g5.xlarge"], "is not a SageMaker instance type"),
    (["--instance-type", "ml.p3.2xlarge"], "V100 (Volta) GPUs run no CUDA 13 build of torch"),
    (["--serverless", "--backend", "torch"], "serves without torch"),
    (["--instance-type", "ml.g5.xlarge", "--backend", "openvino"], "packaged for cpu containers only"),
    (["--api-key", "s3cret"], "grant sagemaker:InvokeEndpoint"),
])
def test_what_cannot_be_built_is_refused_before_anything_is_written(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    out = tmp_path / "out"
    result = runner.invoke(cli, ["build", "sagemaker", "--out", str(out), *flags])
    assert result.exit_code == 2, result.output
    assert message in result.output and not out.exists()


def test_model_data_in_opt_ml_model_replaces_the_baked_models(tmp_path: Path, tiny_embedder: Path) -> None:
    spec = load_spec(None, model_id=["BAAI/bge-m3", "BAAI/bge-reranker-v2-m3"])
    assert with_model_data(spec, tmp_path / "absent") == spec
    (tmp_path / "BAAI--bge-reranker-v2-m3").symlink_to(tiny_embedder)
    mapped = with_model_data(spec, tmp_path)
    assert mapped.models[0].model_id == "BAAI/bge-m3"  # not in the model data: baked
    assert mapped.models[1].model_id == str(tmp_path / "BAAI--bge-reranker-v2-m3")
    assert mapped.models[1].name == "BAAI/bge-reranker-v2-m3"
    single = with_model_data(load_spec(None, model_id=["my/model"]), tiny_embedder)
    assert single.models[0].model_id == str(tiny_embedder) and single.models[0].name == "my/model"


# -- the entrypoint as SageMaker runs it -----------------------------------------------------


class Serve:
    """`python -m infinity_cloud.targets.sagemaker.serve serve`, as the image's `serve` runs it."""

    def __init__(self, config: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = config.with_suffix(".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infinity_cloud.targets.sagemaker.serve", "serve"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "INFINITY_CLOUD_CONFIG": str(config), "SAGEMAKER_BIND_TO_PORT": str(self.port),
                 "SM_MODEL_DIR": str(config.parent / "no-model-data"), **(env or {})},
        )

    def ping(self) -> httpx.Response:
        return httpx.get(f"{self.url}/ping", timeout=2)  # SageMaker's own deadline

    def wait_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                self.ping()
                return
            except httpx.TransportError:
                assert time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.05)

    def wait_ready(self, timeout: float = 60) -> None:
        self.wait_listening(timeout)  # a test may come first, before anyone saw it listen
        deadline = time.monotonic() + timeout
        while self.ping().status_code != 200:
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)


def write_config(folder: Path, models: list[dict[str, Any]], payload: int = REALTIME_PAYLOAD_BYTES) -> Path:
    config = folder / "infinity-cloud.yaml"
    spec = {"models": models, "server": {"log_level": "warning", "limits": {"max_payload_bytes": payload}}}
    config.write_text(yaml.safe_dump(spec))
    return config


def fake_model(path: Path, name: str, **options: Any) -> dict[str, Any]:
    return {"model_id": str(path), "served_model_name": name, "backend": FAKE, "warmup": False,
            "backend_options": options}


@pytest.fixture(scope="module")
def three_models(tiny_embedder: Path, tiny_reranker: Path, tiny_classifier: Path) -> list[dict[str, Any]]:
    folders = {"emb": tiny_embedder, "rr": tiny_reranker, "cl": tiny_classifier}
    return [fake_model(path, name) for name, path in folders.items()]


@pytest.fixture(scope="module")
def container(
    tmp_path_factory: pytest.TempPathFactory, three_models: list[dict[str, Any]]
) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("sagemaker")
    # The embedder loads slowly, so /ping can be seen answering 503 first.
    models = [{**three_models[0], "backend_options": {"load_delay_s": 1.5}}, *three_models[1:]]
    serve = Serve(write_config(folder, models))
    try:
        yield serve
    finally:
        serve.stop()


def test_ping_answers_at_once_then_200_once_loaded(container: Serve) -> None:
    container.wait_listening()
    started = time.monotonic()
    first = container.ping()
    assert time.monotonic() - started < 2
    assert first.status_code in (200, 503)
    if first.status_code == 503:  # still loading: said, with when to ask again
        assert "Retry-After" in first.headers
    container.wait_ready()
    assert container.ping().json()["status"] == "ok"


BODIES = {
    "embeddings": {"input": TEXTS, "model": "emb"},
    "rerank": {"query": "panda", "documents": TEXTS, "model": "rr"},
    "classify": {"input": TEXTS, "model": "cl"},
}


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("by", ["attribute", "body"])
async def test_invocations_answer_as_the_local_server_does(
    container: Serve, three_models: list[dict[str, Any]], route: str, by: str
) -> None:
    container.wait_ready()
    headers = {"X-Amzn-SageMaker-Custom-Attributes": f"route={route}"} if by == "attribute" else {}
    answer = httpx.post(f"{container.url}/invocations", json=BODIES[route], headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    spec = spec_of(*(ModelSpec(**m) for m in three_models))
    async with serve_in_process(spec) as local:
        path = {"embeddings": "/embeddings", "rerank": "/rerank", "classify": "/classify"}[route]
        expected = (await local.post(path, json=BODIES[route])).json()
    ignore = {"id", "created"}
    assert {k: v for k, v in answer.json().items() if k not in ignore} == {
        k: v for k, v in expected.items() if k not in ignore
    }


def test_batch_transform_asks_the_container_for_its_settings(container: Serve) -> None:
    """The Batch Transform agent's GET /execution-parameters (AWS: "How Containers Serve
    Requests" for batch transform, docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-batch-code.html):
    the three settings, in their documented names and ranges."""
    container.wait_ready()
    answer = httpx.get(f"{container.url}/execution-parameters", timeout=30)
    assert answer.status_code == 200, answer.text
    settings = answer.json()
    assert set(settings) == {"MaxConcurrentTransforms", "BatchStrategy", "MaxPayloadInMB"}
    assert settings["BatchStrategy"] in ("MULTI_RECORD", "SINGLE_RECORD")
    assert isinstance(settings["MaxConcurrentTransforms"], int) and settings["MaxConcurrentTransforms"] >= 1
    assert isinstance(settings["MaxPayloadInMB"], int) and 1 <= settings["MaxPayloadInMB"] <= 100
    assert settings["MaxPayloadInMB"] * 2**20 <= REALTIME_PAYLOAD_BYTES  # within what the server takes


async def test_batch_transform_mini_batches_are_answered_line_for_line(
    container: Serve, three_models: list[dict[str, Any]]
) -> None:
    """What the agent sends with SplitType=Line and BatchStrategy=MultiRecord: several input
    lines in one POST /invocations with the job's ContentType, the last ending in a newline;
    the answer must have one line per input line, in order (AssembleWith=Line, and a join
    with the input), so a bad record answers an error line and the others their vectors."""
    container.wait_ready()
    records = [json.dumps({"text": "first passage"}), json.dumps("second, a bare string"), "{not json",
               json.dumps({"id": 7}), json.dumps({"text": ""}), json.dumps({"input": "last one"})]
    body = "\n".join(records) + "\n"
    answer = httpx.post(f"{container.url}/invocations", content=body,
                        headers={"Content-Type": "application/jsonlines"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/jsonlines")
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert len(lines) == len(records)
    assert "not JSON" in lines[2]["error"] and "no text" in lines[3]["error"] and "empty" in lines[4]["error"]
    spec = spec_of(*(ModelSpec(**m) for m in three_models))
    async with serve_in_process(spec) as local:
        texts = ["first passage", "second, a bare string", "last one"]
        expected = (await local.post("/embeddings", json={"model": "emb", "input": texts})).json()["data"]
    got = [lines[i]["embedding"] for i in (0, 1, 5)]
    np.testing.assert_allclose(np.array(got), np.array([d["embedding"] for d in expected]), rtol=1e-6)


def hundred_byte_records(payload_bytes: int) -> list[str]:
    """As many distinct 100-byte JSON Lines records (newline included) as fill `payload_bytes`."""
    records = []
    for i in range(payload_bytes // 100):
        head = json.dumps({"text": f"record {i} "})
        records.append(head[:-2] + "x" * (99 - len(head)) + head[-2:])
    assert {len(r) for r in records} == {99}
    return records


async def test_a_full_mini_batch_of_small_records_is_answered_line_for_line_in_order(
    container: Serve, three_models: list[dict[str, Any]]
) -> None:
    """What the agent sends for a corpus of short records: the MaxPayloadInMB the container
    asked for (6 MB, SageMaker's default) filled with 100-byte records, 62,914 of them, far
    over the per-request input limit (2,048): one answer line each, in order."""
    container.wait_ready()
    payload_mb = httpx.get(f"{container.url}/execution-parameters", timeout=30).json()["MaxPayloadInMB"]
    assert payload_mb == 6
    records = hundred_byte_records(payload_mb * 2**20)
    bad = 50_000  # in the 25th engine batch: its error names its line in the whole mini-batch
    records[bad] = "{not json" + " " * 90
    body = "\n".join(records) + "\n"
    assert len(body) <= payload_mb * 2**20 and len(records) > 30 * 2048
    answer = httpx.post(f"{container.url}/invocations", content=body,
                        headers={"Content-Type": "application/jsonlines"}, timeout=600)
    assert answer.status_code == 200, answer.text[:500]
    lines = answer.text.splitlines()
    assert len(lines) == len(records)
    sample = [0, 2047, 2048, 2049, len(records) // 2, len(records) - 1]  # across engine batches
    spec = spec_of(*(ModelSpec(**m) for m in three_models))
    async with serve_in_process(spec) as local:
        texts = [json.loads(records[i])["text"] for i in sample]
        expected = (await local.post("/embeddings", json={"model": "emb", "input": texts})).json()["data"]
    got = [json.loads(lines[i])["embedding"] for i in sample]
    np.testing.assert_allclose(np.array(got), np.array([d["embedding"] for d in expected]), rtol=1e-6)
    assert f"line {bad + 1} is not JSON" in json.loads(lines[bad])["error"]
    assert all(line.startswith('{"embedding":[') for i, line in enumerate(lines) if i != bad)


def test_a_mini_batch_whose_later_engine_batch_fails_is_cut_off_not_answered_short(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    """Records go to the engine 128 at a time (the per-request limit, set to its least here). A
    fault in the first batch is the request's status (500); one in a later batch, once the 200
    is sent, cuts the answer off: the agent sees a failed invocation (and retries it), never a
    200 with fewer lines than records."""
    from tokenizers import Tokenizer

    marker = Tokenizer.from_file(str(tiny_embedder / "tokenizer.json")).token_to_id("paris")
    config = tmp_path / "infinity-cloud.yaml"
    config.write_text(yaml.safe_dump({
        "models": [fake_model(tiny_embedder, "emb", fail_token_id=marker)],
        "server": {"log_level": "warning", "limits": {"max_inputs_per_request": 128}},
    }))
    serve = Serve(config)
    try:
        serve.wait_ready()
        texts = [f"record {i}" for i in range(400)]
        headers = {"Content-Type": "application/jsonlines"}

        def post(fault_at: int) -> httpx.Response:
            records = [json.dumps({"text": "paris" if i == fault_at else t}) for i, t in enumerate(texts)]
            return httpx.post(f"{serve.url}/invocations", content="\n".join(records) + "\n",
                              headers=headers, timeout=120)

        whole = post(-1)
        assert whole.status_code == 200 and len(whole.text.splitlines()) == len(texts)
        first = post(5)
        assert first.status_code == 500 and "injected fault" in first.json()["error"]["message"]
        with pytest.raises(httpx.RemoteProtocolError):
            post(300)  # the third batch: the answer stops before its lines
        assert post(-1).status_code == 200  # the server goes on
    finally:
        serve.stop()


def test_a_payload_over_sagemakers_limit_is_a_413(container: Serve) -> None:
    container.wait_ready()
    big = {"input": ["x" * 1000] * (REALTIME_PAYLOAD_BYTES // 1000 + 10), "model": "emb"}
    answer = httpx.post(f"{container.url}/invocations", json=big, timeout=30)
    assert answer.status_code == 413
    assert "over the limit of 6291456 bytes" in answer.json()["error"]["message"]


def test_sigterm_lets_in_flight_requests_finish(tmp_path: Path, tiny_embedder: Path) -> None:
    serve = Serve(write_config(tmp_path, [fake_model(tiny_embedder, "emb", delay_s=1.5)]))
    try:
        serve.wait_listening()
        serve.wait_ready()
        answers: dict[str, httpx.Response] = {}
        request = threading.Thread(target=lambda: answers.setdefault("slow", httpx.post(
            f"{serve.url}/invocations", json={"input": ["in flight"]}, timeout=30)))
        request.start()
        time.sleep(0.5)  # the request is in the batch now
        serve.proc.send_signal(signal.SIGTERM)
        request.join(30)
        assert answers["slow"].status_code == 200
        assert len(answers["slow"].json()["data"]) == 1
        assert serve.proc.wait(30) in STOPPED_BY_SIGTERM
    finally:
        serve.stop()


def test_sigterm_while_loading_stops_cleanly(tmp_path: Path, tiny_embedder: Path) -> None:
    serve = Serve(write_config(tmp_path, [fake_model(tiny_embedder, "emb", load_delay_s=2.0)]))
    try:
        serve.wait_listening()
        assert serve.ping().status_code == 503  # loading
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(30) in STOPPED_BY_SIGTERM
    finally:
        serve.stop()


def test_serverless_limit_in_a_container(tmp_path: Path, tiny_embedder: Path) -> None:
    config = write_config(tmp_path, [fake_model(tiny_embedder, "emb")], payload=SERVERLESS_PAYLOAD_BYTES)
    serve = Serve(config)
    try:
        serve.wait_listening()
        serve.wait_ready()
        body = {"input": ["y" * 1000] * (SERVERLESS_PAYLOAD_BYTES // 1000 + 10)}
        assert httpx.post(f"{serve.url}/invocations", json=body, timeout=30).status_code == 413
        fits = {"input": ["y" * 1000] * 100}
        assert httpx.post(f"{serve.url}/invocations", json=fits, timeout=30).status_code == 200
    finally:
        serve.stop()


def test_the_example_spec_builds_a_two_model_gpu_image(tmp_path: Path) -> None:
    dockerfile = build(tmp_path, "--config", str(ROOT / "examples/sagemaker/infinity-cloud.yaml"))
    assert '"BAAI/bge-small-en-v1.5"' in dockerfile and '"cross-encoder/ms-marco-MiniLM-L-6-v2"' in dockerfile
    served = yaml.safe_load((tmp_path / "infinity-cloud.yaml").read_text())
    assert [m["served_model_name"] for m in served["models"]] == ["embedder", "reranker"]
    assert len(stages(dockerfile)) == 1  # ml.g5: the GPU variant


def test_a_broken_spec_stops_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "infinity-cloud.yaml"
    config.write_text("models:\n  - model_id: x\n    batch_tokens: 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "infinity_cloud.targets.sagemaker.serve", "serve"], capture_output=True,
        text=True, timeout=60, cwd=ROOT, env={**os.environ, "INFINITY_CLOUD_CONFIG": str(config)},
    )
    assert done.returncode == 1 and "error: invalid deployment spec" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_gpu_image_without_a_usable_gpu_stops_at_start_saying_why(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    """`device auto` would load the models on the CPU and serve, many times slower, with
    nothing said: a GPU image stops before /ping answers (SageMaker then fails the endpoint
    with this line in its log). This machine has no NVIDIA driver."""
    serve = Serve(write_config(tmp_path, [fake_model(tiny_embedder, "emb")]), env={IMAGE_DEVICE_ENV: "cuda"})
    try:
        code = serve.proc.wait(60)
    finally:
        serve.stop()
    log = serve.log.read_text()
    assert code == 1, log
    assert "error: this is a GPU image, but no NVIDIA driver is visible in this container" in log
    assert "refusing to serve on the CPU" in log and "Traceback" not in log


@pytest.mark.parametrize(("facts", "reason"), [
    # PyPI's torch (CUDA 13) on a 550 driver (al2-ami-sagemaker-inference-gpu-3-1's)
    (CudaFacts("2.13.0", "13.0", False, 12040, "550.90.07", init_error=0, devices=1),
     "the NVIDIA driver 550.90.07 is too old: it runs up to CUDA 12.4, and this image's torch 2.13.0 is "
     "built for CUDA 13.0, which needs driver 580.65.06 or newer"),
    (CudaFacts("2.13.0+cu126", "12.6", False, 12040, "550.90.07", init_error=100),
     "the NVIDIA driver 550.90.07 (CUDA 12.4) sees no CUDA device"),
    (CudaFacts("2.13.0+cpu", None, False, 12040, None),
     "the NVIDIA driver (release unknown) runs CUDA 12.4, but this image's torch is 2.13.0+cpu, a CPU build"),
    # A 12.6 build on a 12.4 driver: minor version compatibility
    (CudaFacts("2.13.0+cu126", "12.6", True, 12040, "550.90.07", devices=1), None),
    # torch sees a V100, but a CUDA 13 build has no Volta kernels: every kernel would fail
    (CudaFacts("2.13.0", "13.0", True, device_capability=(7, 0),
               torch_archs=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")),
     "this GPU's architecture is sm_70, and this image's torch 2.13.0 (CUDA 13.0) has kernels only for "
     "sm_75, sm_80, sm_86, sm_90, sm_100, sm_120"),
    # an L4 (sm_89) runs sm_86's kernels; an H200 (sm_90) runs them natively; a newer GPU, PTX
    (CudaFacts("2.13.0", "13.0", True, device_capability=(8, 9), torch_archs=("sm_80", "sm_86")), None),
    (CudaFacts("2.13.0", "13.0", True, device_capability=(9, 0), torch_archs=("sm_80", "sm_90")), None),
    (CudaFacts("2.13.0", "13.0", True, device_capability=(12, 1), torch_archs=("sm_90", "compute_120")),
     None),
])
def test_why_a_gpu_image_cannot_use_its_gpu(facts: CudaFacts, reason: str | None) -> None:
    assert cuda_problem(facts) == reason


def test_packed_models_travel_in_model_data_and_serve_from_opt_ml_model(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    """--pack-models: one image for any model; SageMaker unpacks model.tar.gz into
    /opt/ml/model, where `serve` finds each model by its served name."""
    import shutil
    import tarfile

    model = shutil.copytree(tiny_embedder, tmp_path / "emb-src")
    (model / ".infinity-cloud" / "onnx-x").mkdir(parents=True)  # a cached export stays behind
    (model / ".infinity-cloud" / "onnx-x" / "model.onnx").write_bytes(b"export")
    out = tmp_path / "build"
    dockerfile = build(out, "--model-id", str(model), "--served-model-name", "org/emb", "--pack-models")
    assert "COPY models" not in dockerfile and "infinity_cloud download" not in dockerfile
    with tarfile.open(out / "model.tar.gz") as tar:
        names = tar.getnames()
        assert "org--emb/config.json" in names and not any(".infinity-cloud" in n for n in names)
        tar.extractall(tmp_path / "opt-ml-model", filter="data")
    serve = Serve(out / "infinity-cloud.yaml", env={"SM_MODEL_DIR": str(tmp_path / "opt-ml-model")})
    try:
        serve.wait_listening(120)
        serve.wait_ready(120)
        answer = httpx.post(f"{serve.url}/invocations", json={"input": TEXTS}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "org/emb" and len(answer.json()["data"]) == len(TEXTS)
    finally:
        serve.stop()


def test_cpu_images_bake_their_models(tmp_path: Path) -> None:
    args = ["build", "sagemaker", "--out", str(tmp_path / "o"), "--serverless", "--pack-models"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 2 and "--pack-models is for GPU images" in result.output


def test_an_inferentia2_image_compiles_its_buckets_at_build(tmp_path: Path) -> None:
    args = ["--instance-type", "ml.inf2.xlarge", "--region", "eu-west-1", "--batch-buckets", "1,8",
            "--length-buckets", "128,512", "--model-id", "BAAI/bge-small-en-v1.5"]
    dockerfile = build(tmp_path, *args)
    (stage,) = stages(dockerfile)
    image = "763104351884.dkr.ecr.eu-west-1.amazonaws.com/huggingface-pytorch-inference-neuronx:"
    assert stage.startswith(image)
    assert "INFINITY_CLOUD_NEURON_COMPILE=1 python -m infinity_cloud download" in dockerfile
    assert 'pip install --no-cache-dir "torch' not in dockerfile  # the Neuron image's own torch
    pins = {line.split("==")[0] for line in (tmp_path / "requirements.txt").read_text().splitlines()}
    assert "fastapi" in pins and not pins & {"torch", "transformers", "numpy", "tokenizers"}
    served = yaml.safe_load((tmp_path / "infinity-cloud.yaml").read_text())["models"][0]
    shapes = (served["batch_buckets"], served["length_buckets"])
    assert served["backend"] == "neuron" and shapes == ([1, 8], [128, 512])
    assert dockerfile.rstrip().endswith('ENTRYPOINT ["serve"]')
    assert_context_is_complete(tmp_path, dockerfile)
