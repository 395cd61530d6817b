"""The GPU path's parts that CPU can check: heads run inside the torch backend's graph (the
same code as on the host, with torch for numpy), SPLADE's terms kept on the device with
nothing cut, a device out of memory answered as a retryable error, and `dtype auto` choosing
by measurement where a backend measures (torch on CUDA; here a CPU subclass that declares
candidates)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.backends.torch_backend import TorchBackend, out_of_memory_is_retryable
from infinity_cloud.core.errors import DeviceMemoryError
from infinity_cloud.core.family import DenseLayer
from infinity_cloud.core.results import SparseVector
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.families import read_model_info
from infinity_cloud.models import backend_choice
from infinity_cloud.numerics.heads import FINAL, Head, nonzero_terms
from infinity_cloud.numerics.inputs import ModelInputs
from infinity_cloud.numerics.pooling import supported_activation

RNG = np.random.default_rng(7)
# Three rows right-padded to 6 positions, one of them a single token; padding holds large
# values that would show in any pooling that read it.
STATES = RNG.standard_normal((3, 6, 8)).astype(np.float16)
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=np.int64)
STATES[MASK == 0] = 40.0
LAYERS = {
    name: DenseLayer(
        RNG.standard_normal((5, 8)).astype(np.float32), RNG.standard_normal(5).astype(np.float32), name
    )
    for name in ("Identity", "Tanh", "ReLU", "Sigmoid", "SiLU")
}
HEADS = [
    *(Head("pool", mode, normalize=normalize)
      for mode in ("mean", "cls", "max", "lasttoken", "mean_sqrt_len") for normalize in (False, True)),
    *(Head("pool", "mean", (layer,), normalize=True) for layer in LAYERS.values()),
    Head("pool", "cls", (LAYERS["Tanh"], DenseLayer(LAYERS["ReLU"].weight[:, :5], None, "Identity"))),
    Head("tokens", dense=(LAYERS["Identity"],), normalize=True),
    Head("vectors", normalize=True),
    FINAL,
]


@pytest.mark.parametrize("head", HEADS, ids=lambda h: f"{h.kind}-{h.pooling}-{len(h.dense)}-{h.normalize}")
def test_a_head_gives_the_same_rows_in_torch_as_in_numpy(head: Head) -> None:
    assert all(supported_activation(layer.activation) for layer in head.dense)
    want = head(STATES[:, 0] if head.kind == "vectors" else STATES, MASK)
    on_device = head.on_device(torch.as_tensor)
    states = torch.from_numpy(STATES)
    got = on_device(states[:, 0] if head.kind == "vectors" else states, torch.from_numpy(MASK), torch)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_sparse_terms_keep_every_non_zero_weight_in_both_libraries() -> None:
    weights = np.maximum(RNG.standard_normal((4, 300)).astype(np.float32), 0)
    weights[1] = 0.0  # a row with no term
    weights[2] = np.abs(weights[2]) + 0.1  # every term of the vocabulary: nothing may be cut
    for packed in (nonzero_terms(weights), nonzero_terms(torch.from_numpy(weights), torch).numpy()):
        assert packed.shape == (4, 2, 300)
        for row, (values, ids) in zip(weights, packed, strict=True):
            vector = SparseVector.from_terms(values, ids)
            assert list(vector.indices) == sorted(vector.indices)
            np.testing.assert_array_equal(vector.to_dense(300), row)
    assert Head("sparse").reference is FINAL  # precisions are compared on the dense weights


@pytest.fixture(scope="module")
def dense_embedder(build_model) -> Path:
    return build_model("bert_embedder", pooling="cls", dense_out=16)


@pytest.mark.parametrize("kind", ["dense_embedder", "decoder"])
async def test_the_torch_backend_pools_on_its_device_and_hands_back_rows(
    kind, dense_embedder, build_model
) -> None:
    """Only B x H leaves the graph, and the answer is still sentence-transformers'."""
    path = dense_embedder if kind == "dense_embedder" else build_model("decoder_embedder")
    texts = ["hello world", "a longer text with a few more words in it", "x"]
    spec = ModelSpec(served_model_name="m", model_id=str(path), backend="torch", dtype="float32")
    async with Engine([spec]) as engine:
        served = engine.models["m"]
        tower = served.loaded.towers["text"]
        inputs = ModelInputs.collate(served.loaded.tokenizer.encode(texts), served.loaded.tokenizer.pad_id)
        out = tower.backend.forward(inputs)
        assert out.shape == (3, served.loaded.info.dimensions)  # pooled (and Dense) in the graph
        got = (await engine.embeddings(EmbedAsk(texts, "m"))).embeddings
    want = SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_allocation_the_device_cannot_make_is_a_retryable_error() -> None:
    cpu = torch.device("cpu")
    with pytest.raises(DeviceMemoryError, match="not fit the cpu memory"), out_of_memory_is_retryable(cpu):
        torch.empty(2**50, dtype=torch.float32)  # 4 PiB: a real allocation failure
    with pytest.raises(RuntimeError, match="shape"), out_of_memory_is_retryable(cpu):
        torch.zeros(2, 3) @ torch.zeros(4, 5)  # any other error stays what it is


