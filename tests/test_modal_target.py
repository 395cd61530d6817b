"""The Modal target, offline, against the real `modal` client: the rendered app imports and
its functions report the spec's settings; its class runs here (`.local()`) with the enter
hook loading the engine, and its ASGI app answers over HTTP; bad settings and missing
credentials are refused before anything is deployed. Only `App.deploy` is faked."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import httpx
import modal
import numpy as np
import pytest
from conftest import cosines
from sentence_transformers import CrossEncoder, SentenceTransformer
from typer.testing import CliRunner

from infinity_cloud.backends import exports
from infinity_cloud.cli import app as cli
from targets.modal.entry import ENDPOINT_KEYS_ENV, bake_models, container_spec
from targets.modal.target import CLIENT_KEY_ENV, load_app_module, usage_examples

runner = CliRunner()
TEXTS = ["a cold start should download nothing", "modal keeps the weights in the image", "short"]
NO_MODAL_TOKEN = {"MODAL_TOKEN_ID": None, "MODAL_TOKEN_SECRET": None}
A_MODAL_TOKEN = {"MODAL_TOKEN_ID": "ak-test", "MODAL_TOKEN_SECRET": "as-test"}
GPU_APP = shlex.split(
    "--gpu l4 --gpu A100-80GB:2 --min-containers 1 --max-containers 3 --scaledown-window 120 "
    "--timeout 90 --startup-timeout 700 --memory-snapshot --secret hf-token --api-key-secret api-keys "
    "--app-name rag-embed --served-model-name embedder --served-model-name reranker"
)


@pytest.fixture(autouse=True)
def no_modal_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """No token from this machine's environment or ~/.modal.toml reaches a test."""
    for name in NO_MODAL_TOKEN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(modal.config, "_user_config", {})


def must_not_deploy(self: Any, **_: Any) -> Any:
    raise AssertionError("app.deploy() was called")


