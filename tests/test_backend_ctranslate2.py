"""The ctranslate2 backend: embeddings against sentence-transformers in float32 on the same
folders (tiny BERT, RoBERTa, XLM-R, DistilBERT and the real all-MiniLM-L6-v2), int8 within
its looser bound, one cached conversion reused and rebuilt when corrupt, and clear errors for
what it cannot serve."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

import model_factory  # noqa: E402 - after the skip: it imports torch
import torch  # noqa: E402
from conftest import cosines, holds_or_says_so  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoConfig, AutoModel, XLMRobertaConfig  # noqa: E402

from infinity_cloud import Engine, ModelSpec  # noqa: E402
from infinity_cloud.backends import exports  # noqa: E402
from infinity_cloud.backends.ctranslate2_backend import MODEL_FILE, CTranslate2Backend  # noqa: E402
from infinity_cloud.core.content_digest import file_record  # noqa: E402
from infinity_cloud.core.errors import BackendUnavailableError, ConfigError, ModelLoadError  # noqa: E402
from infinity_cloud.core.install_hint import install_command  # noqa: E402
from infinity_cloud.engine.asks import EmbedAsk  # noqa: E402
from infinity_cloud.families import read_model_info  # noqa: E402

FLOAT32_COSINE = 0.9999
INT8_COSINE = 0.98
# ~500 words: truncated at every model's limit, so batches mix full-length and short rows.
LONG_TEXT = " ".join(["the quick brown fox jumps over the lazy dog while people read a story"] * 40)
TEXTS = [
    "hello world",
    "What is the capital of France?",
    "x",
    LONG_TEXT,
    "Paris is the capital of France. " * 6,
    "Café naïve résumé 日本語のテキスト emoji 🙂🚀",
    "Embedding models turn sentences into vectors; rerankers score query-document pairs.",
    "the",
]


# -- models ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str], Path]:
    """variants(folder, kind): a copy with its transformer re-drawn at initializer_range 0.2
    (the tiny models' outputs barely depend on the input at 0.02, so a wrong-row or padding
    bug could pass a cosine check), optionally as another architecture."""
    root = tmp_path_factory.mktemp("ct2-variants")

    @functools.cache
    def make(path: Path, kind: str) -> Path:
        out = root / f"{path.name}-{kind}"
        shutil.copytree(path, out)
        config = AutoConfig.from_pretrained(str(path))
        if kind == "xlm-roberta":  # same layout and weights names as RoBERTa
            config = XLMRobertaConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
            config.architectures = ["XLMRobertaModel"]
        config.initializer_range = 0.2
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(7)
            AutoModel.from_config(config).save_pretrained(str(out))
        return out

    return make


def build_distilbert(path: Path) -> Path:
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel

    with tempfile.TemporaryDirectory(prefix="tiny-distilbert-") as tmp:
        model_factory.build_wordpiece_tokenizer(Path(tmp))
        vocab = len(AutoTokenizer.from_pretrained(tmp))
        config = DistilBertConfig(
            vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
            max_position_embeddings=model_factory.MAX_LENGTH, pad_token_id=0, initializer_range=0.2,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(7)
            DistilBertModel(config).save_pretrained(tmp)
        return model_factory._save_sentence_transformer(Path(tmp), path, "mean", normalize=True)


@pytest.fixture(scope="module")
def tiny(
    build_model: Callable[..., Path], variants: Callable[[Path, str], Path], model_root: Path
) -> Callable[[str], Path]:
    """tiny(name): the folder for one of the tiny embedders below."""

    @functools.cache
    def get(name: str) -> Path:
        if name == "bert-mean":
            return variants(build_model("bert_embedder"), "wide")
        if name == "bert-cls-raw":
            return variants(build_model("bert_embedder", pooling="cls", normalize=False), "wide")
        if name == "roberta":
            return variants(build_model("roberta_embedder"), "wide")
        if name == "xlm-roberta":
            return variants(build_model("roberta_embedder"), "xlm-roberta")
        if name == "distilbert":
            return build_distilbert(model_root / "ct2-distilbert")
        raise KeyError(name)

    return get


@pytest.fixture(scope="module")
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ct2-exports")


@pytest.fixture(autouse=True)
def _isolated_exports(monkeypatch: pytest.MonkeyPatch, export_cache: Path) -> None:
    """Conversions go to one cache for this module, never into shared model folders."""
    monkeypatch.setenv(exports.CACHE_ENV, str(export_cache))


@functools.cache
def reference(path: Path) -> np.ndarray:
    """sentence-transformers in float32 on the same folder: the ground truth."""
    return SentenceTransformer(str(path), device="cpu").encode(TEXTS, batch_size=4, convert_to_numpy=True)


async def embed(
    path: Path, dtype: str = "float32", texts: list[str] = TEXTS
) -> tuple[np.ndarray, dict[str, Any]]:
    """Embeddings from the engine with backend ctranslate2, and what it reports of itself."""
    async with Engine(ModelSpec(model_id=str(path), backend="ctranslate2", device="cpu", dtype=dtype)) as e:
        result = await e.embeddings(EmbedAsk(texts))
        return result.embeddings, e.describe()[0]


def assert_close(ours: np.ndarray, ref: np.ndarray, min_cosine: float) -> None:
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    cos = cosines(ours, ref)
    assert cos.min() >= min_cosine, f"cosine per text: {np.round(cos, 6)}"
    # Each row is nearest its own reference: no input got another's vector.
    distances = np.linalg.norm(ours[:, None, :] - ref[None, :, :], axis=-1)
    np.testing.assert_array_equal(distances.argmin(axis=1), np.arange(len(ref)))


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders CTranslate2's converter was asked to write, in order."""
    from ctranslate2.converters import TransformersConverter

    calls: list[Path] = []
    convert = TransformersConverter.convert

    def spy(self: Any, output_dir: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(Path(output_dir))
        return convert(self, output_dir, *args, **kwargs)

    monkeypatch.setattr(TransformersConverter, "convert", spy)
    return calls


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path))
    return tmp_path


