"""Every image variant's requirements resolve, from the package index and wheels only, for
that image's own Python, CPU and C library (not this venv's): `build` resolves them, and the
pins it writes are resolved again here, independently, with pip for the platform the image
really runs. With CI set, an unreachable index fails these tests rather than skipping them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.targets import container, resolution
from infinity_cloud.targets.platforms import DEBIAN_GLIBC, ImagePlatform, this_machine_arch

runner = CliRunner()
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
NEURON = ImagePlatform("3.10", "x86_64", (2, 35), shipped=(("numpy", ">=1.22.2,<=1.25.2"),))


@pytest.fixture(scope="module", autouse=True)
def index(request: pytest.FixtureRequest) -> None:
    """Builds ask the index here (the rest of the suite builds without it)."""
    patch = pytest.MonkeyPatch()
    patch.setenv(resolution.RESOLVE_ENV, "1")
    resolution._resolve.cache_clear()
    try:
        resolution.resolve(["packaging"], ImagePlatform("3.12", "x86_64"))
    except resolution.IndexUnreachable as exc:
        patch.undo()
        if os.environ.get("CI"):
            pytest.fail(f"CI reaches the package index, but pip could not: {exc}")
        pytest.skip(f"the package index is not reachable here: {exc}")
    request.addfinalizer(patch.undo)


def build(target: str, out: Path, *args: str) -> str:
    result = runner.invoke(cli, ["build", target, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return result.output


def pins(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def resolves(requirements: list[str], platform: ImagePlatform) -> dict[str, str]:
    """The pins, exactly, install together there (pip's own resolver, with dependencies)."""
    assert requirements and all("==" in r for r in requirements), requirements
    return resolution.resolve(requirements, platform)


def modal_pins(source: str) -> list[str]:
    block = source.split("# The package's dependencies", 1)[1].split(")", 1)[0]
    return re.findall(r'"([^"]+==[^"]+)"', block)


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_local_image(tmp_path: Path, tiny_embedder: Path, gpu: bool) -> None:
    build("local", tmp_path, "--model-id", str(tiny_embedder), *(["--gpu"] if gpu else []))
    resolves(pins(tmp_path / "requirements.txt"), ImagePlatform("3.11", this_machine_arch(), DEBIAN_GLIBC))


@pytest.mark.parametrize("gpu", [[], ["--gpu", "L4"]], ids=["cpu", "gpu"])
def test_modal_image(tmp_path: Path, tiny_embedder: Path, gpu: list[str]) -> None:
    build("modal", tmp_path, "--model-id", str(tiny_embedder), *gpu)
    found = modal_pins((tmp_path / "modal_app.py").read_text())
    resolves(found, ImagePlatform(PY, "x86_64", DEBIAN_GLIBC))


@pytest.mark.parametrize(("args", "arch"), [
    (["--instance-type", "ml.g5.xlarge"], "x86_64"),
    (["--instance-type", "ml.c7i.xlarge"], "x86_64"),
    (["--serverless"], "x86_64"),
    (["--instance-type", "ml.c7g.xlarge"], "aarch64"),  # Graviton: an arm64 image
], ids=["gpu", "cpu", "serverless", "graviton"])
def test_sagemaker_image(tmp_path: Path, tiny_embedder: Path, args: list[str], arch: str) -> None:
    build("sagemaker", tmp_path, "--model-id", str(tiny_embedder), *args)
    platform = ImagePlatform("3.11", arch, DEBIAN_GLIBC)
    resolves(pins(tmp_path / "requirements.txt"), platform)
    if (tmp_path / "requirements-serving.txt").exists():
        resolves(pins(tmp_path / "requirements-serving.txt"), platform)
    expected = "arm64" if arch == "aarch64" else "amd64"
    assert f"Build it for linux/{expected}" in (tmp_path / "Dockerfile").read_text()


def test_inferentia2_image_keeps_the_neuron_images_python_and_packages(tmp_path: Path) -> None:
    """The Neuron image runs Python 3.10 with the Neuron SDK's own numpy, torch and
    transformers: the image's pins install on 3.10 around them, which the building venv's
    (typer and fastapi need 3.11 there) do not."""
    output = build("sagemaker", tmp_path, "--model-id", "BAAI/bge-small-en-v1.5", "--instance-type",
                   "ml.inf2.xlarge", "--backend", "neuron", "--batch-buckets", "1", "--length-buckets", "128")
    found = pins(tmp_path / "requirements.txt")
    names = {re.split(r"[\[=]", pin)[0] for pin in found}
    assert not names & {"numpy", "torch", "transformers", "tokenizers", "huggingface-hub"}
    kept = pins(tmp_path / "constraints.txt")
    assert "numpy>=1.22.2,<=1.25.2" in kept and "transformers==4.55.4" in kept
    platform = ImagePlatform("3.10", "x86_64", (2, 35), shipped=tuple(
        (re.split(r"[=<>]", line, maxsplit=1)[0], line[len(re.split(r"[=<>]", line, maxsplit=1)[0]):])
        for line in kept
    ))
    resolves(found, platform)
    dockerfile = (tmp_path / "Dockerfile").read_text()
    assert "-c /opt/program/constraints.txt" in dockerfile and "py310-sdk2.26.0" in dockerfile
    # What the building venv has would not install there.
    tested = container.pinned_requirements(())
    with pytest.raises(resolution.Unresolvable, match=r"Python 3\.10"):
        resolution.resolve([p for p in tested if not p.startswith("numpy")], NEURON)
    assert "typer 0.29.1 in the image, not" in " ".join(output.split()) or "typer" not in tested[0]


@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_lambda_image(tmp_path: Path, tiny_embedder: Path, arch: str) -> None:
    build("aws-lambda", tmp_path, "--model-id", str(tiny_embedder), "--architecture", arch)
    platform = ImagePlatform("3.12", "aarch64" if arch == "arm64" else "x86_64", (2, 34))
    found = pins(tmp_path / "requirements.txt")
    assert any(p.startswith("onnxruntime==") for p in found) and any(p.startswith("mangum==") for p in found)
    resolves(found, platform)


def test_lambda_arm64_with_openvino_is_refused_at_build_with_the_alternatives(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    """openvino has no aarch64 wheel for Lambda's Python 3.12 at the version the exports are
    made with: refused before anything is exported, naming what works instead."""
    result = runner.invoke(cli, ["build", "aws-lambda", "--out", str(tmp_path), "--model-id",
                                 str(tiny_embedder), "--architecture", "arm64", "--backend", "openvino"])
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    version = container.installed_version("openvino")
    assert f"openvino=={version} has no wheel for Python 3.12 on linux/aarch64" in message
    assert "--backend onnx" in message and "--architecture x86_64" in message
    assert not (tmp_path / "exports").exists()  # refused before exporting


def test_without_the_index_a_build_says_its_pins_are_unchecked(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index (offline): the tested versions, and a warning that names the platform."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    resolution._resolve.cache_clear()
    container._warn_unchecked.cache_clear()
    try:
        result = runner.invoke(cli, ["build", "sagemaker", "--out", str(tmp_path), "--model-id",
                                     str(tiny_embedder), "--instance-type", "ml.c7i.xlarge"])
    finally:
        resolution._resolve.cache_clear()
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "could not ask the package index" in output and "Python 3.11 on linux/x86_64" in output
    assert f"typer=={container.installed_version('typer')}" in pins(tmp_path / "requirements.txt")