def build(out: Path, *args: str) -> tuple[Any, str]:
    """`infinity-cloud build modal`, then import the app with the real client."""
    result = runner.invoke(cli, ["build", "modal", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return load_app_module(out / "modal_app.py"), (out / "modal_app.py").read_text()


@pytest.fixture(scope="module")
def gpu_app(tmp_path_factory: pytest.TempPathFactory, tiny_embedder: Path, tiny_reranker: Path) -> Any:
    out = tmp_path_factory.mktemp("modal-gpu")
    return build(out, "--model-id", str(tiny_embedder), "--model-id", str(tiny_reranker), *GPU_APP)


# -- what the rendered app declares ------------------------------------------------------


def test_info_reports_the_spec_gpu_timeouts_and_concurrency(gpu_app: tuple[Any, str]) -> None:
    module, _ = gpu_app
    info = module.Server().serve.info()
    assert info.gpus == [("L4", 1), ("A100-80GB", 2)]  # the fallback list, in order
    assert info.timeout == 90 and info.startup_timeout == 700
    # Sized from the batcher: two 64-input batches per container, eight to queue.
    assert (info.concurrency_info.max_inputs, info.concurrency_info.target_inputs) == (512, 128)
    assert info.secrets == ["modal.Secret.from_name('hf-token')", "modal.Secret.from_name('api-keys')"]
    assert info.method_details["serve"].unauthenticated  # a public web endpoint; our keys guard it
    assert module.app.name == "rag-embed"


def test_modal_ships_the_app_file_rather_than_pickling_it(gpu_app: tuple[Any, str]) -> None:
    """As with `modal deploy modal_app.py`: the container imports the file by its name."""
    from modal._utils.function_utils import FunctionSourceInfo

    module, _ = gpu_app
    source = FunctionSourceInfo(module.bake_models)
    assert not source.is_serialized() and source.module_name == "modal_app"
    assert list(source.get_entrypoint_mount()) == ["modal_app"]


def test_settings_modal_cannot_report_offline_are_in_the_source(gpu_app: tuple[Any, str]) -> None:
    _, source = gpu_app
    for setting in ("min_containers=1", "max_containers=3", "scaledown_window=120"):
        assert setting in source
    assert "MEMORY_SNAPSHOT = True" in source and "@modal.enter(snap=MEMORY_SNAPSHOT)" in source
    assert '"enable_gpu_snapshot": True' in source  # CUDA during the snapshot needs it
    # The weights are fetched by a build step on one GPU of the first type, then the hub is
    # cut off; the build gets the HF secret, not the endpoint's keys.
    assert "image.run_function(bake_models, secrets=SECRETS, gpu='L4')" in source
    assert 'for name in ["hf-token"]]' in source and 'for name in ["hf-token", "api-keys"]]' in source
    assert '"HF_HUB_OFFLINE": "1"' in source
    # Every dependency is pinned; the package comes from this source tree.
    installs = re.findall(r"\.pip_install\((.*?)\)\n", source, flags=re.S)
    requirements = [r for block in installs for r in re.findall(r'"([^"]+)"', block)]
    assert len(requirements) > 10 and all("==" in r for r in requirements), requirements
    assert any(r.startswith("transformers==") for r in requirements)
    assert 'add_local_python_source("infinity_cloud", "targets", copy=True)' in source


def test_the_spec_file_beside_the_app_renders_the_same_app(gpu_app: tuple[Any, str], tmp_path: Path) -> None:
    module, source = gpu_app
    _, again = build(tmp_path, "--config", str(Path(module.__file__).with_name("infinity-cloud.yaml")))
    assert again == source


def test_the_example_spec_renders_two_models_in_one_app(tmp_path: Path) -> None:
    from conftest import ROOT

    module, _ = build(tmp_path, "--config", str(ROOT / "examples/modal/infinity-cloud.yaml"))
    assert [m["served_model_name"] for m in module.SPEC["models"]] == ["bge-m3", "reranker"]
    assert module.Server().serve.info().gpus == [("L4", 1), ("A10G", 1)]


def test_the_container_sees_local_folders_at_their_image_copies(gpu_app: Any, tiny_embedder: Path) -> None:
    module, _ = gpu_app
    spec = container_spec(module.SPEC, module.MODEL_DIRS)
    assert spec.models[0].model_id == module.MODEL_DIRS[str(tiny_embedder)]
    assert spec.models[0].model_id.startswith("/models/local/")
    assert spec.models[0].name == "embedder"
    assert "modal" not in module.SPEC  # the container's copy holds what it serves, not how


def test_a_local_folder_model_keeps_its_name_for_clients(tmp_path: Path, tiny_embedder: Path) -> None:
    module, _ = build(tmp_path, "--model-id", str(tiny_embedder))
    assert container_spec(module.SPEC, module.MODEL_DIRS).models[0].name == str(tiny_embedder)


def test_cpu_variant_has_no_gpu_and_installs_cpu_torch(tmp_path: Path, tiny_embedder: Path) -> None:
    module, source = build(tmp_path, "--model-id", str(tiny_embedder), "--cpu", "2", "--memory", "2048")
    info = module.Server().serve.info()
    assert info.gpus == [] and info.cpu == 2 and info.memory_mib == 2048
    # OpenVINO serves CPU containers, in batches of 16.
    assert (info.concurrency_info.max_inputs, info.concurrency_info.target_inputs) == (128, 32)
    assert "download.pytorch.org/whl/cpu" in source and '"openvino==' in source
    assert "enable_gpu_snapshot" not in source and "MEMORY_SNAPSHOT = False" in source


@pytest.mark.parametrize(("backend", "package"), [("onnx", "onnxruntime"), ("ctranslate2", "ctranslate2")])
def test_the_image_installs_each_models_backend(tmp_path: Path, tiny_embedder: Path, backend, package):
    _, source = build(tmp_path, "--model-id", str(tiny_embedder), "--backend", backend)
    assert f'"{package}==' in source and '"torch==' in source  # torch makes the export at build


def test_one_concurrency_bound_given_bounds_the_others_default(tmp_path: Path, tiny_embedder: Path) -> None:
    module, _ = build(tmp_path, "--model-id", str(tiny_embedder), "--gpu", "T4", "--max-inputs", "5")
    info = module.Server().serve.info().concurrency_info
    assert (info.max_inputs, info.target_inputs) == (5, 5)
    module, _ = build(tmp_path, "--model-id", str(tiny_embedder), "--gpu", "T4", "--target-inputs", "1000")
    info = module.Server().serve.info().concurrency_info
    assert (info.max_inputs, info.target_inputs) == (1000, 1000)


# -- the class, run here as Modal runs it in a container ---------------------------------


@pytest.fixture(scope="module")
def local_server(gpu_app: tuple[Any, str]) -> Any:
    """`@enter`, then `@asgi_app`, with the keys a Modal secret would set."""
    module, _ = gpu_app
    server = module.Server()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENDPOINT_KEYS_ENV, "key-one key-two")
        asgi = server.serve.local()
    yield server, asgi
    server.engine.close()


async def test_local_asgi_app_serves_embeddings_rerank_and_health(
    local_server: Any, tiny_embedder: Path, tiny_reranker: Path
) -> None:
    server, asgi = local_server
    assert all(m.state == "ready" for m in server.engine.models.values())  # @enter ran
    auth = {"Authorization": "Bearer key-two"}
    embed = {"model": "embedder", "input": TEXTS}
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://modal") as client:
        health = await client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert (await client.post("/embeddings", json=embed)).status_code == 401
        embedded = await client.post("/embeddings", json=embed, headers=auth)
        assert embedded.status_code == 200, embedded.text
        ours = np.array([d["embedding"] for d in embedded.json()["data"]])
        st = SentenceTransformer(str(tiny_embedder), device="cpu")
        reference = st.encode(TEXTS, normalize_embeddings=True)
        assert cosines(ours, reference).min() > 0.999

        body = {"model": "reranker", "query": "cold start", "documents": TEXTS, "return_documents": True}
        ranked = await client.post("/rerank", json=body, headers=auth)
        assert ranked.status_code == 200, ranked.text
        scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
        expected = CrossEncoder(str(tiny_reranker), device="cpu").predict([("cold start", t) for t in TEXTS])
        np.testing.assert_allclose([scores[i] for i in range(len(TEXTS))], expected, atol=2e-3)

        models = await client.get("/models", headers=auth)
        assert [m["id"] for m in models.json()["data"]] == ["embedder", "reranker"]


def test_the_image_build_step_fetches_and_exports_each_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_embedder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `bake_models` runs in the image build, here against this machine's CPU."""
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path / "exports"))
    module, _ = build(tmp_path / "app", "--model-id", str(tiny_embedder), "--backend", "onnx")
    bake_models(container_spec(module.SPEC, {}))
    assert "ready for onnx" in capsys.readouterr().out
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "exports").iterdir()) == ["onnx", "onnxruntime"]


