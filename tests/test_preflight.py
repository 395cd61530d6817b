"""What would fail after minutes of loading is refused before the first model loads, each
problem a line with its fix: a media model without its extra, an unknown or absent device, an
export cache that cannot be written, a port in use."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import free_port, server_process
from typer.testing import CliRunner

from infinity_cloud.cli import app
from infinity_cloud.core.config import DeploymentSpec, ModelSpec, ServerSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.hardware import has_nvidia_gpu
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.targets import preflight


@pytest.fixture(scope="module")
def clip(build_model: Callable[..., Path]) -> Path:
    return build_model("clip")


def test_an_image_model_without_pillow_is_refused_before_loading(
    clip: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # as where the vision extra is not installed
    spec = DeploymentSpec(models=(ModelSpec(model_id=str(tiny_embedder), served_model_name="text"),
                                  ModelSpec(model_id=str(clip), served_model_name="clip")))
    with pytest.raises(ConfigError) as caught:
        preflight.check(spec, port=False)
    assert caught.value.message.splitlines()[1:] == [
        "  - model clip reads images, which needs Pillow (PIL is missing): " + install_command("vision")
    ]
    monkeypatch.undo()
    preflight.check(spec, port=False)  # with Pillow: nothing to say


def test_devices_are_refused_at_once_where_they_cannot_be(tiny_embedder: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown device 'gpu' \(an NVIDIA GPU is cuda\)"):
        ModelSpec(device="gpu")
    if has_nvidia_gpu():
        pytest.skip("this machine has an NVIDIA GPU")
    problems = preflight.model_problems(ModelSpec(model_id=str(tiny_embedder), device="cuda"))
    assert any("shows no NVIDIA GPU" in line and "--device cpu" in line for line in problems)


def test_an_export_cache_that_cannot_be_written_is_named(
    tiny_embedder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("INFINITY_CLOUD_CACHE", str(blocker / "cache"))
    problems = preflight.model_problems(ModelSpec(model_id=str(tiny_embedder)))
    assert problems == [f"model {tiny_embedder}: the export cache {blocker / 'cache'} is not writable: "
                        "set INFINITY_CLOUD_CACHE to a writable folder"]
    monkeypatch.setenv("INFINITY_CLOUD_CACHE", str(tmp_path / "fine" / "cache"))
    assert preflight.model_problems(ModelSpec(model_id=str(tiny_embedder))) == []


def read_only(model: Path, home: Path) -> tuple[str, ...]:
    """The server's command line, with `model` and `home` read-only to it."""
    python = (sys.executable, "-m", "infinity_cloud")
    if os.geteuid() == 0:  # root writes through permissions: read-only mounts instead
        mounts = 'mount --bind -o ro "$0" "$0" && mount --bind -o ro "$1" "$1" && shift && exec "$@"'
        return ("unshare", "-m", "sh", "-c", mounts, str(model), str(home), *python)
    subprocess.run(["chmod", "-R", "a-w", str(model), str(home)], check=True)
    return python


def test_a_read_only_model_folder_and_home_serve_with_exports_in_the_temporary_folder(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """A hardened container: the model folder and the home directory read-only, only the
    temporary folder writable. The server starts and serves (its exports in the temporary
    folder, said once), instead of dying on a PermissionError."""
    model, home, temporary = tmp_path / "model", tmp_path / "home", tmp_path / "tmp"
    shutil.copytree(tiny_embedder, model, ignore=shutil.ignore_patterns(".infinity-cloud"))
    home.mkdir()
    temporary.mkdir()
    program = read_only(model, home)
    log = tmp_path / "serve.log"
    env = {"HOME": str(home), "TMPDIR": str(temporary), "XDG_CACHE_HOME": "", "INFINITY_CLOUD_CACHE": ""}
    try:
        with server_process("--model-id", str(model), "--served-model-name", "emb", env=env,
                            program=program, log_path=log) as url:
            body = {"model": "emb", "input": ["read-only"]}
            answer = httpx.post(f"{url}/embeddings", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(model), str(home)], check=False)
    text = log.read_text(encoding="utf-8")
    assert "Traceback" not in text and "PermissionError" not in text, text[-3000:]
    assert text.count("is not writable: exports go to") == 1, text[-3000:]
    assert list((temporary / "infinity-cloud-exports").glob("*/manifest.json"))
    assert not (model / ".infinity-cloud").exists()