def only_export(cache: Path) -> Path:
    folders = [f for f in cache.iterdir() if f.name.startswith("ctranslate2-")]
    assert len(folders) == 1, folders
    return folders[0]


# -- fidelity ----------------------------------------------------------------------------

TINY = ["bert-mean", "bert-cls-raw", "roberta", "xlm-roberta", "distilbert"]


@pytest.mark.parametrize("name", TINY)
async def test_tiny_embedders_match_float32_reference(tiny: Callable[[str], Path], name: str) -> None:
    path = tiny(name)
    ours, facts = await embed(path, "float32")
    assert facts["dtype"] == "float32"
    ref = reference(path)
    assert_close(ours, ref, FLOAT32_COSINE)
    # Element-wise too, on each vector's scale: float32 kernels differ only in rounding.
    scale = np.linalg.norm(ref, axis=1, keepdims=True)
    np.testing.assert_array_less(np.abs(ours - ref), np.broadcast_to(1e-4 * scale, ref.shape))


@pytest.mark.parametrize("name", ["bert-mean", "xlm-roberta"])
async def test_tiny_embedders_int8_within_bound(
    tiny: Callable[[str], Path], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Within its bound where the load-time verdict says int8 holds on this CPU (CTranslate2's
    int8 kernels lose far more without VNNI); otherwise the product must say it does not."""
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        ours, facts = await embed(tiny(name), "int8")
    assert facts["dtype"] == "int8"
    if holds_or_says_so(facts, caplog):
        assert_close(ours, reference(tiny(name)), INT8_COSINE)


async def test_padding_does_not_change_a_row(tiny: Callable[[str], Path]) -> None:
    """A short text batched with a truncated long one equals the same text embedded alone."""
    path = tiny("roberta")  # positions offset by the padding index: the easiest to get wrong
    together, _ = await embed(path, texts=["hello world", LONG_TEXT, "x"])
    alone, _ = await embed(path, texts=["hello world"])
    np.testing.assert_allclose(together[0], alone[0], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "min_cosine"), [("auto", FLOAT32_COSINE), ("int8", INT8_COSINE)])
async def test_minilm_matches_sentence_transformers(
    minilm_dir: Path, dtype: str, min_cosine: float, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        ours, facts = await embed(minilm_dir, dtype)
    # auto is float32 on CPU: int8 is opt-in, and this build has no bfloat16 CPU kernels.
    assert facts["dtype"] == ("int8" if dtype == "int8" else "float32")
    assert ours.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-4)
    if dtype != "int8" or holds_or_says_so(facts, caplog):
        assert_close(ours, reference(minilm_dir), min_cosine)


# -- the cached conversion ---------------------------------------------------------------


async def test_second_load_does_not_reconvert(
    tiny: Callable[[str], Path], fresh_cache: Path, conversions: list[Path], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ctranslate2.converters import TransformersConverter

    path = tiny("bert-mean")
    first, _ = await embed(path)
    assert len(conversions) == 1
    folder = only_export(fresh_cache)
    stamp = (folder / MODEL_FILE).stat().st_mtime_ns

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cached conversion was not reused")

    monkeypatch.setattr(TransformersConverter, "convert", refuse)
    again, _ = await embed(path)
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        int8, facts = await embed(path, "int8")  # another dtype: the same float32 conversion
    assert only_export(fresh_cache) == folder
    assert (folder / MODEL_FILE).stat().st_mtime_ns == stamp
    np.testing.assert_array_equal(again, first)
    if holds_or_says_so(facts, caplog):
        assert_close(int8, first, INT8_COSINE)


async def test_truncated_conversion_is_rebuilt(
    tiny: Callable[[str], Path], fresh_cache: Path, conversions: list[Path]
) -> None:
    path = tiny("bert-mean")
    await embed(path)
    model_bin = only_export(fresh_cache) / MODEL_FILE
    os.truncate(model_bin, model_bin.stat().st_size // 2)
    ours, _ = await embed(path)
    assert len(conversions) == 2
    assert exports.verify(only_export(fresh_cache))
    assert_close(ours, reference(path), FLOAT32_COSINE)


async def test_conversion_that_verifies_but_does_not_load_is_rebuilt(
    tiny: Callable[[str], Path], fresh_cache: Path, conversions: list[Path]
) -> None:
    """An overwritten model.bin whose manifest was rewritten to match (so only loading it
    can tell) is dropped and converted again."""
    path = tiny("bert-mean")
    await embed(path)
    folder = only_export(fresh_cache)
    (folder / MODEL_FILE).write_bytes(b"not a ctranslate2 model" * 100)
    manifest = json.loads((folder / exports.MANIFEST).read_text())
    manifest["files"][MODEL_FILE] = file_record(folder / MODEL_FILE)
    (folder / exports.MANIFEST).write_text(json.dumps(manifest))
    assert exports.verify(folder)
    ours, _ = await embed(path)
    assert len(conversions) == 2
    assert_close(ours, reference(path), FLOAT32_COSINE)


# -- what it refuses ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bert_reranker", "bert_classifier", "decoder_embedder"])
async def test_unservable_models_are_refused_before_converting(
    build_model: Callable[..., Path], fresh_cache: Path, conversions: list[Path], kind: str
) -> None:
    path = build_model(kind)
    with pytest.raises(ModelLoadError, match="--backend onnx, openvino or torch"):
        async with Engine(ModelSpec(model_id=str(path), backend="ctranslate2", device="cpu")):
            pass
    assert conversions == [] and not any(fresh_cache.iterdir())


@pytest.mark.skipif(
    "bfloat16" in ctranslate2.get_supported_compute_types("cpu"), reason="this build runs bfloat16 on CPU"
)
def test_unsupported_dtype_is_a_config_error(tiny: Callable[[str], Path]) -> None:
    info = read_model_info(tiny("bert-mean"))
    with pytest.raises(ConfigError, match="bfloat16"):
        CTranslate2Backend(info, ModelSpec(model_id=str(info.path), backend="ctranslate2", dtype="bfloat16"))


def test_bad_device_is_a_config_error(tiny: Callable[[str], Path]) -> None:
    info = read_model_info(tiny("bert-mean"))
    with pytest.raises(ConfigError, match="cpu or cuda"):
        CTranslate2Backend(info, ModelSpec(model_id=str(info.path), backend="ctranslate2", device="mps"))


def test_conversion_without_torch_names_what_to_install(
    tiny: Callable[[str], Path], fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = read_model_info(tiny("bert-mean"))  # built (with torch) before torch goes away
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(BackendUnavailableError, match=re.escape(install_command("torch"))):
        CTranslate2Backend(info, ModelSpec(model_id=str(info.path), backend="ctranslate2"))
