"""The TEI (text-embeddings-inference) dialect: its routes, request and response shapes and
error shape, through the real app; huggingface_hub's InferenceClient against a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import cosines, fake, serve_in_process, spec_of
from tokenizers import Tokenizer

from infinity_cloud.core.config import ModelSpec

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
async def embedder_app(tiny_embedder: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_in_process(spec_of(fake(tiny_embedder, "emb"))) as client:
        yield client


@pytest.fixture(scope="module")
async def scorer_app(tiny_reranker: Path, tiny_classifier: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_in_process(spec_of(fake(tiny_reranker, "rr"), fake(tiny_classifier, "cl"))) as client:
        yield client


async def test_embed_gives_normalised_vectors_equal_to_ours(embedder_app: httpx.AsyncClient) -> None:
    ours = await embedder_app.post("/embeddings", json={"input": TEXTS})
    want = np.array([d["embedding"] for d in ours.json()["data"]])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    for inputs in (TEXTS, TEXTS[0]):
        response = await embedder_app.post("/embed", json={"inputs": inputs})
        assert response.status_code == 200, response.text
        got = np.array(response.json())
        assert got.shape == (len(inputs) if isinstance(inputs, list) else 1, 32)
        np.testing.assert_allclose(got, want[: len(got)], rtol=1e-5, atol=1e-6)
    root = await embedder_app.post("/", json={"inputs": TEXTS})  # TEI's route by model type
    np.testing.assert_allclose(np.array(root.json()), want, rtol=1e-5, atol=1e-6)


async def test_tokenize_and_decode(embedder_app: httpx.AsyncClient, tiny_embedder: Path) -> None:
    reference = Tokenizer.from_file(str(tiny_embedder / "tokenizer.json"))
    response = await embedder_app.post("/tokenize", json={"inputs": "hello world"})
    (tokens,) = response.json()
    assert [t["id"] for t in tokens] == reference.encode("hello world").ids
    assert tokens[0]["special"] and tokens[0]["start"] is None
    words = [t for t in tokens if not t["special"]]
    assert ["hello world"[t["start"]:t["stop"]] for t in words] == [t["text"] for t in words]
    ids = [t["id"] for t in tokens]
    decoded = await embedder_app.post("/decode", json={"ids": ids})
    assert decoded.json() == [reference.decode(ids)]
    both = await embedder_app.post("/decode", json={"ids": [ids, ids[:2]], "skip_special_tokens": False})
    assert both.json() == reference.decode_batch([ids, ids[:2]], skip_special_tokens=False)


async def test_info_describes_the_model(embedder_app: httpx.AsyncClient) -> None:
    info = (await embedder_app.get("/info")).json()
    assert info["model_id"] == "emb" and "embedding" in info["model_type"]
    assert info["max_input_length"] == 128


async def test_rerank_with_texts_answers_in_teis_shape(scorer_app: httpx.AsyncClient) -> None:
    docs = ["paris is in france", "bananas", "the capital of france is paris"]
    query = "capital of france"
    ours = await scorer_app.post("/rerank", json={"model": "rr", "query": query, "documents": docs})
    want = {r["index"]: r["relevance_score"] for r in ours.json()["results"]}
    response = await scorer_app.post(
        "/rerank", json={"model": "rr", "query": query, "texts": docs, "return_text": True})
    assert response.status_code == 200, response.text
    got = response.json()
    assert [r["index"] for r in got] == sorted(want, key=want.get, reverse=True)
    for r in got:
        assert r["score"] == pytest.approx(want[r["index"]]) and r["text"] == docs[r["index"]]


async def test_predict_and_root_on_a_classifier(scorer_app: httpx.AsyncClient) -> None:
    ours = (await scorer_app.post("/classify", json={"model": "cl", "input": ["good"]})).json()["data"][0]
    one = await scorer_app.post("/predict", json={"model": "cl", "inputs": "good"})
    assert one.json() == ours
    batch = await scorer_app.post("/", json={"model": "cl", "inputs": ["good", "good"]})
    assert batch.json() == [ours, ours]


@pytest.mark.parametrize(("route", "body", "status", "words"), [
    ("/embed", {"inputs": []}, 400, "empty"),
    ("/embed", {"inputs": "a", "truncation_direction": "left"}, 400, "truncation_direction left"),
    ("/embed", {"inputs": "a", "prompt_name": "nope"}, 400, "no prompt named 'nope'"),
    ("/embed", {"inputs": 3}, 422, "inputs"),
    ("/embed_sparse", {"inputs": "a"}, 400, "SPLADE"),
    ("/embed_all", {"inputs": "a"}, 400, "multi-vector (ColBERT) models"),
    ("/decode", {"ids": [10**7]}, 400, "outside the model's vocabulary"),
])
async def test_errors_come_in_teis_shape(
    embedder_app: httpx.AsyncClient, route: str, body: dict, status: int, words: str
) -> None:
    response = await embedder_app.post(route, json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) == {"error", "error_type"} and error["error_type"] == "Validation"
    assert words in error["error"]


async def test_a_tei_rerank_error_is_in_teis_shape(scorer_app: httpx.AsyncClient) -> None:
    response = await scorer_app.post("/rerank", json={"model": "rr", "query": "q", "texts": []})
    assert response.status_code == 400 and set(response.json()) == {"error", "error_type"}
    infinity_style = await scorer_app.post("/rerank", json={"model": "rr", "query": "q", "documents": []})
    assert infinity_style.status_code == 400 and "message" in infinity_style.json()["error"]


# -- real clients --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_server(live_server: str) -> str:
    """MiniLM, a reranker and a classifier: TEI clients send no model name, and each request
    goes to the one served model that does its task."""
    return live_server


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.mark.slow
def test_huggingface_hub_feature_extraction(
    minilm_server: str, minilm_reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import InferenceClient, constants

    # Offline mode (set for every test) blocks the client's requests to any URL, this one too.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(base_url=minilm_server)
    got = np.asarray(client.feature_extraction(TEXTS[1]), dtype=np.float64).reshape(1, -1)
    want = minilm_reference.encode([TEXTS[1]], normalize_embeddings=True)
    assert cosines(got, want).min() >= 0.9999


@pytest.mark.slow
def test_huggingface_hub_sentence_similarity_and_a_model_by_url(
    minilm_server: str, minilm_reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    got = InferenceClient(base_url=minilm_server).sentence_similarity(TEXTS[0], other_sentences=TEXTS)
    vectors = minilm_reference.encode(TEXTS, normalize_embeddings=True)
    # `dtype auto` serves bfloat16 where the CPU has it (AMX, AVX512-BF16): its similarities
    # are 1e-4 off float32's (1.3e-4 measured on a Xeon with AMX).
    served = {m["id"]: m for m in httpx.get(minilm_server + "/models").json()["data"]}["minilm"]
    np.testing.assert_allclose(got, vectors @ vectors[0], atol=1e-4 if served["dtype"] == "float32" else 2e-3)
    # `/` is ambiguous between an embedder and a classifier: the path names the model.
    # (The client keeps the first of TEI's label list for one text: the top label.)
    top = InferenceClient(model=minilm_server + "/models/classifier").text_classification(TEXTS[1])
    assert top.label in {"negative", "neutral", "positive"} and 0 < top.score < 1
    vector = InferenceClient(model=minilm_server + "/models/minilm").feature_extraction(TEXTS[1])
    assert cosines(np.asarray(vector, dtype=np.float64).reshape(1, -1), vectors[1:]).min() >= 0.9999


@pytest.mark.slow
def test_llama_index_text_embeddings_inference(minilm_server: str, minilm_reference) -> None:
    tei = pytest.importorskip("llama_index.embeddings.text_embeddings_inference")
    embedder = tei.TextEmbeddingsInference(base_url=minilm_server, model_name="minilm", timeout=60)
    got = np.asarray(embedder.get_text_embedding_batch(TEXTS), dtype=np.float64)
    want = minilm_reference.encode(TEXTS, normalize_embeddings=True)
    assert cosines(got, want).min() >= 0.9999


@pytest.mark.slow
def test_litellm_huggingface_embedding(minilm_server: str, minilm_reference) -> None:
    """litellm's `huggingface/` provider posts TEI's {"inputs"} to the base URL. It asks the
    Hub for the model's pipeline unless given the task as input_type (no network here)."""
    litellm = pytest.importorskip("litellm")
    response = litellm.embedding(model="huggingface/minilm", input=TEXTS, api_base=minilm_server,
                                 api_key="x", input_type="feature-extraction")
    got = np.asarray([d["embedding"] for d in response.data], dtype=np.float64)
    assert cosines(got, minilm_reference.encode(TEXTS, normalize_embeddings=True)).min() >= 0.9999


