"""Which served model a request means: with several, a request that names none goes to the
one that does its task (or the one marked `default`, else the first listed of them); names and
aliases resolve; an unknown name is a 404 naming every name served. Through the real app."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fake, serve_in_process, spec_of

from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.core.errors import ConfigError


async def test_a_request_naming_no_model_goes_to_the_model_that_does_its_task(
    tiny_embedder: Path, tiny_reranker: Path
) -> None:
    spec = spec_of(fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"))
    async with serve_in_process(spec) as client:
        embedded = await client.post("/v1/embeddings", json={"input": ["hello"]})
        assert embedded.status_code == 200 and embedded.json()["model"] == "emb"
        for route, body in (("/rerank", {"query": "q", "documents": ["a", "b"]}),
                            ("/rerank", {"query": "q", "texts": ["a", "b"]}),  # TEI
                            ("/v2/rerank", {"query": "q", "documents": ["a", "b"]})):  # Cohere
            response = await client.post(route, json=body)
            assert response.status_code == 200, (route, response.text)
        for route, body in (("/embed", {"inputs": ["hello"]}), ("/", {"inputs": "hello"}),
                            ("/v2/embed", {"texts": ["hello"], "input_type": "search_query"}),
                            ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["a", "b"]}}),
                            ("/invocations", {"input": ["hello"]}), ("/tokenize", {"inputs": "hello"})):
            response = await client.post(route, json=body)
            assert response.status_code == 200, (route, response.text)
        nobody = await client.post("/classify", json={"input": ["hello"]})
        assert nobody.status_code == 404
        assert "no served model does classification" in nobody.json()["error"]["message"]


async def test_similarity_is_the_cosine_of_the_embeddings(tiny_embedder: Path) -> None:
    import numpy as np

    async with serve_in_process(spec_of(fake(tiny_embedder, "emb"))) as client:
        sentences = ["a cat", "a dog", "a cat"]
        vectors = np.array([d["embedding"] for d in (await client.post(
            "/embeddings", json={"input": ["a cat", *sentences]})).json()["data"]])
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        body = {"inputs": {"source_sentence": "a cat", "sentences": sentences}}
        for route in ("/similarity", "/"):  # huggingface_hub's sentence_similarity posts to /
            got = (await client.post(route, json=body)).json()
            np.testing.assert_allclose(got, vectors[1:] @ vectors[0], rtol=1e-5, atol=1e-6)
        assert got[2] == pytest.approx(1.0, abs=1e-6)
        empty = await client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}})
        assert empty.status_code == 400


@pytest.mark.parametrize(("default", "served"), [(None, "first"), ("second", "second")])
async def test_among_several_that_can_the_default_then_the_first_listed(
    tiny_embedder: Path, default: str | None, served: str
) -> None:
    models = [fake(tiny_embedder, name).model_copy(update={"default": name == default})
              for name in ("first", "second")]
    async with serve_in_process(spec_of(*models)) as client:
        response = await client.post("/v1/embeddings", json={"input": ["hello"]})
        assert response.json()["model"] == served


async def test_aliases_resolve_and_answers_carry_the_served_name(
    tiny_embedder: Path, tiny_reranker: Path
) -> None:
    embedder = fake(tiny_embedder, "emb,text-embedding-3-small, tei")
    assert embedder.name == "emb" and embedder.aliases == ("text-embedding-3-small", "tei")
    async with serve_in_process(spec_of(embedder, fake(tiny_reranker, "rr"))) as client:
        for name in ("emb", "text-embedding-3-small", "tei"):
            response = await client.post("/v1/embeddings", json={"model": name, "input": ["hello"]})
            assert response.status_code == 200 and response.json()["model"] == "emb"
        unknown = await client.post("/v1/embeddings", json={"model": "gpt-4", "input": ["hello"]})
        assert unknown.status_code == 404
        assert "emb, text-embedding-3-small, tei, rr" in unknown.json()["error"]["message"]
        listed = (await client.get("/models")).json()["data"]
        assert next(m for m in listed if m["id"] == "emb")["aliases"] == ["text-embedding-3-small", "tei"]


def test_a_name_used_twice_among_names_and_aliases_is_refused(tiny_embedder: Path) -> None:
    with pytest.raises((ConfigError, ValueError), match="repeated: tei"):
        DeploymentSpec(models=(ModelSpec(model_id="a", served_model_name="a,tei"),
                               ModelSpec(model_id="b", aliases=("tei",))))
