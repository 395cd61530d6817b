"""The ONNX Runtime and OpenVINO backends against torch float32, their cached exports
(reuse, separate artefacts per option, corruption, a folder's own model.onnx), serving
without torch, `backend auto` and its fallbacks, the `dtype auto` fidelity check, and the
errors a bad backend/dtype/device combination gives.

The tiny models live in this module's own folder (copies of the session's embedders, and
cross-encoders built here), so their exports, cached next to them, never touch the shared
tiny models; tests that need a clean cache point INFINITY_CLOUD_CACHE at their tmp_path.
The real MiniLM uses its default cache (next to the packaged model), reused across runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cosines, holds_or_says_so, serve_in_process, spec_of, unwaited

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.backends import exports, onnx_backend, onnx_export, openvino_backend, openvino_int8
from infinity_cloud.core.content_digest import file_record
from infinity_cloud.core.errors import BackendUnavailableError, ConfigError, ModelLoadError
from infinity_cloud.core.hardware import cpu_has_fast_bf16, has_nvidia_gpu
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.engine.asks import ClassifyAsk, EmbedAsk, RerankAsk
from infinity_cloud.numerics import fidelity

LONG = " ".join(["the quick brown fox jumps over the lazy dog while people read a story"] * 40)
TEXTS = [
    "hello world",
    "What is the capital of France?",
    LONG,  # past every model's limit (128 tokens for the tiny ones, 256 for MiniLM)
    "Café naïve résumé; 日本語のテキスト, русский текст 🙂🚀",
    "x",
    "a word repeated " * 12,
]
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "x", LONG, "Berlin ist die Hauptstadt 🇩🇪", "a cat on a mat"]

# name -> (builder, options, capability); builders are model_factory's, or `build_cross_encoder`.
TINY: dict[str, tuple[str, dict[str, Any], str]] = {
    "bert": ("bert_embedder", {}, "embed"),
    "roberta": ("roberta_embedder", {}, "embed"),
    "qwen2": ("decoder_embedder", {}, "embed"),
    "reranker": ("cross_encoder", {"labels": ("score",)}, "rerank"),
    "classifier": ("cross_encoder", {"labels": ("negative", "neutral", "positive")}, "classify"),
}
CAPABILITY = {**{name: cap for name, (_, _, cap) in TINY.items()}, "minilm": "embed"}

CONFIGS = {
    "onnx-fp32": ("onnx", "float32"),
    "onnx-int8": ("onnx", "int8"),
    "ov-fp32": ("openvino", "float32"),
    "ov-bf16": ("openvino", "bfloat16"),
    "ov-auto": ("openvino", "auto"),
    "ov-int8": ("openvino", "int8"),
}
# OpenVINO int8 is built by measuring (a few quantisations each): an embedder and a scorer.
# ONNX int8 on every architecture but one of the two cross-encoders: the reranker and the
# classifier are the same graph (BertForSequenceClassification, drawn alike, one output or
# three), so the classifier's int8 checks the reranker's quantisation; its scores in int8 are
# checked on OpenVINO, and its head on every other precision (40 s of CI, checking nothing new).
INT8 = {"ov-int8": ("bert", "reranker"), "onnx-int8": ("bert", "roberta", "qwen2", "classifier")}
MATRIX = [(model, config) for model in TINY for config in CONFIGS if model in INT8.get(config, TINY)] + [
    ("minilm", config) for config in ("onnx-fp32", "ov-auto")  # onnx int8 on it: 36 s of CI
]
# Embeddings: the worst allowed 1 - cosine per row. Scores: the worst allowed error as a
# share of the reference scores' range (float32 backends agree to ~1e-7 on these models).
COSINE_GAP = {"float32": 1e-6, "bfloat16": 1e-3, "int8": 2e-2}
SCORE_TOL = {"float32": 1e-4, "bfloat16": 4e-2, "int8": 8e-2}


# -- helpers -------------------------------------------------------------------------------


def fresh_copy(source: Path, target: Path) -> Path:
    """The model folder without its cached exports, at a new path."""
    return Path(shutil.copytree(source, target, ignore=shutil.ignore_patterns(".infinity-cloud")))


async def run(path: Path, **spec: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """The model's outputs on the fixed texts (embeddings, raw rerank scores or raw class
    logits in label order) and its describe() facts. This module's models keep their exports
    beside them (`export_into_folder`), where its tests look, unless a test says otherwise."""
    spec.setdefault("export_into_folder", True)
    async with Engine(ModelSpec(model_id=str(path), **spec)) as engine:
        facts = engine.describe()[0]
        capability = facts["capabilities"][0]
        if capability == "embed":
            out = (await engine.embeddings(EmbedAsk(TEXTS))).embeddings
        elif capability == "rerank":
            result = await engine.rerank(RerankAsk(QUERY, DOCS, raw_scores=True))
            out = np.zeros((len(DOCS), 1), dtype=np.float32)
            for doc in result.results:
                out[doc.index, 0] = doc.score
        else:
            result = await engine.classify(ClassifyAsk(TEXTS, raw_scores=True))
            out = np.array([[dict(row)[label] for label in facts["labels"]] for row in result.labels])
    return out, facts


def assert_close(got: np.ndarray, want: np.ndarray, capability: str, dtype: str) -> None:
    assert got.shape == want.shape
    assert np.isfinite(got).all()
    if capability == "embed":
        cos = cosines(got, want)
        assert 1 - cos.min() <= COSINE_GAP[dtype], cos
    else:
        spread = float(np.ptp(want))
        assert spread > 0.1, want  # scores that differ between inputs, or nothing is compared
        error = float(np.abs(got - want).max())
        assert error <= SCORE_TOL[dtype] * spread, (error, got, want)


def build_cross_encoder(path: Path, labels: tuple[str, ...]) -> Path:
    """A tiny BertForSequenceClassification drawn with a wider init than model_factory's,
    whose logits are all ~0: here scores must vary between inputs, or a reduced precision's
    error could not be told from the signal."""
    from model_factory import _seeded, _tiny_bert_config, build_wordpiece_tokenizer
    from transformers import AutoTokenizer, BertForSequenceClassification

    build_wordpiece_tokenizer(path)
    names = {} if len(labels) == 1 else {
        "id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}
    }
    config = _tiny_bert_config(
        len(AutoTokenizer.from_pretrained(str(path))), num_labels=len(labels), initializer_range=0.2, **names
    )
    with _seeded():
        BertForSequenceClassification(config).save_pretrained(str(path))
    return path


def counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Any]:
    """Record every call of `owner.name` (still calling through)."""
    calls: list[Any] = []
    real = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def forbid_export(monkeypatch: pytest.MonkeyPatch) -> None:
    def export(*_: Any, **__: Any) -> None:
        raise AssertionError("the model was exported to ONNX again")

    monkeypatch.setattr(onnx_export, "export_onnx", export)


def exported(cache: Path, kind: str) -> list[Path]:
    return sorted(p for p in cache.glob(f"{kind}-*") if p.is_dir() and ".building-" not in p.name)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(build_model: Callable[..., Path], minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """This module's copies of the models (MiniLM too: not in site-packages), exports next to them
    (`run`); the user cache a test's subprocess falls back to is the module's own, not ~/.cache."""
    root = tmp_path_factory.mktemp("backend-models")
    paths = {
        name: build_cross_encoder(root / name, **opts) if kind == "cross_encoder"
        else fresh_copy(build_model(kind, **opts), root / name)
        for name, (kind, opts, _) in TINY.items()
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(exports.CACHE_ENV, raising=False)
        patch.setenv("XDG_CACHE_HOME", str(root / "user-cache"))
        yield {**paths, "minilm": fresh_copy(minilm_dir, root / "minilm")}


@pytest.fixture(scope="module")
def references() -> dict[str, np.ndarray]:
    return {}


@pytest.fixture
def reference(models: dict[str, Path], references: dict[str, np.ndarray]):
    """torch float32 outputs of a model, computed once per module."""

    async def get(name: str) -> np.ndarray:
        if name not in references:
            references[name], _ = await run(models[name], backend="torch", dtype="float32")
        return references[name]

    return get


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty export cache for this test only."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(exports.CACHE_ENV, str(folder))
    return folder


# -- 1. every backend and precision against torch float32 -----------------------------------


@pytest.mark.parametrize(("model", "config"), MATRIX, ids=[f"{m}-{c}" for m, c in MATRIX])
async def test_backend_matches_torch_float32(
    models, reference, model: str, config: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend, dtype = CONFIGS[config]
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        got, facts = await run(models[model], backend=backend, dtype=dtype)
    assert facts["backend"] == backend
    assert facts["device"] == "cpu"
    if dtype != "auto":
        assert facts["dtype"] == dtype
    else:  # bf16 where the CPU has it, unless the fidelity check sent it back to float32
        assert facts["dtype"] in (("bfloat16", "float32") if cpu_has_fast_bf16() else ("float32",))
    # int8, asked for by name, is served even where this CPU's kernels lose too much: then
    # the product must say so, which is what is tested there.
    if facts["dtype"] != "int8" or holds_or_says_so(facts, caplog):
        assert_close(got, await reference(model), CAPABILITY[model], facts["dtype"])


async def test_the_int8_model_is_quantised(models) -> None:
    """int8 is really a quantised graph (not float32 under another name)."""
    import onnx

    await run(models["bert"], backend="onnx", dtype="int8")
    await run(models["bert"], backend="onnx", dtype="float32")
    ops, facts = {}, {}
    for folder in exported(models["bert"] / ".infinity-cloud", "onnxruntime"):
        graph = onnx.load(str(folder / onnx_backend.OPTIMIZED_FILE)).graph
        facts[exports.export_metadata(folder)["dtype"]] = exports.export_metadata(folder)
        ops[exports.export_metadata(folder)["dtype"]] = {node.op_type for node in graph.node}
    # Built accuracy-aware: measured on held-out texts, most layers still int8.
    assert facts["int8"]["held_out_agreement"] >= fidelity.MIN_AGREEMENT["int8"]
    assert facts["int8"]["int8_layers"] > len(facts["int8"]["float32_layers"])
    assert {"DynamicQuantizeLinear", "MatMulInteger"} & ops["int8"] or "DynamicQuantizeMatMul" in ops["int8"]
    assert not any("Quant" in op or "Integer" in op for op in ops["float32"])


# -- 2. export caching ----------------------------------------------------------------------


async def test_exports_are_cached_per_option_and_honour_the_cache_variable(
    models, reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fresh_copy(models["bert"], tmp_path / "bert")
    cache = tmp_path / "cache"
    monkeypatch.setenv(exports.CACHE_ENV, str(cache))
    onnx_exports = counting(monkeypatch, onnx_export, "export_onnx")
    optimisations = counting(monkeypatch, onnx_backend, "_optimize")
    conversions = counting(monkeypatch, openvino_backend.ov, "save_model")

    await run(model, backend="onnx", dtype="float32")
    assert (len(onnx_exports), len(optimisations)) == (1, 1)
    assert len(exported(cache, "onnx")) == 1 and len(exported(cache, "onnxruntime")) == 1
    assert not (model / ".infinity-cloud").exists()  # the variable wins over "next to the model"

    forbid_export(monkeypatch)  # a second load must not export again
    got, _ = await run(model, backend="onnx", dtype="float32")
    assert len(optimisations) == 1
    assert_close(got, await reference("bert"), "embed", "float32")

    await run(model, backend="onnx", dtype="int8")  # a new option: its own artefact
    assert len(optimisations) == 2
    assert len(exported(cache, "onnx")) == 1 and len(exported(cache, "onnxruntime")) == 2
    await run(model, backend="onnx", dtype="int8")
    assert len(optimisations) == 2

    await run(model, backend="openvino", dtype="float32")  # from the same ONNX export
    await run(model, backend="openvino", dtype="bfloat16")  # the same IR, another precision
    assert len(conversions) == 1 and len(exported(cache, "openvino")) == 1


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by its relative path, with its content."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
async def test_without_the_cache_variable_exports_go_to_the_user_cache_not_the_model_folder(
    models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Serving a model folder once grew it five times over (MiniLM: 92 MB, then 454 MB with its
    ONNX, IR and compiled blobs): by default its exports go to the user cache, keyed by its digest."""
    monkeypatch.delenv(exports.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    model = fresh_copy(models["bert"], tmp_path / "bert")
    before = folder_files(model)
    await run(model, backend=backend, dtype="float32", export_into_folder=False)
    assert folder_files(model) == before  # not a byte written into the user's folder
    user = tmp_path / "user" / "infinity-cloud" / "exports"
    assert exports.verify(exported(user, "onnxruntime" if backend == "onnx" else "openvino")[0])
    if backend == "openvino":  # its compiled blobs too
        assert list(user.glob(f"openvino-*/{exports.MACHINE_CACHE}/*/*.blob"))


async def test_export_into_folder_puts_the_exports_next_to_the_model(
    models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(exports.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    model = fresh_copy(models["bert"], tmp_path / "bert")
    onnx_exports = counting(monkeypatch, onnx_export, "export_onnx")
    await run(model, backend="onnx", dtype="float32", export_into_folder=True)
    assert not (tmp_path / "user").exists()
    assert len(onnx_exports) == 1
    assert len(exported(model / ".infinity-cloud", "onnx")) == 1
    assert exports.verify(exported(model / ".infinity-cloud", "onnxruntime")[0])

    # The folder moved elsewhere (with its exports) is the same model: nothing re-exported.
    moved = tmp_path / "moved"
    model.rename(moved)
    await run(moved, backend="onnx", dtype="float32")
    assert len(onnx_exports) == 1

    # New weights (changed bytes in the last tensor) are a new model: exported again.
    weights = moved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = bytes(4)
    weights.write_bytes(bytes(data))
    await run(moved, backend="onnx", dtype="float32")
    assert len(onnx_exports) == 2


async def test_openvino_keeps_the_blobs_of_the_configurations_it_compiled_last(
    models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A blob folder per configuration any start compiled grew mpnet's cache to 2.1 GB: two
    starts in other configurations leave only the second's two (its streams' and its lone
    batches'), and the load says where its export is and how large."""
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path / "cache"))
    model = fresh_copy(models["bert"], tmp_path / "bert")

    def blob_configs() -> set[str]:
        blobs = (tmp_path / "cache").glob(f"openvino-*/{exports.MACHINE_CACHE}/*/*.blob")
        return {b.parent.name for b in blobs}

    # Another shape cache is another configuration (as another precision or thread count is).
    await run(model, backend="openvino", dtype="float32", backend_options={"shape_cache_entries": 128})
    first = blob_configs()
    assert len(first) == 2  # THROUGHPUT and LATENCY
    with caplog.at_level(logging.INFO, logger="infinity_cloud"):
        await run(model, backend="openvino", dtype="float32", backend_options={"shape_cache_entries": 64})
    second = blob_configs()
    assert len(second) == 2 and second.isdisjoint(first)
    (export,) = exported(tmp_path / "cache", "openvino")
    assert f"its export {export} (" in caplog.text and "of which compiled blobs" in caplog.text


# -- 3. corrupted exports are rebuilt -------------------------------------------------------


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _overwrite(file: Path) -> None:
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\x00garbage\xff" * 8
    file.write_bytes(bytes(data))


def _garbage_with_a_matching_manifest(file: Path) -> None:
    """Passes verification, so only the runtime's failure to load it can catch it."""
    file.write_bytes(b"this is not a model" * 100)
    manifest_file = file.parent / exports.MANIFEST
    manifest = json.loads(manifest_file.read_text())
    manifest["files"][file.name] = file_record(file)
    manifest_file.write_text(json.dumps(manifest))


VERIFY, LOAD = "incomplete or corrupt", "does not load"  # which check catches it
CORRUPTIONS = {
    "onnx-export-truncated": ("onnx", "onnx", "model.onnx", _truncate, VERIFY),
    "ort-model-overwritten": ("onnx", "onnxruntime", "model.onnx", _overwrite, VERIFY),
    "ort-model-unloadable": ("onnx", "onnxruntime", "model.onnx", _garbage_with_a_matching_manifest, LOAD),
    "ir-xml-truncated": ("openvino", "openvino", "model.xml", _truncate, VERIFY),
    # Same size, and OpenVINO would load it (with wrong weights): only the checksum sees it.
    "ir-bin-overwritten": ("openvino", "openvino", "model.bin", _overwrite, VERIFY),
    "ir-xml-unloadable": ("openvino", "openvino", "model.xml", _garbage_with_a_matching_manifest, LOAD),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
async def test_a_corrupted_export_is_rebuilt(
    models, reference, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On this module's RoBERTa copy, whose exports exist already (built here if not)."""
    backend, kind, name, corrupt, caught_by = CORRUPTIONS[case]
    model = models["roberta"]
    await run(model, backend=backend, dtype="float32")
    folders = [f for f in exported(model / ".infinity-cloud", kind) if (f / name).exists()]
    if kind == "onnxruntime":  # one per dtype: the float32 one
        folders = [f for f in folders if exports.export_metadata(f)["dtype"] == "float32"]
    (folder,) = folders
    intact = (folder / name).read_bytes()
    corrupt(folder / name)
    assert (folder / name).read_bytes() != intact
    if kind == "onnx":  # an intermediate is read only to build the runtime's export from it
        for built in exported(model / ".infinity-cloud", "onnxruntime"):
            shutil.rmtree(built)

    try:
        with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
            got, _ = await run(model, backend=backend, dtype="float32")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(caught_by in m and "rebuilding" in m and str(folder) in m for m in warnings), warnings
        assert exports.verify(folder)
        assert_close(got, await reference("roberta"), "embed", "float32")
    except BaseException:
        shutil.rmtree(model / ".infinity-cloud", ignore_errors=True)  # leave no corrupt export behind
        raise


# -- 4. serving without torch ---------------------------------------------------------------

NO_TORCH = r"""
import asyncio, json, sys

for name in ("torch", "transformers", "sentence_transformers"):
    sys.modules[name] = None  # `import torch` fails as if it were not installed

from infinity_cloud import EmbedAsk, Engine, ModelSpec

cached, uncached, shipped, texts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])


async def main():
    out = {}
    for backend in ("onnx", "openvino"):
        async with Engine(ModelSpec(model_id=cached, backend=backend, dtype="float32")) as engine:
            out[backend] = (await engine.embeddings(EmbedAsk(texts))).embeddings.tolist()
            out[backend + "-facts"] = engine.describe()[0]
    async with Engine(ModelSpec(model_id=cached)) as engine:
        out["auto-facts"] = engine.describe()[0]
    async with Engine(ModelSpec(model_id=shipped, dtype="float32")) as engine:  # its own openvino/
        out["shipped"] = (await engine.embeddings(EmbedAsk(texts))).embeddings.tolist()
        out["shipped-facts"] = engine.describe()[0]
    for backend in ("onnx", "openvino", "auto"):
        try:
            async with Engine(ModelSpec(model_id=uncached, backend=backend, dtype="float32")):
                out[backend + "-error"] = None
        except Exception as exc:
            out[backend + "-error"] = [type(exc).__name__, str(exc)]
    out["imported"] = sorted(
        m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "sentence_transformers")
        and sys.modules[m] is not None
    )
    print(json.dumps(out))


asyncio.run(main())
"""


def ship_openvino_ir(onnx_file: Path, model: Path) -> None:
    """`openvino/openvino_model.xml` in the folder, as sentence-transformers' hub repos ship it
    (optimum-intel's conversion of the same graph; its output named `last_hidden_state`)."""
    import openvino as ov

    ir = ov.convert_model(str(onnx_file))
    ir.outputs[0].get_tensor().set_names({"last_hidden_state"})
    (model / "openvino").mkdir()
    ov.save_model(ir, str(model / "openvino" / "openvino_model.xml"))


async def test_onnx_and_openvino_serve_without_torch(models, reference, tmp_path: Path) -> None:
    cached = models["bert"]
    uncached = fresh_copy(models["bert"], tmp_path / "uncached")
    for backend in ("onnx", "openvino"):  # export here, where torch is (a no-op if cached)
        await run(cached, backend=backend, dtype="float32")
    shipped = fresh_copy(models["bert"], tmp_path / "shipped")
    (onnx_folder,) = exported(cached / ".infinity-cloud", "onnx")
    ship_openvino_ir(onnx_folder / onnx_export.EXPORT_FILE, shipped)
    script = tmp_path / "no_torch.py"
    script.write_text(NO_TORCH)
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(script), str(cached), str(uncached), str(shipped), json.dumps(TEXTS)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    assert out["imported"] == []
    want = await reference("bert")
    for backend in ("onnx", "openvino"):
        assert out[f"{backend}-facts"]["backend"] == backend
        assert_close(np.array(out[backend], dtype=np.float32), want, "embed", "float32")
    assert out["auto-facts"]["backend"] == ("onnx" if has_nvidia_gpu() else "openvino")  # torch is not there
    # A folder that ships its own OpenVINO IR is served from it, on the default backend.
    if not has_nvidia_gpu():
        assert out["shipped-facts"]["backend"] == "openvino"
    assert_close(np.array(out["shipped"], dtype=np.float32), want, "embed", "float32")
    for backend in ("onnx", "openvino"):  # no export and no torch: say what to install
        kind, message = out[f"{backend}-error"]
        assert kind == "BackendUnavailableError", message
        # The converter's extra, after torch's CPU build (PyPI's Linux torch is CUDA's).
        assert onnx_export.export_install() in message and "onnx/model.onnx" in message, message
        assert ("openvino/openvino_model.xml" in message) == (backend == "openvino"), message
        assert str(uncached) in message
    kind, message = out["auto-error"]  # every installed backend said the same
    assert kind == "BackendUnavailableError", message
    assert onnx_export.export_install() in message and "whl/cpu" in message, message
    assert not (uncached / ".infinity-cloud").exists() or not any((uncached / ".infinity-cloud").iterdir())


# -- 5. a folder's own model.onnx -----------------------------------------------------------


OWN = {"model.onnx": ("onnx", "openvino"), "onnx/model.onnx": ("onnx",)}


@pytest.mark.parametrize("own", list(OWN))
async def test_a_folders_own_onnx_file_is_used_as_is(
    models, reference, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own: str
) -> None:
    source = models["bert"]
    with monkeypatch.context() as patch:
        patch.delenv(exports.CACHE_ENV)
        await run(source, backend="onnx", dtype="float32")  # a no-op if the matrix ran
    (export,) = exported(source / ".infinity-cloud", "onnx")
    model = fresh_copy(source, tmp_path / "model")
    (model / own).parent.mkdir(exist_ok=True)
    shutil.copy(export / onnx_export.EXPORT_FILE, model / own)

    forbid_export(monkeypatch)
    want = await reference("bert")
    for backend in OWN[own]:
        got, facts = await run(model, backend=backend, dtype="float32")
        assert facts["backend"] == backend
        assert_close(got, want, "embed", "float32")
    assert not exported(cache, "onnx")
    assert exported(cache, "onnxruntime")


# -- 6. backend auto ------------------------------------------------------------------------


async def test_auto_picks_openvino_on_a_cpu(models, reference) -> None:
    expected = "torch" if has_nvidia_gpu() else "openvino"
    spec = spec_of(ModelSpec(model_id=str(models["bert"]), served_model_name="emb"))
    async with serve_in_process(spec) as client:
        (entry,) = (await client.get("/models")).json()["data"]
        assert entry["backend"] == expected
        response = await client.post("/embeddings", json={"model": "emb", "input": TEXTS})
        assert response.status_code == 200, response.text
    got = np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)
    assert_close(got, await reference("bert"), "embed", entry["dtype"])


async def test_auto_falls_back_when_the_onnx_export_fails(
    models, reference, cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def failing(info: Any, *_: Any) -> None:
        raise ModelLoadError(f"exporting {info.path} (qwen2) to ONNX failed: unsupported op")

    monkeypatch.setattr(onnx_export, "export_onnx", failing)
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        got, facts = await run(models["qwen2"], dtype="float32")
    assert facts["backend"] == "torch"
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "backend openvino cannot serve" in warned and "backend onnx cannot serve" in warned
    assert "unsupported op" in warned
    assert_close(got, await reference("qwen2"), "embed", "float32")


async def test_a_failed_export_is_not_tried_again_at_the_next_start(
    models, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion that failed fails fast at later starts, until the packages change."""
    calls: list[Any] = []

    def failing(info: Any, *_: Any) -> None:
        calls.append(info)
        raise RuntimeError("TracerWarning: unsupported op Frobnicate")

    monkeypatch.setattr(onnx_export, "export_onnx", failing)
    for _ in range(2):
        with pytest.raises(ModelLoadError, match="Frobnicate"):
            await run(models["bert"], backend="openvino", dtype="float32")
    assert len(calls) == 1
    with pytest.raises(ModelLoadError, match="delete it to try again"):
        await run(models["bert"], backend="onnx", dtype="float32")  # the same ONNX export
    assert len(calls) == 1
    # Other package versions (say, a converter upgraded) deserve a new try.
    monkeypatch.setattr(exports, "export_environment", lambda: {"onnx": "another version"})
    with pytest.raises(ModelLoadError, match="Frobnicate"):
        await run(models["bert"], backend="openvino", dtype="float32")
    assert len(calls) == 2


async def test_a_missing_onnx_package_names_the_extra_before_loading_weights(
    models, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `onnx`, torch.onnx fails only after the weights load; we refuse up front and
    name the extra that brings it, not a slower backend."""
    from infinity_cloud.backends import graphs
    from infinity_cloud.core.errors import BackendUnavailableError

    loads = counting(monkeypatch, graphs, "load_model")
    monkeypatch.setitem(sys.modules, "onnx", None)
    fix = r"onnx is not installed\): pip install torch .*whl/cpu && " + re.escape(install_command("export"))
    with pytest.raises(BackendUnavailableError, match=fix):
        await run(models["bert"], backend="openvino", dtype="float32")
    assert loads == []


@pytest.mark.parametrize("step", ["convert", "compile"])
async def test_auto_falls_back_when_openvino_cannot_take_the_model(
    models, reference, cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    step: str,
) -> None:
    """The runtime's own errors (not ours) while converting or compiling: auto moves on."""

    def failing(*_: Any, **__: Any) -> None:
        raise RuntimeError("OpConversionFailure: no converter for op Frobnicate")

    if step == "convert":
        monkeypatch.setattr(openvino_backend.ov, "convert_model", failing)
    else:
        monkeypatch.setattr(openvino_backend.OpenVinoBackend, "_compile", failing)
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        got, facts = await run(models["roberta"], dtype="float32")
    assert facts["backend"] == "onnx"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("backend openvino cannot serve" in m and "Frobnicate" in m for m in warnings), warnings
    assert_close(got, await reference("roberta"), "embed", "float32")
    assert not list(cache.glob("*.building-*"))


async def test_auto_with_int8_serves_openvino_static_int8(models, reference) -> None:
    """`--dtype int8` on the default install: OpenVINO, quantised statically (NNCF)."""
    got, facts = await run(models["bert"], dtype="int8")
    assert (facts["backend"], facts["dtype"]) == ("openvino", "int8")
    assert_close(got, await reference("bert"), "embed", "int8")


async def test_the_openvino_int8_model_is_quantised_and_holds_the_bar(models) -> None:
    """The int8 IR is really quantised (FakeQuantize before its matrix products), built from
    the float IR, and its manifest says how far it agrees on the held-out texts and probes."""
    await run(models["bert"], backend="openvino", dtype="int8")
    folders = exported(models["bert"] / ".infinity-cloud", "openvino")
    built = [f for f in folders if "scheme" in exports.export_metadata(f)]
    assert len(built) == 1 and len(folders) == 2, folders  # the float IR it was made from, and it
    facts = exports.export_metadata(built[0])
    assert facts["held_out_agreement"] >= fidelity.MIN_AGREEMENT["int8"] + openvino_int8.MARGIN
    assert facts["scheme"] == openvino_int8.SCHEME and facts["statistics_texts"] > 0
    ir = openvino_backend.ov.Core().read_model(str(built[0] / openvino_backend.IR_FILE))
    kinds = [op.get_type_name() for op in ir.get_ordered_ops()]
    assert kinds.count("FakeQuantize") > 0
    # The feed-forward outputs (one per layer) are among what stays float32 when the bar needs it.
    (floats,) = set(folders) - set(built)
    layers = json.loads((models["bert"] / "config.json").read_text())["num_hidden_layers"]
    float_ir = openvino_backend.ov.Core().read_model(str(floats / openvino_backend.IR_FILE))
    assert len(openvino_int8.feed_forward_outputs(float_ir)) == layers
    assert set(facts["float32_layers"]) <= set(openvino_int8.sensitive_matmuls(float_ir))


async def test_openvino_int8_runs_what_it_leaves_unquantised_in_bfloat16_where_the_cpu_has_it(models) -> None:
    """Attention and the products kept unquantised compute in bfloat16 on a CPU with it in
    hardware (read at run time), float32 elsewhere; the bar was checked as it is served."""
    async with Engine(ModelSpec(model_id=str(models["bert"]), backend="openvino", dtype="int8")) as engine:
        backend = next(iter(engine.models.values()))._loaded.backend
        hint = str(backend.compiled.get_property("INFERENCE_PRECISION_HINT"))
        fast = cpu_has_fast_bf16() and "BF16" in backend.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        assert ("bf16" in hint or "bfloat16" in hint) == fast, hint
        assert backend.agreement is None or backend.agreement >= fidelity.MIN_AGREEMENT["int8"]


async def test_openvino_int8_that_cannot_hold_the_bar_fails_with_the_numbers(
    models, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fidelity.MIN_AGREEMENT, "int8", 0.99999)  # past what int8 can do
    with pytest.raises(ModelLoadError, match=r"int8 cannot hold .* worst cosine to float32 0\.9\d+"):
        await run(models["bert"], backend="openvino", dtype="int8")
    assert [f for f in exported(cache, "openvino") if "scheme" in exports.export_metadata(f)] == []


async def test_fastest_times_every_precision_and_serves_the_fastest_that_agrees(
    models, reference, cache
) -> None:
    """`--dtype fastest`: float32, bfloat16 where the CPU has it, and int8, each timed on a full
    batch at load; the fastest that agrees with float32 to the bar (0.99) is served."""
    got, facts = await run(models["bert"], backend="openvino", dtype="fastest")
    (folder,) = exported(cache, "dtype-choice")
    verdict = exports.export_metadata(folder)
    measured = verdict["measured"]
    assert set(measured) == {"float32", "int8", *(["bfloat16"] if cpu_has_fast_bf16() else [])}
    agreeing = [d for d, m in measured.items() if d == "float32" or m["agreement"] >= 0.99]
    assert facts["dtype"] == verdict["dtype"] == min(agreeing, key=lambda d: measured[d]["seconds"])
    assert_close(got, await reference("bert"), "embed", facts["dtype"])


async def test_fastest_serves_float32_where_no_reduced_precision_reaches_the_bar(models, cache) -> None:
    _, facts = await run(models["bert"], backend="openvino", dtype="fastest", min_agreement=1.0)
    assert facts["dtype"] == "float32"


def test_min_agreement_without_fastest_is_refused() -> None:
    with pytest.raises(ValueError, match="min_agreement chooses among precisions for dtype fastest"):
        ModelSpec(model_id="m", dtype="int8", min_agreement=0.99)


async def test_openvino_int8_without_nncf_names_the_extra(models, cache: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "nncf", None)  # not installed
    with pytest.raises(BackendUnavailableError, match=re.escape(install_command("export"))):
        await run(models["bert"], backend="openvino", dtype="int8")


# -- 7. dtype auto and the fidelity check ---------------------------------------------------


BF16_CPU = pytest.mark.skipif(not cpu_has_fast_bf16(), reason="auto picks bfloat16 on AMX / AVX512-BF16 only")


@BF16_CPU
async def test_torch_auto_keeps_bfloat16_when_faithful(models, reference, cache: Path) -> None:
    got, facts = await run(models["bert"], backend="torch", dtype="auto")
    assert facts["dtype"] == "bfloat16"
    assert_close(got, await reference("bert"), "embed", "bfloat16")


@BF16_CPU
@pytest.mark.parametrize("backend", ["torch", "openvino"])
async def test_an_unfaithful_bfloat16_serves_float32_with_a_warning(
    models, reference, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, backend: str
) -> None:
    """No agreement reaches 1.5 (a cosine), so bfloat16 fails the check whatever it measures;
    the bar is part of a cached verdict's key, so an earlier verdict is not reused."""
    monkeypatch.setitem(fidelity.MIN_AGREEMENT, "bfloat16", 1.5)
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        got, facts = await run(models["bert"], backend=backend, dtype="auto")
    assert (facts["backend"], facts["dtype"]) == (backend, "float32")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("disagrees with float32" in message for message in warnings), warnings
    assert_close(got, await reference("bert"), "embed", "float32")


async def test_a_precision_asked_for_is_measured_and_kept_with_a_warning_when_unfaithful(
    models, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """int8 by name: served as asked, its measured agreement in /models; below the bar (1.5
    here, which nothing reaches) a loud warning naming the fix, never a silent swap."""
    _, facts = await run(models["bert"], backend="onnx", dtype="int8")
    # 1.0 itself on AMX: its int8 kernels agree to float32's rounding on this tiny model
    # (measured on a Xeon with amx_int8); that it is measured, not set, is shown below.
    assert facts["dtype"] == "int8" and 0.9 < facts["agreement_with_float32"] <= 1.0
    monkeypatch.setitem(fidelity.MIN_AGREEMENT, "int8", 1.5)
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        _, facts = await run(models["bert"], backend="onnx", dtype="int8")
    assert facts["dtype"] == "int8"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    loud = [m for m in warnings if "asked for, disagrees with float32" in m and "--dtype float32" in m]
    assert loud, warnings


@BF16_CPU
async def test_the_fidelity_check_compares_real_outputs(
    models, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check runs the probes through both precisions (not a constant verdict)."""
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    real = fidelity.agreement

    def recording(candidate: np.ndarray, reference: np.ndarray) -> float:
        seen.append((candidate, reference))
        return real(candidate, reference)

    monkeypatch.setattr(fidelity, "agreement", recording)
    _, facts = await run(models["bert"], backend="torch", dtype="auto")
    assert facts["dtype"] == "bfloat16"
    ((candidate, reference),) = seen
    assert candidate.shape == reference.shape and candidate.shape[0] >= 4
    assert not np.array_equal(candidate, reference)  # really two precisions
    assert real(candidate, reference) >= fidelity.MIN_AGREEMENT["bfloat16"]


# -- 8. bad backend / dtype / device combinations -------------------------------------------

BAD = {
    "onnx-bf16-cpu": ({"backend": "onnx", "dtype": "bfloat16", "device": "cpu"}, "bfloat16"),
    "onnx-fp16-cpu": ({"backend": "onnx", "dtype": "float16", "device": "cpu"}, "float16"),
    "torch-int8": ({"backend": "torch", "dtype": "int8"}, "int8"),
    "openvino-cuda": ({"backend": "openvino", "device": "cuda"}, "cuda"),
    # auto on cuda: refused before any backend is tried, with why torch cannot use a GPU here
    # (backends/cuda_check.py), not each backend's own refusal, nor a fall back to the CPU
    "auto-cuda-without-gpu": ({"backend": "auto", "device": "cuda"},
                              "asks for device cuda, but no NVIDIA driver is visible"),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_a_bad_combination_is_a_config_error(
    models, cache: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    options, word = BAD[case]
    if case == "auto-cuda-without-gpu" and has_nvidia_gpu():
        pytest.skip("cuda is not a bad device here")
    forbid_export(monkeypatch)  # refused before any slow work
    with pytest.raises(ConfigError, match=word) as raised:  # named as over HTTP below: the same message
        async with Engine(ModelSpec(model_id=str(models["bert"]), served_model_name="emb", **options)):
            pass
    if options["backend"] != "auto":
        assert options["backend"] in raised.value.message

    # Over HTTP: the model fails to load, /health says why, its requests get a 503.
    spec = spec_of(ModelSpec(model_id=str(models["bert"]), served_model_name="emb", **options))
    async with unwaited(spec) as client:
        deadline = time.monotonic() + 30
        while (health := await client.get("/health")).json()["models"][0]["state"] == "loading":
            assert time.monotonic() < deadline, health.text
            await asyncio.sleep(0.02)
        assert health.status_code == 503
        (model,) = health.json()["models"]
        assert model["state"] == "failed" and raised.value.message in model["error"]
        response = await client.post("/embeddings", json={"model": "emb", "input": ["hi"]})
        assert response.status_code == 503
        assert "failed to load" in response.json()["error"]["message"]
        assert raised.value.message in response.json()["error"]["message"]
    assert not exported(cache, "onnx")


# -- OpenVINO's split of a batch across its streams -----------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_balanced_slices_cover_every_row_once_with_even_work(count: int) -> None:
    from infinity_cloud.backends.openvino_backend import balanced_slices

    rng = np.random.default_rng(count)
    for _ in range(50):
        lengths = rng.integers(1, 257, size=int(rng.integers(1, 80)))
        groups = balanced_slices(lengths, count)
        assert 1 <= len(groups) <= count
        assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))

        def worst(split: list[np.ndarray], lengths: np.ndarray = lengths) -> int:
            return max(int(lengths[g].max()) * len(g) for g in split)

        # Never worse than halving the length-sorted rows by count, the naive split.
        naive = [g for g in np.array_split(np.argsort(lengths, kind="stable"), count) if len(g)]
        assert worst(groups) <= worst(naive)


def test_concurrent_first_starts_build_an_export_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers started at once on a fresh cache: the second waits for the first's export
    (a file lock, which holds between processes as between these threads) and builds nothing."""
    import threading

    monkeypatch.setenv("INFINITY_CLOUD_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    builds: list[int] = []

    def build(folder: Path) -> dict[str, int]:
        builds.append(1)
        time.sleep(0.5)  # long enough for the other start to arrive while this one builds
        (folder / "graph.bin").write_bytes(b"x" * 10)
        return {"built": len(builds)}

    results: list[Path] = []
    starts = [threading.Thread(target=lambda: results.append(
        exports.cached_export(model, "demo", {"a": 1}, build, "building a demo export"))) for _ in range(2)]
    for start in starts:
        start.start()
    for start in starts:
        start.join()
    assert len(builds) == 1 and len(results) == 2 and results[0] == results[1]
    assert exports.export_metadata(results[0]) == {"built": 1}


def test_exports_made_trusting_remote_code_are_kept_apart(
    tiny_embedder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export made while trusting the repository's code is never the one a server that
    does not trust it serves (the admin API may load a model either way): the two are
    different cache entries, for ONNX's files and for what OpenVINO builds from them."""
    from infinity_cloud.families import read_model_info

    monkeypatch.setenv("INFINITY_CLOUD_CACHE", str(tmp_path / "cache"))
    info = read_model_info(tiny_embedder)
    graph = info.towers["text"]
    untrusted = onnx_export.OnnxSource(info, graph, False, "onnx")
    trusted = onnx_export.OnnxSource(info, graph, True, "onnx")
    assert trusted.label != untrusted.label  # the key of OpenVINO's export (and ONNX's options)
    assert trusted.path().parent != untrusted.path().parent


async def test_openvino_meets_a_bounded_set_of_shapes_and_bounds_its_shape_caches(models) -> None:
    """OpenVINO keeps what it compiles per input shape: a shape per input length made memory
    grow with every new input (issue 34). Every batch of texts of 1 to 128 tokens reaches
    its inference requests padded to a multiple of 8 tokens (or the model's length), oneDNN's
    cache is bounded (OpenVINO's own is set at compilation, which does not read it back); the
    answers are the same as unpadded ones."""
    from infinity_cloud.text.tokenization import TextTokenizer

    spec = ModelSpec(model_id=str(models["bert"]), backend="openvino", dtype="float32")
    rng = np.random.default_rng(34)
    words = LONG.split()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 120)))) for _ in range(48)]
    async with Engine(spec) as engine:
        served = engine.models[spec.name]
        backend = served.loaded.backend
        assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(openvino_backend.SHAPE_CACHE_ENTRIES)
        widths = set()
        for start in range(0, len(texts), 6):
            await engine.embeddings(EmbedAsk(texts[start : start + 6]))
            for requests in list(backend._free.queue):
                widths.update(r.get_input_tensor(0).shape[1] for r in requests)
        got = (await engine.embeddings(EmbedAsk(texts))).embeddings
        max_length = served.loaded.tokenizer.max_length
    assert widths and all(w % openvino_backend.LENGTH_GRAIN == 0 or w == max_length for w in widths), widths
    tokenizer = TextTokenizer.load(models["bert"], max_length)
    assert len({len(e) for e in tokenizer.encode(texts)}) > len(widths)  # more lengths than shapes
    async with Engine(spec.model_copy(update={"backend": "torch"})) as engine:
        want = (await engine.embeddings(EmbedAsk(texts))).embeddings
    assert cosines(got, want).min() > 0.9999


@pytest.mark.parametrize(("backend", "device", "latency", "at_once"), [
    ("torch", "cpu", False, 1), ("torch", "cuda", False, 2), ("onnx", "cpu", False, 1),
    ("openvino", "cpu", False, 2), ("openvino", "cpu", True, 1),
])
async def test_each_backend_says_how_many_batches_it_keeps_in_flight(
    models, backend: str, device: str, latency: bool, at_once: int
) -> None:
    """What a device's memory is divided among (`fit_device_memory`): torch on the CPU and
    ONNX Runtime run one batch at a time, torch on CUDA one a stream; OpenVINO two sets of
    requests, one in latency mode."""
    if device == "cuda" and not has_nvidia_gpu():
        pytest.skip("no CUDA device here")
    spec = ModelSpec(model_id=str(models["bert"]), backend=backend, device=device, dtype="float32",
                     latency=latency)
    async with Engine(spec) as engine:
        assert engine.models[spec.name].loaded.backend.batches_in_flight == at_once
