"""The command line: help, config show with env and flags, refusals, build local."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
import yaml
from conftest import ROOT, server_process
from typer.testing import CliRunner

from infinity_cloud.backends import exports
from infinity_cloud.cli import app
from infinity_cloud.core.config import DEFAULT_MODEL_ID

runner = CliRunner()


def test_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("serve", "config", "build", "download"):
        assert command in result.output
    serve_help = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
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
    assert spec["server"]["api_keys"] == ["***", "***"]  # both taken, neither printed
    assert "k1" not in result.output


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
    assert "EXPOSE 8080" in dockerfile
    assert '"8080:8080"' in (out / "compose.yaml").read_text()
    spec = yaml.safe_load((out / "infinity-cloud.yaml").read_text())
    assert spec["models"][0]["model_id"] == "BAAI/bge-small-en-v1.5"
    assert spec["server"]["host"] == "0.0.0.0"
    # The package as installed (targets and templates inside it), not a pip install from an index.
    assert (out / "infinity_cloud" / "engine" / "front_door.py").is_file()
    assert (out / "infinity_cloud" / "targets" / "runtime.py").is_file()
    assert (out / "infinity_cloud" / "templates" / "local" / "Dockerfile.j2").is_file()
    assert "pip install --no-cache-dir -r /opt/infinity-cloud/requirements.txt" in dockerfile
    # Weights are fetched before the code is copied, so a code change does not fetch them again.
    fetch = dockerfile.index("snapshot_download")
    assert fetch < dockerfile.index("COPY infinity_cloud") < dockerfile.index("infinity_cloud download")
    # torch converts the model in a first stage; what runs takes the weights and their exports
    # over and installs the runtime alone (issue 35: an image serves without torch).
    convert, run = re.split(r"^FROM ", dockerfile, flags=re.M)[1:]
    assert convert.splitlines()[0].endswith(" AS convert") and "infinity_cloud download" in convert
    assert "torch" not in run.replace("No torch", "") and "COPY --from=convert /models /models" in run
    assert "requirements-serving.txt" in run and run.rstrip().endswith('"infinity_cloud", "serve"]')
    serving = {line.split("==")[0] for line in (out / "requirements-serving.txt").read_text().splitlines()}
    assert "openvino" in serving and not serving & {"torch", "transformers", "onnx", "sentence-transformers"}


@pytest.mark.parametrize(
    ("backend", "runtime"), [("auto", "openvino"), ("onnx", "onnxruntime"), ("ctranslate2", "ctranslate2")]
)
def test_build_local_installs_the_serving_backends_runtime(tmp_path, backend: str, runtime: str):
    out = tmp_path / "out"
    result = runner.invoke(app, ["build", "local", "--out", str(out), "--backend", backend])
    assert result.exit_code == 0, result.output
    pins = (out / "requirements.txt").read_text().splitlines()
    names = {line.split("==")[0].split("[")[0] for line in pins}
    assert runtime in names and "transformers" in names  # the runtime and its converter
    assert all("==" in line for line in pins if line.split("==")[0] in {runtime, "fastapi"})
    serving = {line.split("==")[0] for line in (out / "requirements-serving.txt").read_text().splitlines()}
    assert runtime in serving and "torch" not in serving  # what runs, after the first stage converts


def test_build_local_copies_local_model_folders_into_the_image(tmp_path, tiny_embedder):
    out = tmp_path / "out"
    result = runner.invoke(app, ["build", "local", "--out", str(out), "--model-id", str(tiny_embedder)])
    assert result.exit_code == 0, result.output
    spec = yaml.safe_load((out / "infinity-cloud.yaml").read_text())
    image_path = spec["models"][0]["model_id"]
    # Served under its folder's name, not where it lay on the building machine.
    assert spec["models"][0]["served_model_name"] == tiny_embedder.name
    for rendered in ("infinity-cloud.yaml", "Dockerfile", "compose.yaml"):
        assert str(tiny_embedder) not in (out / rendered).read_text()
    copy = out / "models" / image_path.rsplit("/", 1)[1]
    assert (copy / "config.json").is_file() and not (copy / ".infinity-cloud").exists()
    assert f"COPY models/{copy.name} {image_path}" in (out / "Dockerfile").read_text()


def test_build_local_refuses_api_keys_in_the_spec(tmp_path):
    result = runner.invoke(app, ["build", "local", "--out", str(tmp_path / "out"), "--api-key", "s3cret"])
    assert result.exit_code == 2 and "INFINITY_CLOUD_API_KEY" in result.output
    assert not (tmp_path / "out").exists()


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
    assert "infinity_cloud/templates/local/Dockerfile.j2" in names
    assert "infinity_cloud/templates/modal/modal_app.py.j2" in names
    assert "infinity_cloud/targets/local/target.py" in names and "infinity_cloud/targets/runtime.py" in names
    assert "infinity_cloud/server/app/__init__.py" in names
    # Nothing lands under a generic top-level name.
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"infinity_cloud"}
    # Every package of the tree is in the wheel (setup.py finds them).
    for init in [*ROOT.glob("infinity_cloud/**/__init__.py"), *ROOT.glob("targets/**/__init__.py")]:
        rel = init.relative_to(ROOT).as_posix()
        installed = rel if rel.startswith("infinity_cloud/") else f"infinity_cloud/{rel}"
        assert installed in names, f"{rel} is missing from the wheel: setup.py did not find its package"


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


@pytest.mark.parametrize("target", ["sagemaker", "aws-lambda"])
def test_a_local_folder_is_served_under_its_folder_name_in_every_image(tmp_path, tiny_embedder, target):
    """Not under the building machine's path: no rendered file names it."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["build", target, "--out", str(out), "--model-id", str(tiny_embedder)])
    assert result.exit_code == 0, result.output
    spec = yaml.safe_load((out / "infinity-cloud.yaml").read_text())
    assert spec["models"][0]["served_model_name"] == tiny_embedder.name
    rendered = [p for p in out.iterdir() if p.is_file() and p.suffix in ("", ".yaml", ".txt")]
    assert rendered and all(str(tiny_embedder) not in p.read_text() for p in rendered)


