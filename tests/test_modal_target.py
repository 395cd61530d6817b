"""The Modal target, offline, against the real `modal` client: the rendered app (a Modal
Server) imports and reports the spec's settings; its class runs here through Modal's own
lifecycle hooks, serving on a real port; bad settings and missing or rejected credentials
are refused with one clear line. Only `App.deploy` and the calls that need Modal's servers
are faked."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import modal
import numpy as np
import pytest
from conftest import cosines, free_port
from modal._partial_function import _find_callables_for_obj, _PartialFunctionFlags
from sentence_transformers import CrossEncoder, SentenceTransformer
from typer.testing import CliRunner

from infinity_cloud.backends import exports
from infinity_cloud.cli import app as cli
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.targets.base import CLIENT_KEY_ENV, ENDPOINT_KEYS_ENV, IMAGE_DEVICE_ENV, usage_examples
from infinity_cloud.targets.modal.target import ModalTarget, load_app_module
from infinity_cloud.targets.runtime import bake_models, container_spec

runner = CliRunner()
TEXTS = ["a cold start should download nothing", "modal keeps the weights in the image", "short"]
NO_MODAL_TOKEN = {"MODAL_TOKEN_ID": None, "MODAL_TOKEN_SECRET": None}
A_MODAL_TOKEN = {"MODAL_TOKEN_ID": "ak-test", "MODAL_TOKEN_SECRET": "as-test"}
GPU_APP = shlex.split(
    "--gpu l4 --gpu A100-80GB --min-containers 1 --max-containers 3 --scaledown-window 120 "
    "--exit-grace-period 45 --startup-timeout 700 --memory-snapshot --secret hf-token "
    "--api-key-secret api-keys --app-name rag-embed --served-model-name embedder --served-model-name reranker"
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


def test_info_reports_the_server_port_auth_grace_period_and_resources(gpu_app: tuple[Any, str]) -> None:
    module, source = gpu_app
    info = module.Server.info()
    assert info.gpus == [("L4", 1), ("A100-80GB", 1)]  # the fallback list, in order
    assert (info.port, info.exit_grace_period, info.startup_timeout) == (8000, 45, 700)
    assert (info.cpu, info.memory_mib) == (4.0, 8192)  # reserved, not Modal's 0.125 core / 128 MiB
    # The API-key secret guards the endpoint, so Modal's proxy auth is not also required.
    assert info.unauthenticated
    assert info.secrets[0] == "modal.Secret.from_name('hf-token')" and "api-keys" in info.secrets[1]
    # Sized from the batcher (GPU torch batches of 64): two batches per container, eight to queue.
    # (Modal keeps a Server's target in its autoscaler settings, which .info() does not show.)
    assert module.Server._get_service_function().info().concurrency_info.max_inputs == 512
    assert module.TARGET_CONCURRENCY == 128 and "target_concurrency=TARGET_CONCURRENCY" in source
    assert module.app.name == "rag-embed"


def test_modal_ships_the_app_file_rather_than_pickling_it(gpu_app: tuple[Any, str]) -> None:
    """As with `modal deploy modal_app.py`: the container imports the file by its name."""
    from modal._utils.function_utils import FunctionSourceInfo

    module, _ = gpu_app
    for step in (module.fetch_weights, module.build_exports):
        source = FunctionSourceInfo(step)
        assert not source.is_serialized() and source.module_name == "modal_app"


def test_layers_put_the_weights_before_the_code(gpu_app: tuple[Any, str]) -> None:
    """A source edit rebuilds only the layers after the package copy: the weights stay."""
    _, source = gpu_app
    order = [
        source.index(".pip_install("),
        source.index(".add_local_dir("),  # the local model folders
        source.index(".run_function(fetch_weights"),
        source.index(".add_local_dir(PACKAGE_DIR"),
        source.index(".run_function(build_exports"),
        source.index('.env({"HF_HUB_OFFLINE": "1"})'),
    ]
    assert order == sorted(order)
    # fetch_weights names no package code, so editing the package cannot change its layer.
    fetch = source[source.index("def fetch_weights"):source.index("def build_exports")]
    assert "infinity_cloud" not in fetch
    # The exports are built on one GPU of the first type, with the HF secret only.
    assert ".run_function(build_exports, secrets=SECRETS, gpu='L4')" in source


def test_a_gpu_app_installs_the_cuda_build_modals_drivers_run_and_refuses_the_cpu(
    gpu_app: tuple[Any, str]
) -> None:
    """The app takes PyTorch's CUDA 13.0 build, which has kernels from the T4 to the B200 and
    runs on Modal's R580 drivers, and which PyTorch publishes for the torch it pins (torch 2.12
    dropped the CUDA 12.8 build this app took, so its image could not be built). Its image names
    its device, so a container without a usable GPU stops, saying why, before the exports."""
    from infinity_cloud.targets.modal.spec import TORCH_CUDA_BUILDS

    _, source = gpu_app
    assert 'index_url="https://download.pytorch.org/whl/cu130"' in source
    torch = re.search(r"torch==(\d+\.\d+)\.\d+", source)
    assert torch and "cu130" in TORCH_CUDA_BUILDS[torch.group(1)], source
    device = source.index(f'.env({{"{IMAGE_DEVICE_ENV}": "cuda"}})')
    assert device < source.index(".run_function(build_exports")


def test_the_api_key_secret_is_required_and_fails_closed(gpu_app: tuple[Any, str]) -> None:
    module, source = gpu_app
    assert f'modal.Secret.from_name("api-keys", required_keys=["{ENDPOINT_KEYS_ENV}"])' in source
    assert module.REQUIRE_KEYS is True
    assert 'SECRETS = [modal.Secret.from_name(name) for name in ["hf-token"]]' in source  # not the build's


def test_settings_modal_cannot_report_offline_are_in_the_source(gpu_app: tuple[Any, str]) -> None:
    _, source = gpu_app
    for setting in ("min_containers=1", "max_containers=3", "scaledown_window=120"):
        assert setting in source
    assert "MEMORY_SNAPSHOT = True" in source and "@modal.enter(snap=True)" in source
    assert '"enable_gpu_snapshot": True' in source  # CUDA during the snapshot needs it
    installs = re.findall(r"\.pip_install\((.*?)\)\n", source, flags=re.S)
    requirements = [r for block in installs for r in re.findall(r'(?<!index_url=)"([^"]+)"', block)]
    assert len(requirements) > 10 and all("==" in r for r in requirements), requirements
    assert any(r.startswith("transformers==") for r in requirements)


def test_the_package_ships_beside_the_app_with_its_targets_and_templates(gpu_app: tuple[Any, str]) -> None:
    module, _ = gpu_app
    package = Path(module.__file__).parent / "infinity_cloud"
    assert (package / "engine" / "front_door.py").is_file() and (package / "targets" / "runtime.py").is_file()
    assert (package / "templates" / "modal" / "modal_app.py.j2").is_file()
    assert not list(package.rglob("__pycache__"))


def test_the_engine_queue_is_sized_for_every_admitted_request(gpu_app: tuple[Any, str]) -> None:
    """Modal counts requests: the engine must not answer 429 to bulk requests before Modal's
    own limit does, or the app would reject instead of scaling out."""
    module, _ = gpu_app
    spec = container_spec(module.SPEC, {})
    per_request = spec.server.limits.max_inputs_per_request
    assert all(m.queue_size >= module.MAX_CONCURRENCY * per_request for m in spec.models)


def test_the_spec_file_beside_the_app_renders_the_same_app(gpu_app: tuple[Any, str], tmp_path: Path) -> None:
    module, source = gpu_app
    _, again = build(tmp_path, "--config", str(Path(module.__file__).with_name("infinity-cloud.yaml")))
    assert again == source


def test_the_example_spec_renders_two_models_in_one_app(tmp_path: Path) -> None:
    from conftest import ROOT

    module, _ = build(tmp_path, "--config", str(ROOT / "examples/modal/infinity-cloud.yaml"))
    assert [m["served_model_name"] for m in module.SPEC["models"]] == ["bge-m3", "reranker"]
    assert module.Server.info().gpus == [("L4", 1), ("A10G", 1)]
    assert module.HUB_MODELS == [("BAAI/bge-m3", None), ("BAAI/bge-reranker-v2-m3", None)]


def test_the_container_sees_local_folders_at_their_image_copies(gpu_app: Any, tiny_embedder: Path) -> None:
    module, _ = gpu_app
    spec = container_spec(module.SPEC, {})
    copy, image_path = module.MODEL_COPIES[0]
    assert spec.models[0].model_id == image_path and image_path.startswith("/models/local/")
    assert (Path(module.__file__).parent / copy / "config.json").is_file()  # what add_local_dir sends
    assert spec.models[0].name == "embedder"
    assert "modal" not in module.SPEC  # the container's copy holds what it serves, not how
    assert module.HUB_MODELS == []  # nothing to fetch from the hub


def test_a_local_folder_is_served_under_its_folder_name_not_the_build_path(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    module, source = build(tmp_path, "--model-id", str(tiny_embedder))
    assert container_spec(module.SPEC, {}).models[0].name == tiny_embedder.name
    assert str(tiny_embedder) not in source  # nothing rendered names where it lay here


def test_defaults_are_safe(tmp_path: Path, tiny_embedder: Path) -> None:
    """No flags: proxy auth required, a container cap, CPU and memory reserved, OpenVINO on a
    CPU torch build, sized for its batches of 16."""
    module, source = build(tmp_path, "--model-id", str(tiny_embedder))
    info = module.Server.info()
    assert not info.unauthenticated
    assert "max_containers=2," in source
    assert info.gpus == [] and (info.cpu, info.memory_mib) == (4.0, 8192)
    assert (module.MAX_CONCURRENCY, module.TARGET_CONCURRENCY) == (128, 32)
    assert "download.pytorch.org/whl/cpu" in source and '"openvino==' in source and '"onnx==' in source
    assert "enable_gpu_snapshot" not in source and "MEMORY_SNAPSHOT = False" in source
    assert IMAGE_DEVICE_ENV not in source
    assert module.REQUIRE_KEYS is False


@pytest.mark.parametrize("field", [name for name, f in ModalTarget.spec_class.model_fields.items()])
def test_every_setting_shows_its_default_in_help(field: str) -> None:
    help_text = runner.invoke(cli, ["deploy", "modal", "--help"], env={"COLUMNS": "250"}).output
    info = ModalTarget.spec_class.model_fields[field]
    flag = (info.json_schema_extra or {}).get("flag") or f"--{field.replace('_', '-')}"
    assert flag in help_text
    default = info.get_default(call_default_factory=True)
    if default not in (None, (), ""):
        shown = {True: "on", False: "off"}.get(default, default) if isinstance(default, bool) else default
        assert f"(default: {shown})" in help_text, field


@pytest.mark.parametrize(("backend", "package"), [("onnx", "onnxruntime"), ("ctranslate2", "ctranslate2")])
def test_the_image_installs_each_models_backend(tmp_path: Path, tiny_embedder: Path, backend, package):
    _, source = build(tmp_path, "--model-id", str(tiny_embedder), "--backend", backend)
    assert f'"{package}==' in source and '"torch==' in source  # torch makes the export at build


def test_one_concurrency_bound_given_bounds_the_others_default(tmp_path: Path, tiny_embedder: Path) -> None:
    module, _ = build(tmp_path, "--model-id", str(tiny_embedder), "--gpu", "T4", "--max-concurrency", "5")
    assert (module.MAX_CONCURRENCY, module.TARGET_CONCURRENCY) == (5, 5)
    args = ["--model-id", str(tiny_embedder), "--gpu", "T4"]
    module, _ = build(tmp_path, *args, "--target-concurrency", "1000")
    assert (module.MAX_CONCURRENCY, module.TARGET_CONCURRENCY) == (1000, 1000)


def test_a_multi_gpu_container_asks_modal_for_every_gpu_and_takes_their_load(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    """--gpu L4:4 is Modal's TYPE:COUNT: the container gets four GPUs, the server (device auto, no
    device ids) makes a replica on each, so the container admits four times one GPU's requests.
    A fallback list keeps each entry's count; the exports build on one GPU of the first type."""
    one, _ = build(tmp_path / "one", "--model-id", str(tiny_embedder), "--gpu", "L4")
    module, source = build(tmp_path / "four", "--model-id", str(tiny_embedder), "--gpu", "l4:4")
    assert module.Server.info().gpus == [("L4", 4)]
    # Every GPU's replica batches at once: the container's memory, unless given, is 4 x one's.
    assert module.Server.info().memory_mib == 4 * one.Server.info().memory_mib == 4 * 8192
    assert (module.MAX_CONCURRENCY, module.TARGET_CONCURRENCY) == (
        4 * one.MAX_CONCURRENCY, 4 * one.TARGET_CONCURRENCY)
    assert ".run_function(build_exports, secrets=SECRETS, gpu='L4')" in source
    assert "CUDA_VISIBLE_DEVICES" not in source
    served = container_spec(module.SPEC, {}).models[0]
    assert served.device in ("auto", "cuda") and not served.device_ids  # every GPU the container has
    fallback, _ = build(tmp_path / "fallback", "--model-id", str(tiny_embedder), "--gpu", "H100,A100-80GB:2")
    assert fallback.Server.info().gpus == [("H100", 1), ("A100-80GB", 2)]
    # The fewest GPUs of the list size the container: a one-GPU fallback is not flooded.
    assert fallback.MAX_CONCURRENCY == one.MAX_CONCURRENCY
    assert fallback.Server.info().memory_mib == 8192
    given, _ = build(tmp_path / "given", "--model-id", str(tiny_embedder), "--gpu", "L4:4",
                     "--memory", "9000")
    assert given.Server.info().memory_mib == 9000


