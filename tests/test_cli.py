"""The command line: help, config show with env and flags, refusals, build local."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import yaml
from conftest import ROOT, server_process
from typer.testing import CliRunner

from infinity_cloud.backends import exports
from infinity_cloud.cli import app
from infinity_cloud.config import DEFAULT_MODEL_ID

runner = CliRunner()


def test_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("serve", "config", "build", "download"):
        assert command in result.output
    serve_help = runner.invoke(app, ["serve", "--help"]).output
    assert "--model-id" in serve_help and "INFINITY_CLOUD_MODEL_ID" in serve_help


def test_config_show_merges_file_env_and_flags(tmp_path):
    config = tmp_path / "infinity-cloud.yaml"
    config.write_text("server:\n  port: 9000\n  url_prefix: /file\nmodels:\n  - model_id: from-file\n")
    result = runner.invoke(
        app,
        ["config", "show", "--config", str(config), "--format", "json", "--url-prefix", "/flag"],
        env={"INFINITY_CLOUD_PORT": "9100", "INFINITY_CLOUD_URL_PREFIX": "/env"},
    )
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert spec["server"]["port"] == 9100  # env over file
    assert spec["server"]["url_prefix"] == "/flag"  # flag over env
    assert spec["models"][0]["model_id"] == "from-file"


def test_config_show_yaml_and_repeated_models():
    result = runner.invoke(
        app, ["config", "show", "--model-id", "a", "--model-id", "b", "--api-key", "k1", "--api-key", "k2"]
    )
    assert result.exit_code == 0, result.output
    spec = yaml.safe_load(result.output)
    assert [m["model_id"] for m in spec["models"]] == ["a", "b"]
    assert spec["server"]["api_keys"] == ["k1", "k2"]


def test_invalid_options_are_refused_with_a_message():
    result = runner.invoke(app, ["config", "show", "--dtype", "float8"])
    assert result.exit_code == 2
    assert "dtype" in result.output


def test_serve_with_a_missing_model_exits_with_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "infinity_cloud", "serve", "--model-id", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert proc.returncode != 0
    assert "does not exist" in proc.stderr


def test_serve_without_a_model_serves_the_default_offline(tmp_path):
    # An empty Hugging Face cache: the default model must come from its registry package.
    with server_process(env={"HF_HOME": str(tmp_path / "hf")}) as url:
        models = httpx.get(f"{url}/models").json()["data"]
        assert [m["id"] for m in models] == [DEFAULT_MODEL_ID]
        response = httpx.post(f"{url}/v1/embeddings", json={"input": "offline"})
        assert response.status_code == 200
        assert len(response.json()["data"][0]["embedding"]) == 384


def test_build_local_renders_dockerfile_compose_and_spec(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["build", "local", "--out", str(out), "--model-id", "BAAI/bge-small-en-v1.5", "--port", "8080"]
    )
    assert result.exit_code == 0, result.output
    dockerfile = (out / "Dockerfile").read_text()
    assert "COPY src /src" in dockerfile and "infinity-cloud download" in dockerfile
    assert "EXPOSE 8080" in dockerfile
    assert '"8080:8080"' in (out / "compose.yaml").read_text()
    spec = yaml.safe_load((out / "infinity-cloud.yaml").read_text())
    assert spec["models"][0]["model_id"] == "BAAI/bge-small-en-v1.5"
    assert spec["server"]["host"] == "0.0.0.0"
    assert (out / "src" / "infinity_cloud" / "engine.py").is_file()


def test_the_wheel_ships_the_templates(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    import zipfile

    (wheel,) = tmp_path.glob("infinity_cloud-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "templates/local/Dockerfile.j2" in names
    assert "templates/modal/modal_app.py.j2" in names and "targets/modal/entry.py" in names
    assert "targets/local/target.py" in names
    assert "infinity_cloud/server/app.py" in names


def test_download_builds_the_backend_exports_ahead_of_serving(tiny_embedder, tmp_path, monkeypatch):
    cache = tmp_path / "exports"
    monkeypatch.setenv(exports.CACHE_ENV, str(cache))
    args = ["download", "--model-id", str(tiny_embedder), "--backend", "onnx", "--dtype", "float32"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "ready for onnx (float32, cpu)" in result.output
    built = sorted(p.name.split("-")[0] for p in cache.iterdir())
    assert built == ["onnx", "onnxruntime"]
    files_only = runner.invoke(app, [*args, "--files-only"])
    assert files_only.exit_code == 0 and "ready for" not in files_only.output