# -- dtype auto by measurement --------------------------------------------------------------


class MeasuringTorch(TorchBackend):
    """The torch backend on CPU as it is on CUDA: `dtype auto` measures float32 and bfloat16.
    `backend_options` slow float32 down (`slow_float32_s`) or make bfloat16 disagree
    (`noisy_bfloat16`), so that which one must win is known."""

    loads: list[str] = []

    def __init__(self, info: Any, spec: ModelSpec, graph: Any = None) -> None:
        super().__init__(info, spec, graph)
        MeasuringTorch.loads.append(self.dtype)

    @classmethod
    def auto_dtypes(cls, spec: ModelSpec) -> tuple[str, ...]:
        return ("float32", "bfloat16")

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        out = super().forward(inputs)
        options = self.spec.backend_options
        if self.dtype == "float32":
            time.sleep(float(options.get("slow_float32_s", 0)))
        elif options.get("noisy_bfloat16"):
            out = out + np.random.default_rng(0).standard_normal(out.shape).astype(np.float32)
        return out


def verdicts(cache: Path) -> list[dict[str, Any]]:
    return [json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["metadata"]
            for folder in cache.glob("dtype-choice-*") if folder.is_dir()]


@pytest.mark.parametrize(("options", "served"), [
    ({"slow_float32_s": 0.6}, "bfloat16"),  # the faster one, as it agrees (emulated bf16: ~0.2 s)
    ({"slow_float32_s": 0.6, "noisy_bfloat16": 1}, "float32"),  # faster, but it disagrees
])
async def test_dtype_auto_serves_the_fastest_precision_that_agrees(
    options, served, tiny_embedder, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("INFINITY_CLOUD_CACHE", str(tmp_path))
    spec = ModelSpec(served_model_name="m", model_id=str(tiny_embedder),
                     backend="test_device_heads:MeasuringTorch", dtype="auto", backend_options=options)
    MeasuringTorch.loads.clear()
    async with Engine([spec]) as engine:
        facts = engine.describe()[0]
        assert facts["dtype"] == served
        assert (facts["agreement_with_float32"] is None) == (served == "float32")
        vector = (await engine.embeddings(EmbedAsk(["hello"], "m"))).embeddings[0]
        assert abs(float(np.linalg.norm(vector)) - 1) < 1e-2
    assert MeasuringTorch.loads == ["float32", "bfloat16", served]  # each measured, then served
    (verdict,) = verdicts(tmp_path)
    measured = verdict["measured"]
    assert verdict["dtype"] == served and set(measured) == {"float32", "bfloat16"}
    assert measured["float32"]["seconds"] >= 0.6 and measured["float32"]["agreement"] == pytest.approx(1.0)
    assert (measured["bfloat16"]["agreement"] >= 0.999) == (served == "bfloat16")

    MeasuringTorch.loads.clear()  # the next start reads the verdict: one load, no timing
    async with Engine([spec]) as engine:
        assert engine.describe()[0]["dtype"] == served
    assert MeasuringTorch.loads == [served]


def test_the_timing_batch_has_a_busy_servers_shape(tiny_embedder) -> None:
    info = read_model_info(tiny_embedder, None)
    probes = ModelInputs({name: np.ones((5, 7), np.int64) for name in ("input_ids", "attention_mask")})
    batch = backend_choice.timing_batch(probes, info.max_length)
    assert batch.input_ids.shape == (32, min(256, info.max_length))
    assert batch.attention_mask.shape == batch.input_ids.shape
    images = ModelInputs({"pixel_values": np.zeros((3, 3, 8, 8), np.float32)})
    assert backend_choice.timing_batch(images, 512).arrays["pixel_values"].shape == (32, 3, 8, 8)