def test_exports_baked_beside_a_read_only_model_folder_are_served_as_they_are(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """An image's model folder holds the exports `download` built beside it at build, and the
    pod reads it as another user, read-only (Kubernetes' uid 10001, a read-only root): the
    server serves those exports, never builds them again (its run stage has no torch)."""
    model, home, temporary = tmp_path / "model", tmp_path / "home", tmp_path / "tmp"
    shutil.copytree(tiny_embedder, model, ignore=shutil.ignore_patterns(".infinity-cloud"))
    home.mkdir()
    temporary.mkdir()
    env = {"HOME": str(home), "TMPDIR": str(temporary), "XDG_CACHE_HOME": "", "INFINITY_CLOUD_CACHE": ""}
    args = ("--model-id", str(model), "--backend", "openvino", "--dtype", "float32")
    into = "--export-into-folder"  # as an image's build bakes them
    baked = subprocess.run([sys.executable, "-m", "infinity_cloud", "download", *args, into],
                           env={**os.environ, **env}, capture_output=True, timeout=300,
                           encoding="utf-8", errors="replace")  # its progress bars, whatever the locale
    assert baked.returncode == 0, baked.stderr[-3000:]
    assert list((model / ".infinity-cloud").glob("*/manifest.json"))
    log = tmp_path / "serve.log"
    try:
        with server_process(*args, "--served-model-name", "emb", env=env, program=read_only(model, home),
                            log_path=log) as url:
            answer = httpx.post(f"{url}/embeddings", json={"model": "emb", "input": ["baked"]}, timeout=60)
            assert answer.status_code == 200, answer.text
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(model), str(home)], check=False)
    text = log.read_text(encoding="utf-8")
    assert "exporting" not in text and "are not writable" not in text, text[-3000:]
    assert not list(temporary.glob("infinity-cloud-exports/*/manifest.json")), "nothing built again"


def test_a_port_in_use_stops_serve_before_any_model_loads(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert preflight.port_problems("127.0.0.1", port) == [
            f"port {port} on 127.0.0.1 is in use (another server?): stop it, or use --port"
        ]
        # A model that is nowhere (and the hub offline) would fail as it loads: the port is said first.
        result = CliRunner().invoke(app, ["serve", "--model-id", "nobody/nothing-here", "--port", str(port)])
    assert result.exit_code != 0
    assert f"port {port} on 127.0.0.1 is in use" in result.output, result.output
    assert "nothing-here" not in result.output
    assert preflight.port_problems("127.0.0.1", port) == []


def test_every_problem_is_listed_at_once(tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINITY_CLOUD_CACHE", "/dev/null/cache")
    spec = DeploymentSpec(
        models=(ModelSpec(model_id=str(tiny_embedder), served_model_name="a", backend="ctranslate2"),
                ModelSpec(model_id="./not-a-folder", served_model_name="b")),
        server=ServerSpec(port=0),
    )
    with pytest.raises(ConfigError) as caught:
        preflight.check(spec)
    lines = caught.value.message.splitlines()
    assert lines[0] == "cannot start:"
    assert any(line.startswith("  - model a: the export cache /dev/null/cache") for line in lines)
    assert any(line.startswith("  - model b:") and "does not exist" in line for line in lines)


def test_a_read_only_export_cache_serves_what_it_holds_and_builds_the_rest_in_the_temporary_folder(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """An image's baked cache (INFINITY_CLOUD_CACHE on Lambda's read-only task root): its
    exports are served from it, and one it lacks (a precision verdict for another CPU's
    kernels) is built in the temporary folder instead of failing with an OSError."""
    cache, temporary = tmp_path / "cache", tmp_path / "tmp"
    temporary.mkdir()
    script = """
import json, sys
from pathlib import Path
from infinity_cloud.backends import exports
model = Path(sys.argv[1])
def build(out):
    (out / "verdict.json").write_text("{}")
    return {"built": True}
held = exports.cached_export(model, "fidelity", {"kernels": "here"}, build, "checking")
lacked = exports.cached_export(model, "fidelity", {"kernels": "elsewhere"}, build, "checking")
print(json.dumps([str(held), str(lacked)]))
"""
    env = {**os.environ, "INFINITY_CLOUD_CACHE": str(cache), "TMPDIR": str(temporary)}
    python = (sys.executable, "-c", script, str(tiny_embedder))
    made = subprocess.run(python, env=env, capture_output=True, encoding="utf-8", check=True)
    held_before = json.loads(made.stdout)[0]
    shutil.rmtree(json.loads(made.stdout)[1])  # the cache holds the one verdict only
    if os.geteuid() == 0:  # root writes through permissions: a read-only mount instead
        mounts = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        program: tuple[str, ...] = ("unshare", "-m", "sh", "-c", mounts, str(cache), *python)
    else:
        subprocess.run(["chmod", "-R", "a-w", str(cache)], check=True)
        program = python
    try:
        done = subprocess.run(program, env=env, capture_output=True, encoding="utf-8")
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(cache)], check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    held, lacked = json.loads(done.stdout)
    assert held == held_before  # served from the read-only cache, not built again
    assert Path(lacked).parent == temporary / "infinity-cloud-exports"
    assert (Path(lacked) / "manifest.json").is_file()
    assert done.stderr.count(f"the export cache {cache} is read-only") == 1, done.stderr