# -- the class, run here as Modal runs it in a container ---------------------------------


def lifecycle(obj: Any, *flags: int) -> None:
    """Call the hooks Modal's container calls, in its order (pre-snapshot, post-snapshot)."""
    for flag in flags:
        for hook in _find_callables_for_obj(obj, flag).values():
            hook()


@pytest.fixture(scope="module")
def running_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_embedder: Path, tiny_reranker: Path
) -> Iterator[str]:
    """The Server class's enter hooks (engine, then HTTP on its port), with the keys a Modal
    secret would set; its exit hook at the end."""
    port = free_port()
    out = tmp_path_factory.mktemp("modal-run")
    models = ["--model-id", str(tiny_embedder), "--model-id", str(tiny_reranker)]
    module, _ = build(out, *models, *GPU_APP, "--port", str(port))
    server = module.Server._get_user_cls()()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENDPOINT_KEYS_ENV, "key-one key-two")
        lifecycle(server, _PartialFunctionFlags.ENTER_PRE_SNAPSHOT, _PartialFunctionFlags.ENTER_POST_SNAPSHOT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        lifecycle(server, _PartialFunctionFlags.EXIT)
    assert all(m.state == "stopped" for m in server.engine.models.values())


def test_the_server_answers_on_its_port(running_server: str, tiny_embedder: Path, tiny_reranker: Path):
    url = running_server
    auth = {"Authorization": "Bearer key-two"}
    embed = {"model": "embedder", "input": TEXTS}
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert httpx.post(f"{url}/embeddings", json=embed).status_code == 401
    embedded = httpx.post(f"{url}/embeddings", json=embed, headers=auth)
    assert embedded.status_code == 200, embedded.text
    ours = np.array([d["embedding"] for d in embedded.json()["data"]])
    reference = SentenceTransformer(str(tiny_embedder), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert cosines(ours, reference).min() > 0.999

    body = {"model": "reranker", "query": "cold start", "documents": TEXTS, "return_documents": True}
    ranked = httpx.post(f"{url}/rerank", json=body, headers=auth)
    assert ranked.status_code == 200, ranked.text
    scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    expected = CrossEncoder(str(tiny_reranker), device="cpu").predict([("cold start", t) for t in TEXTS])
    np.testing.assert_allclose([scores[i] for i in range(len(TEXTS))], expected, atol=2e-3)
    models = httpx.get(f"{url}/models", headers=auth)
    assert [m["id"] for m in models.json()["data"]] == ["embedder", "reranker"]


@pytest.mark.parametrize("value", [None, "", "  "])
def test_a_container_without_its_keys_refuses_to_serve(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    module, _ = build(tmp_path, "--model-id", str(tiny_embedder), "--api-key-secret", "keys",
                      "--port", str(free_port()))
    if value is None:
        monkeypatch.delenv(ENDPOINT_KEYS_ENV, raising=False)
    else:
        monkeypatch.setenv(ENDPOINT_KEYS_ENV, value)
    server = module.Server._get_user_cls()()
    with pytest.raises(ConfigError, match="refusing to serve an open endpoint"):
        lifecycle(server, _PartialFunctionFlags.ENTER_PRE_SNAPSHOT, _PartialFunctionFlags.ENTER_POST_SNAPSHOT)
    lifecycle(server, _PartialFunctionFlags.EXIT)  # survives the failed start


def test_the_image_build_step_exports_each_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_embedder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `build_exports` runs in the image build, here against this machine's CPU."""
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path / "exports"))
    module, _ = build(tmp_path / "app", "--model-id", str(tiny_embedder), "--backend", "onnx")
    bake_models(container_spec(module.SPEC, module.model_dirs()))  # the copy beside the app, here
    assert "ready for onnx" in capsys.readouterr().out
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "exports").iterdir()) == ["onnx", "onnxruntime"]


