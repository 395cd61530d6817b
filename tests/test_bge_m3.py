"""bge-m3's three outputs (dense, sparse, ColBERT) from one pass, against FlagEmbedding's
BGEM3FlagModel on a tiny XLM-R with random heads built here: through the Python API on the
default backend (OpenVINO) and torch, over HTTP (OpenAI's `/v1/embeddings` and Cohere's embed
with several `embedding_types`, one model run for all three), and by the bulk job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import serve_in_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.asks import EmbedAsk
from infinity_cloud.families import read_model_info
from infinity_cloud.results import EmbeddingsByType

TEXTS = [
    "the cat sat on the mat",
    "paris is the capital of france and its largest city",
    "hello",
    "water boils at one hundred degrees at sea level, and freezes at zero",
]
ALL_THREE = ("float", "sparse", "multi_vector")


@pytest.fixture(scope="session")
def bge_m3(build_model: Callable[..., Path]) -> Path:
    return build_model("bge_m3")


@pytest.fixture(scope="session")
def flag_reference(bge_m3: Path) -> dict[str, Any]:
    """BGEM3FlagModel's three outputs of TEXTS, in float32 on the CPU."""
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(str(bge_m3), use_fp16=False, devices="cpu")
    return model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)


def worst_differences(result: EmbeddingsByType, reference: dict[str, Any]) -> dict[str, float]:
    """The worst dense cosine, sparse weight difference and ColBERT vector cosine to the
    reference; the sparse terms must be the same token ids."""
    dense = np.asarray(result.by_type["float"])
    want = reference["dense_vecs"]
    dense_cosine = float(((dense * want).sum(1) / np.linalg.norm(dense, axis=1)
                          / np.linalg.norm(want, axis=1)).min())
    sparse_worst = 0.0
    for got, weights in zip(result.by_type["sparse"], reference["lexical_weights"], strict=True):
        assert sorted(got.indices.tolist()) == sorted(int(i) for i in weights), "other token ids"
        wanted = np.array([weights[str(i)] for i in got.indices], dtype=np.float32)
        sparse_worst = max(sparse_worst, float(np.abs(got.values - wanted).max(initial=0.0)))
    colbert_cosine = 1.0
    for got, want in zip(result.by_type["multi_vector"], reference["colbert_vecs"], strict=True):
        assert got.shape == want.shape
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        colbert_cosine = min(colbert_cosine, float(cos.min()))
    return {"dense_cosine": dense_cosine, "sparse_abs": sparse_worst, "colbert_cosine": colbert_cosine}


def test_bge_m3_folder_is_recognised(bge_m3: Path) -> None:
    info = read_model_info(bge_m3)
    assert (info.family.name, info.capability.value, info.pooling, info.normalize) == ("bge-m3", "embed", "cls", True)
    assert info.towers == {"text": "hybrid"} and info.dimensions == 32


@pytest.mark.parametrize("backend", ["openvino", "torch"])
async def test_three_outputs_match_flag_embedding_in_float32(
    bge_m3: Path, flag_reference: dict[str, Any], backend: str
) -> None:
    assert any(len(w) for w in flag_reference["lexical_weights"]), "the heads drew no sparse weight"
    async with Engine(ModelSpec(model_id=str(bge_m3), backend=backend, dtype="float32")) as engine:
        result = await engine.embeddings(EmbedAsk(TEXTS, dtype=ALL_THREE))
        dense_only = await engine.embeddings(EmbedAsk(TEXTS))
    worst = worst_differences(result, flag_reference)
    print(f"{backend} float32 worst: {worst}")
    assert worst["dense_cosine"] >= 0.99999
    assert worst["sparse_abs"] <= 1e-4
    assert worst["colbert_cosine"] >= 0.99999
    # A plain request gets the dense vectors, the same as the dense type of all three.
    np.testing.assert_allclose(dense_only.embeddings, result.by_type["float"], atol=1e-6)


async def test_default_precision_worst_differences(bge_m3: Path, flag_reference: dict[str, Any]) -> None:
    """The default backend and precision (OpenVINO, dtype auto): reported, and bounded as any
    embedder's reduced precision is (0.999)."""
    async with Engine(ModelSpec(model_id=str(bge_m3))) as engine:
        result = await engine.embeddings(EmbedAsk(TEXTS, dtype=ALL_THREE))
        facts = engine.describe()[0]
    worst = worst_differences(result, flag_reference)
    print(f"default ({facts['backend']} {facts['dtype']}) worst: {worst}")
    assert worst["dense_cosine"] >= 0.999 and worst["colbert_cosine"] >= 0.999
    assert worst["sparse_abs"] <= 0.05
