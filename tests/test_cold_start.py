"""Importing the package and building the app must not import a backend or a cloud SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAKE, ROOT

from infinity_cloud.core.install_hint import install_command

HEAVY = ["torch", "transformers", "sentence_transformers", "modal", "boto3", "onnxruntime", "huggingface_hub",
         # tracing's SDK: only with --otlp-endpoint (server/tracing.py)
         "opentelemetry.sdk", "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http"]


def _imported_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_package_is_light():
    modules = _imported_after("import infinity_cloud; infinity_cloud.Engine; infinity_cloud.ModelSpec")
    assert not modules & set(HEAVY)


def test_app_and_cli_import_no_backend():
    code = (
        "from infinity_cloud.server.app import create_app\n"
        "from infinity_cloud.cli import app\n"
        "from infinity_cloud.engine import Engine\n"
        "create_app(Engine())"
    )
    assert not _imported_after(code) & set(HEAVY)


def test_fake_backend_serves_without_torch(tiny_embedder):
    # Block torch entirely: a backend that does not need it must still load and answer.
    code = f"""
import sys, asyncio
sys.modules['torch'] = None
sys.modules['transformers'] = None
from infinity_cloud import EmbedAsk, Engine, ModelSpec
async def main():
    async with Engine(ModelSpec(model_id={str(tiny_embedder)!r}, backend={FAKE!r})) as e:
        r = await e.embeddings(EmbedAsk(['hello']))
        print(r.embeddings.shape)
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "(1, 32)" in out.stdout


def test_missing_backend_names_the_extra(tiny_embedder, tmp_path):
    code = f"""
import sys, asyncio
sys.modules['torch'] = None
from infinity_cloud import EmbedAsk, Engine, ModelSpec
from infinity_cloud.core.errors import BackendUnavailableError
try:
    Engine(ModelSpec(model_id={str(tiny_embedder)!r})).load()
except BackendUnavailableError as exc:
    print(exc.message)
"""
    # An empty export cache: exports other tests made would let OpenVINO start without torch.
    env = {**os.environ, "INFINITY_CLOUD_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    # auto's first choice on a CPU, whose converter's extra needs torch (its CPU build first)
    assert install_command("export") in out.stdout, out.stdout + out.stderr


def _hub_cache(root: Path, repo: str, commit: str, ref: str | None = "main") -> Path:
    """The Hugging Face cache's layout for one snapshot (as `snapshot_download` leaves it)."""
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    if ref is not None:
        (folder / "refs").mkdir()
        (folder / "refs" / ref).write_text(commit)
    return snapshot


@pytest.mark.parametrize(("ref", "revision"), [("main", None), ("v1", "v1"), (None, "a" * 40)])
def test_a_model_in_the_hub_cache_is_found_as_the_hub_client_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ref: str | None, revision: str | None
) -> None:
    from huggingface_hub import constants, snapshot_download

    from infinity_cloud.models.model_source import _from_hub_cache

    snapshot = _hub_cache(tmp_path, "org/model", "a" * 40, ref)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    found = _from_hub_cache("org/model", revision)
    assert found == snapshot
    assert found == Path(snapshot_download("org/model", revision=revision, cache_dir=tmp_path,
                                           local_files_only=True))
    assert _from_hub_cache("org/other", revision) is None
    assert _from_hub_cache("org/model", "no-such-branch") is None
    assert _from_hub_cache("org/model", "../../models--org--model/snapshots/" + "a" * 40) is None


def test_resolving_a_model_does_not_import_the_hub_client():
    # The client (huggingface_hub.hf_api and its HTTP stack) took 0.45 s of every cold start.
    code = (
        "from infinity_cloud.core.config import DEFAULT_MODEL_ID\n"
        "from infinity_cloud.models.model_source import resolve_model_dir\n"
        "resolve_model_dir(DEFAULT_MODEL_ID)"  # the hub cache, then the installed package
    )
    assert "huggingface_hub.hf_api" not in _imported_after(code)