# -- refusals, credentials and the deploy call -------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "H1000"], "unknown GPU 'H1000'"),
        # Modal's GPU guide ("Specifying GPU count", modal.com/docs/guide/gpu): up to 8 of B200,
        # H200, H100, A100, L4, T4, L40S on one machine, up to 4 of A10.
        (["--gpu", "H100:9"], "Modal attaches 1 to 8 H100 GPUs to a container"),
        (["--gpu", "A10G:8"], "Modal attaches 1 to 4 A10G GPUs to a container"),
        (["--gpu", "L4:0"], "Modal attaches 1 to 8 L4 GPUs"),
        (["--gpu", "L4:two"], "Modal attaches 1 to 8 L4 GPUs"),
        (["--gpu", "RTX-PRO-6000:2"], "Modal attaches 1 to 1 RTX-PRO-6000"),
        (["--min-containers", "3", "--max-containers", "2"], "min_containers (3) exceeds max_containers (2)"),
        (["--scaledown-window", "1"], "scaledown_window"),
        (["--scaledown-window", "3601"], "less than or equal to 3600"),
        (["--target-concurrency", "10", "--max-concurrency", "5"], "target_concurrency (10) exceeds"),
        (["--gpu", "L4", "--backend", "onnx"], "packaged for cpu containers only"),
        (["--gpu", "L4", "--backend", "openvino"], "packaged for cpu containers only"),
        (["--backend", "onnx", "--dtype", "bfloat16"], "the onnx backend takes float32, float16, int8"),
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