@pytest.mark.parametrize(("family", "options", "pooling"), [
    ("splade", {}, "splade"), ("colbert", {"strategy": "fixed", "attend": False}, "none"),
    ("bert_embedder", {"pooling": "cls"}, "cls"), ("bert_embedder", {}, "mean"),
])
async def test_info_describes_sparse_and_multi_vector_models_too(
    build_model, family: str, options: dict, pooling: str
) -> None:
    """TEI's /info for every family: an embedder's own pooling (it said mean for all); SPLADE
    is its "splade" pooling; a model of per-token vectors has none (it was a 500)."""
    model = ModelSpec(model_id=str(build_model(family, **options)), served_model_name="m", backend="torch")
    spec = spec_of(model)
    async with serve_in_process(spec) as client:
        response = await client.get("/info")
        assert response.status_code == 200, response.text
        assert response.json()["model_type"] == {"embedding": {"pooling": pooling}}


async def test_an_unserved_name_goes_to_the_one_model_that_does_the_task(
    tiny_embedder: Path, tiny_reranker: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TEI ignores the model name, so its clients send their own (mem0's sends "tei"): on TEI's
    routes such a name goes to the one served model that does the route's task, said in the log
    once per name; where several could, the 404 names what is served."""
    body = {"inputs": TEXTS, "model": "tei"}
    with caplog.at_level("WARNING", logger="infinity_cloud.engine"):
        async with serve_in_process(spec_of(fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"))) as client:
            named = await client.post("/embed", json={**body, "model": "emb"})
            for _ in range(2):
                taken = await client.post("/embed", json=body)
                assert taken.status_code == 200, taken.text
                assert taken.json() == named.json()
            ranked = await client.post("/rerank", json={"model": "tei", "query": "q", "texts": TEXTS})
            assert ranked.status_code == 200, ranked.text
            other = await client.post("/embed", json={**body, "model": "bge"})
            assert other.status_code == 200, other.text
    said = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
    assert sum("'tei'" in m and "'emb'" in m for m in said) == 1, said  # once, though asked twice
    assert sum("'tei'" in m and "'rr'" in m for m in said) == 1 and sum("'bge'" in m for m in said) == 1, said
    two = spec_of(fake(tiny_embedder, "emb"), fake(tiny_embedder, "emb2"), fake(tiny_reranker, "rr"))
    async with serve_in_process(two) as client:
        refused = await client.post("/embed", json=body)
    assert refused.status_code == 404, refused.text
    assert "emb" in refused.json()["error"] and "emb2" in refused.json()["error"]


async def test_similarity_takes_as_many_sentences_as_its_document_says(embedder_app: httpx.AsyncClient
                                                                       ) -> None:
    """The source sentence is embedded with the sentences, in the same count: the document's
    maxItems leaves room for it, and that many sentences are answered."""
    document = (await embedder_app.get("/openapi.json")).json()
    most = document["components"]["schemas"]["SimilarityInputs"]["properties"]["sentences"]["maxItems"]
    limit = (await embedder_app.get("/info")).json()["max_client_batch_size"]
    assert most == limit - 1
    body = {"model": "emb", "inputs": {"source_sentence": "a b", "sentences": ["a"] * most}}
    answered = await embedder_app.post("/similarity", json=body)
    assert answered.status_code == 200 and len(answered.json()) == most, answered.text
    body["inputs"]["sentences"].append("one more")
    assert (await embedder_app.post("/similarity", json=body)).status_code == 413


async def test_a_name_no_route_takes_is_a_404_in_a_shape_the_document_states(
    embedder_app: httpx.AsyncClient,
) -> None:
    """A line break ends a path parameter, so `/models/<name with one>` reaches no route: the
    app's 404 comes in our shape, which the document must state for TEI's route of that path."""
    answered = await embedder_app.post("/models/a%0Ab", json={"inputs": "a"})
    assert answered.status_code == 404 and isinstance(answered.json()["error"], dict), answered.text
    document = (await embedder_app.get("/openapi.json")).json()
    path = document["paths"]["/models/{model_id}"]  # one path, GET (the model) and POST (TEI's /)
    assert set(path) == {"get", "post"} and "/models/{name}" not in document["paths"]
    stated = path["post"]["responses"]["404"]["content"]["application/json"]
    assert "#/components/schemas/ErrorBody" in str(stated["schema"]), stated
