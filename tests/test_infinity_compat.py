"""Moving from Infinity in one line: `infinity-cloud v2` takes `infinity_emb v2`'s flags, its
INFINITY_* variables and `;`-separated lists, serves the same, and prints the infinity-cloud
spelling once; every one of Infinity 0.0.78's flags is mapped or refused with its reason, and
documented."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, server_process
from typer.testing import CliRunner

from infinity_cloud.cli import app
from infinity_cloud.cli.infinity_compat import FLAGS, translate
from infinity_cloud.core.config import load_spec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.install_hint import install_command

# `infinity_emb v2 --help` of infinity-emb 0.0.78, every option.
INFINITY_0_0_78_FLAGS = (
    "model-id", "served-model-name", "batch-size", "revision", "trust-remote-code", "engine", "model-warmup",
    "vector-disk-cache", "device", "device-id", "lengths-via-tokenize", "dtype", "embedding-dtype",
    "pooling-method", "compile", "bettertransformer", "preload-only", "host", "port", "url-prefix",
    "redirect-slash", "log-level", "permissive-cors", "api-key", "proxy-root-path", "onnx-disable-optimize",
    "onnx-do-not-prefer-quantized",
)


def test_every_infinity_flag_is_known_and_documented() -> None:
    assert sorted(f.name.replace("_", "-") for f in FLAGS) == sorted(INFINITY_0_0_78_FLAGS)
    page = (ROOT / "docs" / "migrating-from-infinity.md").read_text(encoding="utf-8")
    for name in INFINITY_0_0_78_FLAGS:
        assert f"`--{name}`" in page, name


def test_flags_become_the_same_serve_command() -> None:
    models = ["BAAI/bge-small-en-v1.5", "mixedbread-ai/mxbai-rerank-xsmall-v1"]
    given = {"model_id": models, "batch_size": [16], "engine": ["optimum", "torch"], "dtype": ["float16"],
             "port": 8080, "permissive_cors": True, "api_key": "sk-1", "model_warmup": False,
             "log_level": "trace", "pooling_method": ["cls", "auto"]}
    translation = translate(given, {})
    assert translation.options == {
        "host": "0.0.0.0", "model_id": models, "max_batch_size": [16], "backend": ["onnx", "torch"],
        "warmup": False, "dtype": ["float16"], "pooling": ["cls", None], "port": 8080, "log_level": "debug",
        "cors_origins": ["*"], "api_keys": ["sk-1"],
    }
    assert translation.command.startswith(f"infinity-cloud serve --host 0.0.0.0 --model-id {models[0]} "
                                          f"--model-id {models[1]} --max-batch-size 16")
    assert "--api-key ***" in translation.command and "sk-1" not in translation.command
    spec = load_spec(None, **translation.options)
    assert [(m.model_id, m.backend, m.max_batch_size, m.pooling) for m in spec.models] == [
        (models[0], "onnx", 16, "cls"), (models[1], "torch", 16, None)]
    assert spec.server.cors_origins == ("*",) and spec.server.port == 8080


def test_infinity_variables_with_semicolons_fill_what_flags_do_not_give() -> None:
    environ = {"INFINITY_MODEL_ID": "a/one;b/two;", "INFINITY_BATCH_SIZE": "8;4", "INFINITY_PORT": "9000",
               "INFINITY_TRUST_REMOTE_CODE": "false", "INFINITY_VECTOR_DISK_CACHE": "true"}
    translation = translate({"port": 7000}, environ)
    assert translation.options["model_id"] == ["a/one", "b/two"]
    assert translation.options["max_batch_size"] == [8, 4]
    assert translation.options["port"] == 7000  # the flag wins
    assert translation.options["cache_mb"] == 1024
    assert translation.notes[0].startswith("--vector-disk-cache: becomes the in-process result cache "
                                           "(--cache-mb 1024), not on disk")
    assert len(translation.notes) == 1
    assert "cache_mb" not in translate({"vector_disk_cache": [False]}, {}).options
    with pytest.raises(ConfigError, match="INFINITY_BATCH_SIZE='eight' is not a valid int"):
        translate({}, {"INFINITY_BATCH_SIZE": "eight"})


@pytest.mark.parametrize(("given", "words"), [
    ({"engine": ["debugengine"]}, "Infinity's test engine"),
    ({"device": ["tensorrt"]}, "TensorRT through --backend onnx"),
    ({"dtype": ["fp8"]}, "--dtype fp8 has no counterpart"),
    ({"device_id": ["0,1"]}, "run one server per GPU"),
    ({"proxy_root_path": "/api"}, "--url-prefix /api"),
])
def test_flags_without_a_counterpart_are_refused_with_the_reason(given, words) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        translate(given, {})


def test_device_ids_become_cuda_devices() -> None:
    translation = translate({"model_id": ["a", "b"], "device_id": ["0", "1"], "device": ["cuda"]}, {})
    assert translation.options["device"] == ["cuda:0", "cuda:1"]


def test_our_own_variables_take_infinitys_separator_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINITY_CLOUD_MODEL_ID", "a/one;b/two")
    monkeypatch.setenv("INFINITY_CLOUD_SERVED_MODEL_NAME", "one;two,alias")
    result = CliRunner().invoke(app, ["config", "show", "--format", "json"])
    assert result.exit_code == 0, result.output
    import json

    models = json.loads(result.output)["models"]
    assert [(m["model_id"], m["served_model_name"], m["aliases"]) for m in models] == [
        ("a/one", "one", []), ("b/two", "two", ["alias"])]


def test_v2_serves_as_infinity_would_and_says_how_infinity_cloud_spells_it(
    tiny_embedder: Path, tmp_path
) -> None:
    log = tmp_path / "v2.log"
    with server_process("--model-id", str(tiny_embedder), "--engine", "optimum", "--served-model-name",
                        "tiny", "--no-model-warmup", "--compile", command="v2", log_path=log) as url:
        response = httpx.post(f"{url}/embeddings", json={"model": "tiny", "input": ["hello"]})
        assert response.status_code == 200
        assert httpx.get(f"{url}/models").json()["data"][0]["backend"] == "onnx"
    text = log.read_text(encoding="utf-8", errors="replace")
    assert text.count("as infinity-cloud: infinity-cloud serve --host 127.0.0.1 --model-id") == 1
    assert "--backend onnx" in text and "--no-warmup" in text
    assert "--compile: no effect" in text


# `infinity-cloud` as the README installs it ([openvino,export]: no ONNX Runtime), from this venv.
WITHOUT_ONNX_RUNTIME = (sys.executable, "-c", "import sys; sys.modules['onnxruntime'] = None; "
                        "sys.argv[0] = 'infinity-cloud'; from infinity_cloud.cli import main; main()")


def test_the_guides_first_example_serves_on_the_readmes_install(tiny_embedder: Path, tmp_path) -> None:
    """`--engine optimum` asks for ONNX Runtime, which the README's install lacks: the guide's
    first command serves on the fastest installed backend, and says so in one loud line with the
    command that adds ONNX Runtime (it failed: backend 'onnx' cannot be used)."""
    page = (ROOT / "docs" / "migrating-from-infinity.md").read_text(encoding="utf-8")
    first = next(line for line in page.splitlines() if line.startswith("infinity-cloud v2 "))
    assert "--engine optimum" in first, first
    args = shlex.split(first)[2:]
    args[args.index("--model-id") + 1] = str(tiny_embedder)
    del args[args.index("--port"):args.index("--port") + 2]  # server_process picks a free one
    log = tmp_path / "v2.log"
    with server_process(*args, "--served-model-name", "tiny", command="v2", log_path=log,
                        program=WITHOUT_ONNX_RUNTIME) as url:
        response = httpx.post(f"{url}/embeddings", json={"model": "tiny", "input": ["hello"]})
        assert response.status_code == 200, response.text
        assert httpx.get(f"{url}/models").json()["data"][0]["backend"] == "openvino"
    text = log.read_text(encoding="utf-8", errors="replace")
    warned = [line for line in text.splitlines() if line.startswith("warning: --engine optimum")]
    assert len(warned) == 1, text
    assert "not installed" in warned[0] and "(--backend auto: openvino)" in warned[0], warned
    assert install_command("onnx") in warned[0], warned