COMMANDS = [["deploy", "modal"], ["status", "modal"], ["delete", "modal", "--yes"], ["invoke", "modal"]]


@pytest.mark.parametrize("command", COMMANDS)
def test_without_credentials_every_command_says_how_to_log_in(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(modal.App, "deploy", must_not_deploy)
    out = ["--out", str(tmp_path / "out")] if command[0] == "deploy" else []
    result = runner.invoke(cli, [*command, *out], env=NO_MODAL_TOKEN)
    assert result.exit_code == 2
    assert "no Modal credentials" in result.output and "modal token new" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def raising(error: BaseException) -> Any:
    def call(*_: Any, **__: Any) -> Any:
        raise error

    return call


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("error", "line"),
    [
        (modal.exception.AuthError("Token ID is malformed"), "Modal rejected this machine's token"),
        (modal.exception.NotFoundError("App not found"), "no Modal app named 'infinity-cloud'"),
        (modal.exception.InvalidError("bad request"), "Modal refused to"),
        (ConnectionResetError("peer went away"), "ConnectionResetError: peer went away"),
    ],
)
def test_every_modal_failure_is_one_clear_line(
    command: list[str], error: BaseException, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    tiny_embedder: Path,
) -> None:
    """The same message for the same failure, whichever command met it; never a traceback."""
    monkeypatch.setattr(modal.App, "deploy", raising(error))
    monkeypatch.setattr(modal.App, "lookup", raising(error))
    deploying = command[0] == "deploy"
    extra = ["--out", str(tmp_path / "out"), "--model-id", str(tiny_embedder)] if deploying else []
    result = runner.invoke(cli, [*command, *extra], env=A_MODAL_TOKEN)
    assert result.exit_code == 2, result.output
    assert line in result.output, result.output
    assert "Traceback" not in result.output
    assert len([ln for ln in result.output.splitlines() if ln.startswith("error:")]) == 1


