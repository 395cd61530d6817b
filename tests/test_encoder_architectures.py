"""Architectures whose folder names a model class AutoModel does not give, and ones whose
export needs another converter, served on every backend that runs them and checked against
sentence-transformers through the real app over HTTP (/v1/embeddings):

- T5 encoders (sentence-t5, gtr-t5): `architectures: ["T5EncoderModel"]`, the encoder alone;
  AutoModel would give the encoder-decoder, whose decoder gets no input.
- Gemma3 with bidirectional attention (EmbeddingGemma): torch.onnx cannot trace its mask, so
  OpenVINO converts it from torch itself; ONNX Runtime refuses it with the reason.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import cosines, serve_in_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.backends import exports
from infinity_cloud.core.errors import ModelLoadError

TEXTS = [
    "What is the capital of France?",
    "Paris is the capital of France.",
    "the quick brown fox jumps over the lazy dog " * 6,
    "xyzzy",
]
COSINE = 0.99999


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty export cache for each test: every export is built by the code under test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(exports.CACHE_ENV, str(folder))
    return folder


def reference(path: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(TEXTS, convert_to_numpy=True)


async def served(path: Path, **options: str) -> tuple[np.ndarray, dict]:
    """The embeddings of TEXTS from the app over HTTP, and the model's /models entry."""
    spec = spec_of(ModelSpec(model_id=str(path), served_model_name="m", **options))
    async with serve_in_process(spec) as client:
        response = await client.post("/v1/embeddings", json={"model": "m", "input": TEXTS})
        assert response.status_code == 200, response.text
        (entry,) = (await client.get("/models")).json()["data"]
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32), entry


# -- T5 encoders --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["openvino", "onnx", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "auto"])
async def test_t5_encoder_matches_sentence_transformers(build_model, backend: str, dtype: str) -> None:
    path = build_model("t5_encoder")
    got, entry = await served(path, backend=backend, dtype=dtype)
    assert entry["backend"] == backend
    cos = cosines(got, reference(path))
    bound = COSINE if entry["dtype"] == "float32" else 0.999
    assert cos.min() >= bound, (entry["dtype"], np.round(cos, 7))


@pytest.mark.parametrize("backend", ["openvino", "torch"])
async def test_a_t5_encoder_decoder_folder_embeds_with_its_encoder(build_model, backend: str) -> None:
    path = build_model("t5_encoder", encoder_only=False)
    got, _ = await served(path, backend=backend, dtype="float32")
    assert cosines(got, reference(path)).min() >= COSINE


async def test_t5_encoder_is_served_by_default(build_model) -> None:
    path = build_model("t5_encoder")
    got, entry = await served(path, dtype="float32")
    assert entry["backend"] == "openvino"
    assert cosines(got, reference(path)).min() >= COSINE


@pytest.mark.parametrize(("kind", "model_type"), [("t5_encoder", "t5"), ("gemma3_embedder", "gemma3_text")])
async def test_ctranslate2_refuses_them_naming_the_backends_that_serve_them(
    build_model, kind: str, model_type: str
) -> None:
    pytest.importorskip("ctranslate2")
    spec = ModelSpec(model_id=str(build_model(kind)), backend="ctranslate2", device="cpu")
    with pytest.raises(ModelLoadError) as raised:
        async with Engine(spec):
            pass
    assert f"cannot run {model_type} models" in raised.value.message
    assert "openvino" in raised.value.message and "torch" in raised.value.message


# -- Gemma3 read both ways (EmbeddingGemma) -----------------------------------------------------


@pytest.mark.parametrize("backend", ["openvino", "onnx", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "auto"])
async def test_bidirectional_gemma3_matches_sentence_transformers(
    build_model, backend: str, dtype: str
) -> None:
    path = build_model("gemma3_embedder")
    got, entry = await served(path, backend=backend, dtype=dtype)
    assert entry["backend"] == backend
    cos = cosines(got, reference(path))
    bound = COSINE if entry["dtype"] == "float32" else 0.999
    assert cos.min() >= bound, (entry["dtype"], np.round(cos, 7))


async def test_bidirectional_gemma3_is_served_on_openvino_without_a_fallback(
    build_model, caplog: pytest.LogCaptureFixture
) -> None:
    path = build_model("gemma3_embedder")
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        got, entry = await served(path, dtype="float32")
    assert entry["backend"] == "openvino"
    assert not [r.getMessage() for r in caplog.records if "cannot serve" in r.getMessage()]
    assert cosines(got, reference(path)).min() >= COSINE


async def test_causal_gemma3_is_still_read_one_way(build_model) -> None:
    """The same folder without `use_bidirectional_attention` is a causal decoder: its own
    masks, and sentence-transformers' answer (which differs from the bidirectional one's)."""
    causal, both = build_model("gemma3_embedder", bidirectional=False), build_model("gemma3_embedder")
    got, entry = await served(causal, dtype="float32")
    assert entry["backend"] == "openvino"
    assert cosines(got, reference(causal)).min() >= COSINE
    assert cosines(reference(causal), reference(both)).min() < 0.999
