"""Every image variant's requirements resolve, from the package index and wheels only, for
that image's own Python, CPU and C library (not this venv's): `build` resolves them, and the
pins it writes are resolved again here, independently, with pip for the platform the image
really runs. With CI set, an unreachable index fails these tests rather than skipping them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.targets import container, resolution
from infinity_cloud.targets.platforms import DEBIAN_GLIBC, ImagePlatform, this_machine_arch

runner = CliRunner()
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
NEURON = ImagePlatform("3.10", "x86_64", (2, 35), shipped=(("numpy", ">=1.22.2,<=1.25.2"),))


@pytest.fixture(scope="module")
def index() -> None:
    """The index answers pip here, or (CI) the test fails rather than skips."""
    try:
        resolution.resolve(["packaging"], ImagePlatform("3.12", "x86_64"))
    except resolution.IndexUnreachable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI reaches the package index, but pip could not: {exc}")
        pytest.skip(f"the package index is not reachable here: {exc}")


# Each image variant: the build's arguments, and the platform its image really installs on
# (written out here, not taken from the code under test).
LAMBDA_X86, LAMBDA_ARM = ImagePlatform("3.12", "x86_64", (2, 34)), ImagePlatform("3.12", "aarch64", (2, 34))
VARIANTS: dict[str, tuple[list[str], ImagePlatform | None]] = {
    "local-cpu": (["local"], ImagePlatform("3.11", this_machine_arch(), DEBIAN_GLIBC)),
    "local-gpu": (["local", "--gpu"], ImagePlatform("3.11", this_machine_arch(), DEBIAN_GLIBC)),
    "modal-cpu": (["modal"], ImagePlatform(PY, "x86_64", DEBIAN_GLIBC)),
    "modal-gpu": (["modal", "--gpu", "L4"], ImagePlatform(PY, "x86_64", DEBIAN_GLIBC)),
    "sagemaker-gpu": (["sagemaker", "--instance-type", "ml.g5.xlarge"], ImagePlatform("3.11", "x86_64")),
    "sagemaker-cpu": (["sagemaker", "--instance-type", "ml.c7i.xlarge"], ImagePlatform("3.11", "x86_64")),
    "sagemaker-serverless": (["sagemaker", "--serverless"], ImagePlatform("3.11", "x86_64")),
    "sagemaker-graviton": (["sagemaker", "--instance-type", "ml.c7g.xlarge"],  # arm64
                           ImagePlatform("3.11", "aarch64")),
    "sagemaker-inferentia2": (["sagemaker", "--instance-type", "ml.inf2.xlarge", "--backend", "neuron",
                               "--batch-buckets", "1", "--length-buckets", "128"], None),
    "lambda-x86_64": (["aws-lambda", "--architecture", "x86_64"], LAMBDA_X86),
    "lambda-arm64": (["aws-lambda", "--architecture", "arm64"], LAMBDA_ARM),
    "lambda-arm64-openvino": (["aws-lambda", "--architecture", "arm64", "--backend", "openvino"], None),
    # `build local`'s image beside its manifests: the GPU one is local-gpu's.
    "kubernetes-cpu": (["kubernetes"], ImagePlatform("3.11", this_machine_arch(), DEBIAN_GLIBC)),
    # --cuda 12: torch from the cu126 index (not resolvable from here), the rest as local-gpu's
    # (the same pins are resolved once).
    "kubernetes-gpu-cuda12": (["kubernetes", "--gpu", "L4", "--cuda", "12"],
                              ImagePlatform("3.11", this_machine_arch(), DEBIAN_GLIBC)),
}


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    """Threads that wait on pip (its time is mostly the index's answers, not this CPU's): one
    per build, taken by a resolution as a build finishes. No more pip processes at once than
    builds: more made each slower on a busy 2-core machine, past `resolution`'s time limit."""
    with ThreadPoolExecutor(len(VARIANTS)) as threads:
        yield threads


# Resolutions that need no build: asked while the builds run (`early`), checked by their tests.
CPU_EXTRAS = ["openvino", "onnx"]


def declared(extra: str) -> list[str]:
    """The package's core requirements and the extra's, torch included, as declared."""
    import importlib.metadata

    from packaging.requirements import Requirement

    reqs = [Requirement(line) for line in importlib.metadata.requires("infinity-cloud") or []]
    return [f"{r.name}{r.specifier}" for r in reqs if not r.marker or r.marker.evaluate({"extra": extra})]