def test_dry_run_renders_and_loads_without_credentials(tmp_path: Path, monkeypatch, tiny_embedder) -> None:
    monkeypatch.setattr(modal.App, "deploy", must_not_deploy)
    out = tmp_path / "out"
    args = ["deploy", "modal", "--dry-run", "--out", str(out), "--model-id", str(tiny_embedder)]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "nothing deployed" in result.output and (out / "modal_app.py").is_file()
    assert "public" not in result.output
    public = runner.invoke(cli, [*args, "--no-proxy-auth"])  # warned as the real deploy warns
    assert public.exit_code == 0 and "this endpoint is public" in public.output


def test_dry_run_says_what_it_would_deploy(tmp_path: Path, monkeypatch, tiny_embedder) -> None:
    """The app, its GPUs, scaling and image, as the Modal client reads them from the rendered app."""
    monkeypatch.setattr(modal.App, "deploy", must_not_deploy)
    args = ["deploy", "modal", "--dry-run", "--out", str(tmp_path / "out"), "--model-id", str(tiny_embedder),
            "--served-model-name", "embedder", "--url-prefix", "/api", *shlex.split(
                "--gpu l4 --gpu A100-80GB --min-containers 1 --max-containers 3 --scaledown-window 120 "
                "--api-key-secret api-keys --app-name rag-embed")]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    said = result.output
    assert "would deploy Modal app 'rag-embed' (environment: the profile's)" in said, said
    assert "serves:   embedder on port 8000, under /api; auth: API keys from Modal secret 'api-keys'" in said
    assert "GPU:      L4 else A100-80GB; 4 CPU, 8192 MiB per container" in said, said
    assert re.search(r"scaling:  1 to 3 containers, scaled down after 120 s idle; \d+ requests per container "
                     r"at most, \d+ targeted", said), said
    assert re.search(r"image:    Modal debian_slim, Python 3\.\d+, torch==[\d.]+ \(cu\d+\), the package with "
                     r"\[[a-z,0-9]+\], pinned; weights baked in: /models/", said), said
    assert said.rstrip().endswith("nothing deployed (--dry-run)")