# -- refusals, credentials and the deploy call -------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "H1000"], "unknown GPU 'H1000'"),
        (["--gpu", "A10G:5"], "must be 1 to 4"),
        (["--min-containers", "3", "--max-containers", "2"], "min_containers (3) exceeds max_containers (2)"),
        (["--scaledown-window", "1"], "scaledown_window"),
        (["--scaledown-window", "3601"], "less than or equal to 3600"),
        (["--target-inputs", "10", "--max-inputs", "5"], "target_inputs (10) exceeds max_inputs (5)"),
        (["--gpu", "L4", "--backend", "onnx"], "packaged for Modal's CPU containers only"),
        (["--model-id", "./no-such-model"], "model folder ./no-such-model does not exist"),
        (["--secret", "bad name!"], "is not a Modal name"),
        (["--api-key", "plain"], "--api-key-secret"),
    ],
)
@pytest.mark.parametrize("command", ["build", "deploy"])
def test_invalid_settings_are_refused_before_anything_happens(
    command: str, args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(modal.App, "deploy", must_not_deploy)
    out = tmp_path / "out"
    result = runner.invoke(cli, [command, "modal", "--out", str(out), *args], env=A_MODAL_TOKEN)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()


def test_the_clis_own_api_key_variable_is_refused_too(tmp_path: Path) -> None:
    """INFINITY_CLOUD_API_KEY feeds --api-key; the endpoint's keys come from a Modal secret."""
    args = ["build", "modal", "--out", str(tmp_path)]
    result = runner.invoke(cli, args, env={"INFINITY_CLOUD_API_KEY": "client-side"})
    assert result.exit_code == 2 and ENDPOINT_KEYS_ENV in result.output


def test_deploy_without_credentials_says_how_to_log_in(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(modal.App, "deploy", must_not_deploy)
    result = runner.invoke(cli, ["deploy", "modal", "--out", str(tmp_path / "out")], env=NO_MODAL_TOKEN)
    assert result.exit_code != 0
    assert "modal token new" in result.output and "MODAL_TOKEN_ID" in result.output
    assert not (tmp_path / "out").exists()
    for command in (["status", "modal"], ["delete", "modal", "--yes"]):
        result = runner.invoke(cli, command, env=NO_MODAL_TOKEN)
        assert result.exit_code != 0 and "modal token new" in result.output


def test_dry_run_renders_and_loads_without_credentials(tmp_path: Path, monkeypatch, tiny_embedder) -> None:
    monkeypatch.setattr(modal.App, "deploy", must_not_deploy)
    out = tmp_path / "out"
    args = ["deploy", "modal", "--dry-run", "--out", str(out), "--model-id", str(tiny_embedder)]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "nothing deployed" in result.output and (out / "modal_app.py").is_file()


def test_deploy_calls_app_deploy_with_output_enabled(tmp_path: Path, monkeypatch, tiny_embedder) -> None:
    calls: list[dict[str, Any]] = []

    def fake_deploy(self: Any, **kwargs: Any) -> Any:
        calls.append({**kwargs, "app": self.name, "output": modal.output.OutputManager.get().is_enabled})
        return self

    monkeypatch.setattr(modal.App, "deploy", fake_deploy)
    args = shlex.split(f"deploy modal --out {tmp_path} --model-id {tiny_embedder} --gpu H100")
    args += ["--app-name", "my-embedder", "--environment", "staging"]
    result = runner.invoke(cli, args, env=A_MODAL_TOKEN)
    assert result.exit_code == 0, result.output
    expected = {"name": "my-embedder", "environment_name": "staging", "app": "my-embedder", "output": True}
    assert calls == [expected]
    assert "deployed Modal app 'my-embedder'" in result.output
    assert "infinity-cloud status modal" in result.output  # the fake hydrates nothing, so no URL


def test_usage_examples_name_the_endpoint_prefix_model_and_key() -> None:
    url = "https://ws--app-server-serve.modal.run"
    text = usage_examples(url, "BAAI/bge-m3", url_prefix="/api", api_key=True)
    assert f"curl {url}/api/embeddings" in text and f'OpenAI(base_url="{url}/api"' in text
    assert f"Bearer ${CLIENT_KEY_ENV}" in text and '"model": "BAAI/bge-m3"' in text
    assert CLIENT_KEY_ENV not in usage_examples(url, "m")