def building_venv_requirements() -> list[str]:
    """What the building venv has (numpy aside): what would not install in the Neuron image."""
    return [p for p in container.pinned_requirements(()) if not p.startswith("numpy")]


@pytest.fixture(scope="module")
def early(
    started: dict[str, Future[tuple[Path, subprocess.CompletedProcess[str]]]], pool: ThreadPoolExecutor
) -> Iterator[dict[str, Future[dict[str, str]]]]:
    """Asked after the builds, to run as the first of them finish."""
    asked = {extra: pool.submit(resolution.resolve, declared(extra), ImagePlatform("3.11", "x86_64"))
             for extra in CPU_EXTRAS}
    asked["neuron"] = pool.submit(resolution.resolve, building_venv_requirements(), NEURON)
    ASKING.extend(asked.values())
    yield asked
    wait(asked.values())


# Resolutions this process runs in the background (`early`), while they run.
ASKING: list[Future[dict[str, str]]] = []


@pytest.fixture(scope="module")
def started(
    index: None, tmp_path_factory: pytest.TempPathFactory, tiny_embedder: Path, pool: ThreadPoolExecutor
) -> dict[str, Future[tuple[Path, subprocess.CompletedProcess[str]]]]:
    """Every variant built by the CLI, each in its own process, all at once (pip spends its
    time waiting on the index); each one's outcome as it finishes."""
    env = {**os.environ, resolution.RESOLVE_ENV: "1", "HF_HUB_OFFLINE": "1"}

    def build(name: str, args: list[str], out: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
        model = "BAAI/bge-small-en-v1.5" if "inferentia2" in name else str(tiny_embedder)
        command = [sys.executable, "-m", "infinity_cloud", "build", args[0], "--out", str(out),
                   "--model-id", model, *args[1:]]
        return out, subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   encoding="utf-8", errors="replace", timeout=600)

    return {name: pool.submit(build, name, args, tmp_path_factory.mktemp(name))
            for name, (args, _) in VARIANTS.items()}


@pytest.fixture(scope="module")
def resolved(
    started: dict[str, Future[tuple[Path, subprocess.CompletedProcess[str]]]], pool: ThreadPoolExecutor,
    early: dict[str, Future[dict[str, str]]],
) -> dict[str, dict[str, str]]:
    """The written pins of each variant resolved again, independently, for its platform: each
    as soon as its variant is built, while the others still build."""
    asked: dict[tuple[tuple[str, ...], ImagePlatform], Future[dict[str, str]]] = {}  # the same pins, once
    jobs: dict[str, Future[dict[str, str]]] = {}
    waiting = {started[name]: (name, platform) for name, (_, platform) in VARIANTS.items() if platform}
    for build in as_completed(waiting):
        name, platform = waiting[build]
        out, result = build.result()
        if result.returncode != 0:
            continue
        for file, found in written_pins(name, out).items():
            key = (tuple(found), platform)
            if key not in asked:
                asked[key] = pool.submit(resolves, found, platform)
            jobs[f"{name}:{file}"] = asked[key]
    return {key: job.result() for key, job in jobs.items()}


@pytest.fixture(scope="module")
def builds(
    started: dict[str, Future[tuple[Path, subprocess.CompletedProcess[str]]]]
) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    return {name: build.result() for name, build in started.items()}


def written_pins(name: str, out: Path) -> dict[str, list[str]]:
    if name.startswith("modal"):
        return {"app": modal_pins((out / "modal_app.py").read_text())}
    if name.startswith("kubernetes"):  # the image beside the manifests
        out = out / "image"
    files = ("requirements.txt", "requirements-serving.txt")
    return {file: pins(out / file) for file in files if (out / file).exists()}