def test_deploy_calls_app_deploy_with_output_enabled(tmp_path: Path, monkeypatch, tiny_embedder) -> None:
    calls: list[dict[str, Any]] = []

    def fake_deploy(self: Any, **kwargs: Any) -> Any:
        calls.append({**kwargs, "app": self.name, "output": modal.output.OutputManager.get().is_enabled})
        return self

    monkeypatch.setattr(modal.App, "deploy", fake_deploy)
    args = shlex.split(f"deploy modal --out {tmp_path} --model-id {tiny_embedder} --gpu H100")
    args.append("--no-proxy-auth")
    args += ["--app-name", "my-embedder", "--environment", "staging"]
    result = runner.invoke(cli, args, env=A_MODAL_TOKEN)
    assert result.exit_code == 0, result.output
    expected = {"name": "my-embedder", "environment_name": "staging", "app": "my-embedder", "output": True}
    assert calls == [expected]
    assert "deployed modal 'my-embedder'" in result.output
    assert "this endpoint is public" in result.output  # no proxy auth and no key secret: said out loud
    assert "infinity-cloud status modal" in result.output  # the fake hydrates nothing, so no URL


def test_invoke_sends_the_proxy_auth_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint `invoke` calls carries Modal's proxy-auth headers from the environment."""
    spec = DeploymentSpec()
    monkeypatch.setattr(ModalTarget, "status", lambda self, spec: {"url": "https://ws--app-server.modal.run"})
    monkeypatch.delenv("MODAL_KEY", raising=False)
    with pytest.raises(Exception, match="MODAL_KEY and MODAL_SECRET"):
        ModalTarget().endpoint(spec, None)
    monkeypatch.setenv("MODAL_KEY", "wk-1")
    monkeypatch.setenv("MODAL_SECRET", "ws-1")
    endpoint = ModalTarget().endpoint(spec, "k")
    assert endpoint.url == "https://ws--app-server.modal.run"
    assert endpoint.headers == {"Modal-Key": "wk-1", "Modal-Secret": "ws-1", "Authorization": "Bearer k"}


