"""The engine's one call for an embeddings request (`Engine.embeddings`, what every dialect
translates to) and its similarity, in process: each answers what the engine's own parts
answer, so a route that only translates answers the same."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fake

from infinity_cloud import EmbedAsk, Engine
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.results import EmbeddingResult, EmbeddingsByType
from infinity_cloud.engine.asks import SimilarityAsk
from infinity_cloud.tasks import quantization

TEXTS = ["the first text", "a second, somewhat longer text", "third"]


async def test_an_ask_answers_as_the_engines_parts_do(tiny_embedder) -> None:
    async with Engine(fake(tiny_embedder, "emb")) as engine:
        plain = await engine.embeddings(EmbedAsk(TEXTS))
        floats = await engine.embeddings(EmbedAsk(TEXTS))
        by_type = await engine.embeddings(EmbedAsk(TEXTS, dtype=("float", "binary", "int8"), dimensions=16))
        cut = await engine.embeddings(EmbedAsk(TEXTS, dimensions=16))
        ranges = await engine.calibration(dimensions=16)
        similar = await engine.similarity(SimilarityAsk(TEXTS[0], TEXTS[1:]))
        raw = await engine.embeddings(EmbedAsk(TEXTS, normalize=True))
    assert isinstance(plain, EmbeddingResult) and plain.dtype == "float32"
    np.testing.assert_array_equal(plain.embeddings, floats.embeddings)
    assert isinstance(by_type, EmbeddingsByType) and list(by_type.by_type) == ["float", "binary", "int8"]
    np.testing.assert_array_equal(by_type.by_type["float"], cut.embeddings)  # the floats made once
    for kind, bounds in (("binary", None), ("int8", ranges)):
        want = quantization.quantize(cut.embeddings, kind, bounds)
        np.testing.assert_array_equal(by_type.by_type[kind], want)
    assert by_type.prompt_tokens == cut.prompt_tokens
    vectors = raw.embeddings
    np.testing.assert_allclose(similar.scores, vectors[1:] @ vectors[0], rtol=1e-6)
    assert similar.prompt_tokens == raw.prompt_tokens


async def test_an_ask_a_model_cannot_answer_is_refused_by_what_it_asked(tiny_embedder) -> None:
    async with Engine(fake(tiny_embedder, "emb")) as engine:
        with pytest.raises(UnsupportedError, match="sparse embeddings need a SPLADE model"):
            await engine.embeddings(EmbedAsk(TEXTS, accepts=(Capability.SPARSE,)))
        with pytest.raises(UnsupportedError, match="multi-vector"):
            await engine.embeddings(EmbedAsk(TEXTS, accepts=(Capability.MULTI_VECTOR,)))
        with pytest.raises(UnsupportedError, match="sparse embeddings are of text") as refused:
            await engine.embeddings(EmbedAsk(TEXTS, accepts=(Capability.SPARSE,), modality="image"))
    assert refused.value.param == "modality"