def pins(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def resolves(requirements: list[str], platform: ImagePlatform) -> dict[str, str]:
    """The pins, exactly, install together there (pip's own resolver, with dependencies)."""
    assert requirements and all("==" in r for r in requirements), requirements
    return resolution.resolve(requirements, platform)


def modal_pins(source: str) -> list[str]:
    block = source.split("# The package's dependencies", 1)[1].split(")", 1)[0]
    return re.findall(r'"([^"]+==[^"]+)"', block)


@pytest.mark.parametrize("name", [n for n, (_, p) in VARIANTS.items() if p is not None])
def test_each_images_pins_resolve_for_its_own_platform(
    name: str, builds: dict[str, tuple[Path, subprocess.CompletedProcess[str]]],
    resolved: dict[str, dict[str, str]],
) -> None:
    out, result = builds[name]
    assert result.returncode == 0, result.stdout
    files = written_pins(name, out)
    assert files and all(f"{name}:{file}" in resolved for file in files)
    if name.startswith("lambda"):
        found = files["requirements.txt"]
        assert {p.split("==")[0] for p in found} >= {"onnxruntime", "mangum"}
    if name.startswith("sagemaker"):
        expected = "arm64" if "graviton" in name else "amd64"
        assert f"Build it for linux/{expected}" in (out / "Dockerfile").read_text()


def test_inferentia2_image_keeps_the_neuron_images_python_and_packages(
    builds: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], early: dict[str, Future[dict[str, str]]]
) -> None:
    """The Neuron image runs Python 3.10 with the Neuron SDK's own numpy, torch and
    transformers: the image's pins install on 3.10 around them, which the building venv's
    (typer and fastapi need 3.11 there) do not."""
    out, result = builds["sagemaker-inferentia2"]
    assert result.returncode == 0, result.stdout
    found = pins(out / "requirements.txt")
    names = {re.split(r"[\[=]", pin)[0] for pin in found}
    assert not names & {"numpy", "torch", "transformers", "tokenizers", "huggingface-hub"}
    kept = pins(out / "constraints.txt")
    assert "numpy>=1.22.2,<=1.25.2" in kept and "transformers==4.55.4" in kept
    shipped = tuple((re.split(r"[=<>]", line, maxsplit=1)[0], re.sub(r"^[\w.-]+", "", line)) for line in kept)
    resolves(found, ImagePlatform("3.10", "x86_64", (2, 35), shipped=shipped))
    dockerfile = (out / "Dockerfile").read_text()
    assert "-c /opt/program/constraints.txt" in dockerfile and "py310-sdk2.26.0" in dockerfile
    # What the building venv has (building_venv_requirements) would not install there.
    with pytest.raises(resolution.Unresolvable, match=r"Python 3\.10"):
        early["neuron"].result()


def test_lambda_arm64_with_openvino_is_refused_at_build_with_the_alternatives(
    builds: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]
) -> None:
    """openvino has no aarch64 wheel for Lambda's Python 3.12 at the version the exports are
    made with: refused before anything is exported, naming what works instead."""
    out, result = builds["lambda-arm64-openvino"]
    assert result.returncode == 2, result.stdout
    message = " ".join(result.stdout.split())
    version = container.installed_version("openvino")
    assert f"openvino=={version} has no wheel for Python 3.12 on linux/aarch64" in message
    assert "--backend onnx" in message and "--architecture x86_64" in message
    assert not (out / "exports").exists()  # refused before exporting


def test_without_the_index_a_build_says_its_pins_are_unchecked(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index (offline): the tested versions, and a warning that names the platform."""
    wait(ASKING)  # they ask the index from this process: not while it is made unreachable here
    monkeypatch.setenv(resolution.RESOLVE_ENV, "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    resolution.forget()
    container._warn_unchecked.cache_clear()
    try:
        result = runner.invoke(cli, ["build", "sagemaker", "--out", str(tmp_path), "--model-id",
                                     str(tiny_embedder), "--instance-type", "ml.c7i.xlarge"])
    finally:
        resolution.forget()
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "could not ask the package index" in output and "Python 3.11 on linux/x86_64" in output
    assert f"typer=={container.installed_version('typer')}" in pins(tmp_path / "requirements.txt")


@pytest.mark.parametrize("extra", CPU_EXTRAS)
def test_a_cpu_backends_extra_installs_no_torch(early: dict[str, Future[dict[str, str]]], extra: str) -> None:
    """`pip install 'infinity-cloud[openvino]'` on a Linux machine pulls no torch (from PyPI,
    the CUDA build with 2.8 GB of NVIDIA wheels): it serves models that ship their exports;
    the `export` extra is what converts the others, and brings torch. (`early` resolved
    `declared(extra)` for Python 3.11 on linux/x86_64.)"""
    from packaging.requirements import Requirement

    assert {"onnx", "torch", "transformers"} <= {Requirement(r).name for r in declared("export")}
    wanted = declared(extra)
    assert extra.replace("onnx", "onnxruntime") in {Requirement(r).name for r in wanted}
    found = early[extra].result()
    assert not {name for name in found if name == "torch" or name.startswith(("nvidia-", "triton"))}, found