def test_usage_examples_name_the_endpoint_model_key_and_headers() -> None:
    url = "https://ws--app-server.modal.run/api"
    text = usage_examples(url, "BAAI/bge-m3", api_key=True, headers={"Modal-Key": "$MODAL_KEY"})
    assert f"curl {url}/embeddings" in text and f'OpenAI(base_url="{url}"' in text
    assert f"Bearer ${CLIENT_KEY_ENV}" in text and '"model": "BAAI/bge-m3"' in text
    assert '-H "Modal-Key: $MODAL_KEY"' in text and 'default_headers={"Modal-Key"' in text
    assert CLIENT_KEY_ENV not in usage_examples(url, "m")


def test_smoke_modal_checks_the_deployed_app(
    running_server: str, tiny_embedder: Path, tiny_reranker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`smoke modal --deployed` against the app's Server running through its own hooks; only
    the two lookups that need Modal's servers (the app's state, the Server's URL) answer
    from here."""
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")

    class Looked:
        def info(self) -> Any:
            lifecycle = type("Lifecycle", (), {"state": type("State", (), {"value": "deployed"})(),
                                               "deployed_at": "now"})()
            return type("Info", (), {"app_id": "ap-test", "lifecycle": lifecycle})()

        def get_url(self) -> str:
            return running_server

    monkeypatch.setattr(modal.App, "lookup", lambda *a, **k: Looked())
    monkeypatch.setattr(modal.Server, "from_name", lambda *a, **k: Looked())
    flags = ["--model-id", str(tiny_embedder), "--model-id", str(tiny_reranker), *GPU_APP]
    result = runner.invoke(cli, ["smoke", "modal", "--deployed", "--key", "key-two", *flags])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    embedded = "embeddings: embedder, 4 texts, worst cosine to the local run"
    assert any(line.startswith(embedded) for line in lines)
    assert any(line.startswith("rerank: reranker, 3 documents, the same ranking") for line in lines)
    assert lines[-1] == "smoke: every check held" and not any(line.startswith("delete:") for line in lines)
