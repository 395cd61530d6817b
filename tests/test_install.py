"""The README's own set-up command, run as written in a fresh venv on a copy of this tree (a
non-editable install, as a user gets it): the server it installs serves a model it has
never seen on the backend the README promises, and the installed package brings its
targets and templates inside its own namespace.

Slow (a venv and its installs, about a minute or two from pip's cache), so all of it runs
in one module-scoped venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, server_process

pytestmark = pytest.mark.slow

SERVE = "HF_HUB_OFFLINE=1 .venv/bin/infinity-cloud serve"


def readme_setup_command() -> str:
    """The README's first command, less its final `serve`: exactly what a user runs to set up."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Two commands", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    assert command.endswith(SERVE), f"the README's first command no longer ends with {SERVE!r}: {command}"
    return command.removesuffix(SERVE).strip().removesuffix("&&").strip()


def copy_tree(dest: Path) -> Path:
    """The files a clone would hold (tracked, plus new files not ignored), without any venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def readme_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv the README's set-up command makes, in a copy of this tree."""
    tree = copy_tree(tmp_path_factory.mktemp("clone"))
    # One retry, not pip's five with back-off, where PyTorch's index cannot be reached (.ci/run too).
    env = {**os.environ, "PIP_RETRIES": os.environ.get("PIP_RETRIES", "1")}
    done = subprocess.run(
        ["bash", "-c", readme_setup_command()], cwd=tree, capture_output=True, timeout=900, env=env,
        encoding="utf-8", errors="replace",  # pip's progress bars, whatever this process's locale
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tree / ".venv"


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder outside the source tree, so only the installed package is importable."""
    return tmp_path_factory.mktemp("elsewhere")


@pytest.fixture(scope="module")
def unseen_minilm(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of MiniLM with no export cached anywhere."""
    copy = tmp_path_factory.mktemp("unseen") / "minilm"
    shutil.copytree(minilm_dir, copy, ignore=shutil.ignore_patterns(".infinity-cloud"))
    return copy


@pytest.fixture(scope="module")
def readme_server(
    readme_venv: Path, unseen_minilm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    cache = tmp_path_factory.mktemp("fresh-export-cache")
    with server_process(
        "--model-id", str(unseen_minilm), "--served-model-name", "minilm",
        program=[str(readme_venv / "bin" / "infinity-cloud")],
        env={"INFINITY_CLOUD_CACHE": str(cache)}, log_path=log, timeout=300,
    ) as url:
        yield url, log


def test_readme_install_serves_an_unseen_model_on_openvino(readme_server: tuple[str, Path]) -> None:
    url, log = readme_server
    model = httpx.get(f"{url}/models").json()["data"][0]
    assert model["backend"] == "openvino", log.read_text(encoding="utf-8")[-3000:]
    assert "cannot serve" not in log.read_text(encoding="utf-8")  # no backend tried and dropped
    answer = httpx.post(f"{url}/embeddings", json={"input": ["hello", "world"]}, timeout=60).json()
    assert [len(d["embedding"]) for d in answer["data"]] == [384, 384]


def run_installed(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*args], cwd=cwd, capture_output=True, encoding="utf-8", errors="replace",
                          timeout=300, env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_build_local_finds_its_templates_in_a_new_folder(readme_venv: Path, elsewhere: Path) -> None:
    out = elsewhere / "not" / "yet" / "there"
    done = run_installed(readme_venv, elsewhere, "infinity-cloud", "build", "local", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "Dockerfile").is_file() and (out / "compose.yaml").is_file()


def test_build_modal_finds_its_templates(readme_venv: Path, elsewhere: Path) -> None:
    out = elsewhere / "modal-app"
    done = run_installed(readme_venv, elsewhere, "infinity-cloud", "build", "modal", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "app = modal.App" in (out / "modal_app.py").read_text(encoding="utf-8")
    # Its slow step (asking the index, seconds to a minute) is said as it starts and ends.
    assert re.search(r"resolving \d+ requirements for Python .* with the package index \.\.\.", done.stderr)
    assert re.search(r"with the package index: done in [\d.]+s", done.stderr)


@pytest.mark.parametrize("name", ["targets", "templates"])
def test_no_generic_top_level_names_are_installed(readme_venv: Path, elsewhere: Path, name: str) -> None:
    python = str(readme_venv / "bin" / "python")
    done = run_installed(readme_venv, elsewhere, python, "-c", f"import {name}")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr
    done = run_installed(readme_venv, elsewhere, python, "-c", f"import infinity_cloud.{name}")
    assert done.returncode == 0, done.stderr



def test_readme_install_takes_no_gpu_libraries(readme_venv: Path, elsewhere: Path) -> None:
    """The README asks PyTorch's CPU index for the `+cpu` build (PyPI's Linux torch is the CUDA
    build, 2.8 GB of NVIDIA wheels): nothing of CUDA's lands in the venv. (Here pip may find
    that wheel in a local folder; the pin to `+cpu` is what makes a public machine take it.)"""
    cpu_index = r'pip install "torch==[\d.]+\+cpu" --extra-index-url https://download\.pytorch\.org/whl/cpu '
    assert re.search(cpu_index, readme_setup_command())
    done = run_installed(readme_venv, elsewhere, str(readme_venv / "bin" / "pip"), "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    installed = {p["name"].lower(): p["version"] for p in json.loads(done.stdout)}
    assert installed["torch"].endswith("+cpu"), installed["torch"]
    assert not [name for name in installed if name.startswith(("nvidia-", "triton"))]
