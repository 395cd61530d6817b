"""Static-shape buckets: batches are padded to fixed lengths and row counts (for compiled
graphs), and the answers are the same as with dynamic shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.backends.torch_backend import TorchBackend
from infinity_cloud.core.config import build_spec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.engine.asks import EmbedAsk

TEXTS = ["short", "a somewhat longer sentence about nothing much at all", "x " * 40, "mid length text here"]


async def embed(path: Path, **options: object) -> np.ndarray:
    async with Engine(ModelSpec(model_id=str(path), backend="torch", dtype="float32", **options)) as engine:
        return (await engine.embeddings(EmbedAsk(TEXTS))).embeddings


async def test_bucketed_batches_have_static_shapes_and_the_same_results(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shapes: list[tuple[int, int]] = []
    forward = TorchBackend.forward

    def recording(self: TorchBackend, inputs):  # type: ignore[no-untyped-def]
        shapes.append(inputs.input_ids.shape)
        return forward(self, inputs)

    dynamic = await embed(tiny_embedder)
    monkeypatch.setattr(TorchBackend, "forward", recording)
    static = await embed(tiny_embedder, length_buckets=(16, 64, 128), batch_buckets=(2, 8))
    assert shapes and all(rows in (2, 8) and length in (16, 64, 128) for rows, length in shapes)
    assert static.shape == dynamic.shape
    np.testing.assert_allclose(static, dynamic, atol=1e-5)


async def test_inputs_are_truncated_to_the_largest_length_bucket(tiny_embedder: Path) -> None:
    async with Engine(ModelSpec(model_id=str(tiny_embedder), backend="torch", length_buckets=(8,))) as engine:
        result = await engine.embeddings(EmbedAsk(["word " * 50]))
        assert result.prompt_tokens == 8


def test_buckets_parse_from_a_flag_string_sorted_and_unique() -> None:
    assert ModelSpec(length_buckets="512, 128,256,128").length_buckets == (128, 256, 512)


def test_a_non_positive_bucket_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="bucket"):
        build_spec({"models": [{"batch_buckets": [0, 8]}]})


async def test_under_concurrent_load_only_the_declared_shapes_reach_the_backend(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a compiled backend (Neuron) needs: whatever the requests' sizes and lengths and
    however they interleave, every batch has one of the declared (rows, length) shapes."""
    import asyncio
    import random

    shapes: set[tuple[int, int]] = set()
    forward = TorchBackend.forward

    def recording(self: TorchBackend, inputs):  # type: ignore[no-untyped-def]
        shapes.add(inputs.input_ids.shape)
        return forward(self, inputs)

    monkeypatch.setattr(TorchBackend, "forward", recording)
    rng = random.Random(7)
    def text() -> str:
        return " ".join(["word"] * rng.randint(1, 150))

    requests = [[text() for _ in range(rng.randint(1, 12))] for _ in range(40)]
    spec = ModelSpec(model_id=str(tiny_embedder), backend="torch", dtype="float32",
                     length_buckets=(16, 64, 128), batch_buckets=(1, 4, 16))
    async with Engine(spec) as engine:
        results = await asyncio.gather(*(engine.embeddings(EmbedAsk(texts)) for texts in requests))
    assert [r.embeddings.shape[0] for r in results] == [len(texts) for texts in requests]
    allowed = {(rows, length) for rows in (1, 4, 16) for length in (16, 64, 128)}
    assert shapes and shapes <= allowed, shapes - allowed