def test_two_local_folders_of_one_name_are_refused_at_build(tmp_path, tiny_embedder):
    import shutil

    for parent in ("a", "b"):
        shutil.copytree(tiny_embedder, tmp_path / parent / "minilm")
    args = ["build", "local", "--out", str(tmp_path / "out"),
            "--model-id", str(tmp_path / "a" / "minilm"), "--model-id", str(tmp_path / "b" / "minilm")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "two models would be served as 'minilm'" in result.output
    assert "--served-model-name" in result.output


def test_a_slow_step_says_it_is_still_running_where_no_one_watches_a_terminal(caplog) -> None:
    import logging
    import time

    from infinity_cloud.core.progress import slow_step

    with caplog.at_level(logging.INFO, logger="infinity_cloud"), slow_step("converting", heartbeat_s=0.05):
        time.sleep(0.3)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "converting ..." and messages[-1].startswith("converting: done in")
    assert sum("converting: still running after" in m for m in messages) >= 2


def test_download_shows_its_own_progress(tiny_embedder, tmp_path) -> None:
    import os

    command = [sys.executable, "-m", "infinity_cloud", "download", "--model-id", str(tiny_embedder),
               "--backend", "onnx"]
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_CLOUD_CACHE": str(tmp_path)}
    run = subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", cwd=ROOT,
                         env=environ, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"loading {tiny_embedder} to build what its backend needs ..." in run.stderr
    assert "exporting" in run.stderr.lower() or "(once; cached at" in run.stderr
    assert "done in" in run.stderr and "ready for onnx" in run.stdout


def test_an_unreachable_hub_is_said_at_once_with_what_to_do(tmp_path) -> None:
    """With the hub out of reach and HF_HUB_OFFLINE unset, serve fails in one line that says how
    to go on (HF_HUB_OFFLINE=1, a local folder, a proxy), not after the hub client's retries
    (each logged twice) with only the socket's error. A closed local port stands for the hub."""
    import os
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if k not in {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"}}
    environ.update(HF_ENDPOINT=f"http://127.0.0.1:{closed}", HF_HOME=str(tmp_path / "hf"), NO_PROXY="*")
    run = subprocess.run(
        [sys.executable, "-m", "infinity_cloud", "serve", "--model-id", "BAAI/bge-small-en-v1.5"],
        capture_output=True, encoding="utf-8", errors="replace", cwd=ROOT, env=environ, timeout=300,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    said = run.stderr.strip().splitlines()
    assert len(said) == 1, run.stderr
    assert said[0].startswith("error: model 'BAAI/bge-small-en-v1.5' is not on this machine"), said
    assert f"127.0.0.1:{closed}" in said[0] and "cannot be reached" in said[0], said
    for way_out in ("HF_HUB_OFFLINE=1", "local folder", "HTTPS_PROXY"):
        assert way_out in said[0], said
    assert "Retrying" not in run.stderr and "Traceback" not in run.stderr


def test_the_hub_clients_lines_are_logged_once() -> None:
    """The hub client's logger has a handler of its own and its lines reach the root's too:
    where logging is set up (serve), each of its warnings was printed twice."""
    code = (
        "import logging; logging.basicConfig()\n"
        "import huggingface_hub.utils._http\n"
        "from infinity_cloud.models import model_source\n"
        "model_source._hub_logs_once()\n"
        "logging.getLogger('huggingface_hub.utils._http').warning('retrying, say')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.stderr.count("retrying, say") == 1, run.stderr


def test_serve_says_where_its_docs_models_and_a_first_call_are(tiny_embedder, tiny_reranker, tmp_path):
    """Once it listens, serve prints the URLs of /docs and /models and a curl per model that works
    as printed: the URL prefix and port in it, a placeholder for the key (never the key)."""
    import os
    import re as regex

    key = "sk-do-not-print-me"
    keys = tmp_path / "keys.txt"
    keys.write_text(key + "\n")
    log = tmp_path / "serve.log"
    with server_process("--model-id", str(tiny_embedder), "--served-model-name", "embedder",
                        "--model-id", str(tiny_reranker), "--served-model-name", "reranker",
                        "--backend", "torch", "--url-prefix", "/api", "--api-key-file", str(keys),
                        log_path=log, health="/api/health") as url:
        said = log.read_text()
        assert key not in said
        assert f"ready: {url}/api" in said, said
        assert f"API docs: {url}/api/docs" in said and f"models:   {url}/api/models" in said, said
        assert httpx.get(f"{url}/api/docs", timeout=30).status_code == 200
        assert httpx.get(f"{url}/api/models", headers={"Authorization": f"Bearer {key}"},
                         timeout=30).status_code == 200
        curls = regex.findall(r"^curl .*\\\n  -d '.*'$", said, flags=regex.MULTILINE)
        assert len(curls) == 2 and all("$INFINITY_CLOUD_ENDPOINT_KEY" in c for c in curls), said
        answers = {}
        for curl in curls:
            client_env = {**os.environ, "INFINITY_CLOUD_ENDPOINT_KEY": key}
            done = subprocess.run(["bash", "-c", curl + " --fail-with-body --silent"], capture_output=True,
                                  text=True, timeout=120, env=client_env)
            assert done.returncode == 0, (curl, done.stdout, done.stderr)
            answers[curl.split()[1]] = json.loads(done.stdout)
    assert len(answers[f"{url}/api/embeddings"]["data"][0]["embedding"]) > 0
    assert len(answers[f"{url}/api/rerank"]["results"]) == 2
