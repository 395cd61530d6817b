"""The real client libraries against a real server process (`live_server`).

Each client is used the way its users call it, unchanged: the OpenAI SDK (which asks for
base64 unless told otherwise), Cohere's v1 and v2 clients, the generated `infinity_client`,
and langchain's `InfinityEmbeddings` / `InfinityRerank` when langchain-community is
installed. Answers are checked against the reference libraries on the same model folders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from conftest import cosines, server_process, wait_for_ranges

cohere = pytest.importorskip("cohere")
openai = pytest.importorskip("openai")
pytest.importorskip("infinity_client")

from infinity_client import Client as InfinityClient  # noqa: E402
from infinity_client.api.default import classify as infinity_classify  # noqa: E402
from infinity_client.api.default import embeddings as infinity_embeddings  # noqa: E402
from infinity_client.api.default import models as infinity_models  # noqa: E402
from infinity_client.api.default import rerank as infinity_rerank  # noqa: E402
from infinity_client.models import (  # noqa: E402
    ClassifyInput,
    ClassifyResult,
    OpenAIEmbeddingInputText,
    OpenAIEmbeddingResult,
    OpenAIModelInfo,
    RerankInput,
    ReRankResult,
)

pytestmark = pytest.mark.slow

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and London is the capital of England.",
    "a",
    "Embedding models map text to vectors; rerankers score a query against documents. " * 4,
]
QUERY = "what is the capital of france"
DOCUMENTS = [
    "the weather is sunny today",
    "paris is the capital of france",
    "dogs and cats are animals",
    "london is a city",
    "the capital of france is a large city",
]


# -- references ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def reranker_reference(tiny_reranker: Path) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(tiny_reranker), device="cpu")
    return np.asarray(model.predict([(QUERY, d) for d in DOCUMENTS], activation_fn=torch.nn.Sigmoid()))


@pytest.fixture(scope="module")
def classifier_reference(tiny_classifier: Path):
    """softmax(logits) and the label names, straight from transformers."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_classifier))
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_classifier)).eval()

    def reference(texts: list[str]) -> tuple[np.ndarray, dict[int, str]]:
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**batch).logits
        return torch.softmax(logits, -1).numpy(), model.config.id2label

    return reference


def reference_embeddings(reference, texts: list[str]) -> np.ndarray:
    return reference.encode(texts, convert_to_numpy=True, normalize_embeddings=False)


def assert_same_vectors(got, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    cosine = cosines(got, want)
    assert cosine.min() >= 0.9999, cosine


def token_count(reference, texts: list[str]) -> int:
    encoded = reference.tokenizer(texts, truncation=True, max_length=reference.max_seq_length)
    return sum(len(ids) for ids in encoded["input_ids"])


# -- OpenAI ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openai_client(live_server: str):
    client = openai.OpenAI(base_url=live_server + "/v1", api_key="x", max_retries=0)
    yield client
    client.close()


def test_openai_default_asks_for_base64_and_decodes_it(openai_client, minilm_reference) -> None:
    raw = openai_client.embeddings.with_raw_response.create(model="minilm", input=TEXTS)
    sent = json.loads(raw.http_request.content)
    assert sent["encoding_format"] == "base64"
    assert all(isinstance(d["embedding"], str) for d in raw.http_response.json()["data"])

    response = raw.parse()
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    assert_same_vectors([d.embedding for d in response.data], reference_embeddings(minilm_reference, TEXTS))
    assert response.model == "minilm"
    assert response.usage.prompt_tokens == token_count(minilm_reference, TEXTS)
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_openai_float_format(openai_client, minilm_reference) -> None:
    response = openai_client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    assert_same_vectors([d.embedding for d in response.data], reference_embeddings(minilm_reference, TEXTS))
    assert response.usage.prompt_tokens == token_count(minilm_reference, TEXTS)


def test_openai_single_string_input(openai_client, minilm_reference) -> None:
    response = openai_client.embeddings.create(model="minilm", input="hello world")
    assert len(response.data) == 1
    assert_same_vectors([response.data[0].embedding], reference_embeddings(minilm_reference, ["hello world"]))


def test_openai_dimensions_truncate_and_renormalise(openai_client, minilm_reference) -> None:
    response = openai_client.embeddings.create(model="minilm", input=TEXTS[:2], dimensions=64)
    got = np.asarray([d.embedding for d in response.data])
    full = reference_embeddings(minilm_reference, TEXTS[:2])[:, :64]
    assert got.shape == (2, 64)
    assert_same_vectors(got, full)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [([], "'input' is empty"), (["fine", ""], "'input' item 1 is an empty string")],
)
def test_openai_sdk_raises_bad_request_with_our_message(openai_client, inputs, message) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.embeddings.create(model="minilm", input=inputs)
    assert caught.value.status_code == 400
    assert message in caught.value.message
    assert caught.value.body["type"] == "invalid_request_error"
    assert caught.value.body["param"] == "input"


def test_openai_sdk_unknown_model_is_not_found(openai_client) -> None:
    with pytest.raises(openai.NotFoundError, match="not served here"):
        openai_client.embeddings.create(model="no-such-model", input=["x"])


def test_mem0_huggingface_embedder_sends_tei_and_is_answered(openai_client, minilm_reference) -> None:
    """mem0's HuggingFaceEmbedding (mem0/embeddings/huggingface.py, with huggingface_base_url
    set as its docs show: "http://host/v1") calls the OpenAI SDK as
    `embeddings.create(input=text, model="tei")`, a name it cannot change. TEI ignores it; here,
    with an embedder, a reranker and a classifier served, it goes to the one embedder."""
    text = TEXTS[1]
    answer = openai_client.embeddings.create(input=text, model="tei")
    assert answer.model == "minilm"
    assert_same_vectors([answer.data[0].embedding], reference_embeddings(minilm_reference, [text]))


def test_openai_sdk_lists_models(openai_client) -> None:
    ids = {m.id for m in openai_client.models.list()}
    assert ids == {"minilm", "reranker", "classifier"}


# -- Cohere ----------------------------------------------------------------------------


def check_top_two(results, reference: np.ndarray) -> None:
    want = np.argsort(-reference)[:2]
    assert [r.index for r in results] == list(want)
    for r in results:
        assert r.relevance_score == pytest.approx(float(reference[r.index]), abs=1e-4)


def test_cohere_v2_rerank(live_server: str, reranker_reference: np.ndarray) -> None:
    client = cohere.ClientV2(api_key="x", base_url=live_server, max_retries=0)
    response = client.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, top_n=2)
    assert len(response.results) == 2
    check_top_two(response.results, reranker_reference)
    assert response.id


def test_cohere_v1_rerank(live_server: str, reranker_reference: np.ndarray) -> None:
    client = cohere.Client(api_key="x", base_url=live_server, max_retries=0)
    response = client.rerank(
        model="reranker", query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True
    )
    assert len(response.results) == 2
    check_top_two(response.results, reranker_reference)
    for r in response.results:
        assert r.document.text == DOCUMENTS[r.index]


def test_cohere_error_is_raised_as_bad_request(live_server: str) -> None:
    client = cohere.ClientV2(api_key="x", base_url=live_server, max_retries=0)
    with pytest.raises(cohere.BadRequestError) as caught:
        client.rerank(model="reranker", query=QUERY, documents=[])
    assert "'documents' is empty" in json.dumps(caught.value.body)


def test_cohere_v2_embed_by_type(live_server: str, minilm_reference) -> None:
    client = cohere.ClientV2(api_key="x", base_url=live_server, max_retries=0)
    response = client.embed(model="minilm", texts=TEXTS, input_type="search_document",
                            embedding_types=["float", "ubinary", "binary"])
    want = reference_embeddings(minilm_reference, TEXTS)
    assert_same_vectors(response.embeddings.float_, want)
    # sentence-transformers' quantize_embeddings layout: a sign bit per dimension, packed
    packed = np.packbits(np.asarray(response.embeddings.float_) > 0, axis=-1)
    assert np.array_equal(np.asarray(response.embeddings.ubinary), packed)
    assert np.array_equal(np.asarray(response.embeddings.binary), packed.astype(int) - 128)
    # against the reference's own bits: only values within rounding of zero may flip
    flipped = np.unpackbits(packed ^ np.packbits(want > 0, axis=-1)).sum()
    assert flipped <= 0.01 * want.size, flipped
    assert response.texts == TEXTS and response.meta.billed_units.input_tokens == token_count(
        minilm_reference, TEXTS)


def test_cohere_v2_embed_int8_and_uint8(live_server: str, minilm_reference) -> None:
    """Calibrated per model, offline: the server's int8/uint8 are sentence-transformers'
    `quantize_embeddings` of the reference vectors with ranges calibrated on the same
    texts, up to a step or two where bfloat16 and float32 round differently (MiniLM's three
    dead dimensions, whose range is 1e-32, excepted: there rounding is all there is)."""
    from sentence_transformers.quantization import quantize_embeddings

    from infinity_cloud.tasks.quantization import calibration_texts

    wait_for_ranges(live_server, "minilm")  # the first int8 request starts it, with a 503
    client = cohere.ClientV2(api_key="x", base_url=live_server, max_retries=0)
    response = client.embed(model="minilm", texts=TEXTS, input_type="search_document",
                            embedding_types=["int8", "uint8", "float"])
    calibration = reference_embeddings(minilm_reference, calibration_texts())
    ranges = np.stack([calibration.min(axis=0), calibration.max(axis=0)])
    want = reference_embeddings(minilm_reference, TEXTS)
    live = ranges[1] - ranges[0] > 1e-6
    for kind, got in (("int8", response.embeddings.int8), ("uint8", response.embeddings.uint8)):
        expected = quantize_embeddings(want, kind, ranges=ranges).astype(int)
        steps = np.abs(np.asarray(got, dtype=int) - expected)[:, live]
        assert steps.max() <= 3 and steps.mean() < 0.5, (kind, steps.max(), steps.mean())
    # The quantised vectors still rank as the floats do: each text nearest itself.
    ints = np.asarray(response.embeddings.int8, dtype=np.float32)
    assert (np.argmax(ints @ want.T, axis=1) == np.arange(len(TEXTS))).all()


def test_cohere_v1_embed_floats(live_server: str, minilm_reference) -> None:
    client = cohere.Client(api_key="x", base_url=live_server, max_retries=0)
    response = client.embed(model="minilm", texts=TEXTS[:3], input_type="search_query")
    assert response.response_type == "embeddings_floats"
    assert_same_vectors(response.embeddings, reference_embeddings(minilm_reference, TEXTS[:3]))


@pytest.mark.parametrize(("options", "message"), [
    ({"embedding_types": ["int4"]}, "embedding type 'int4' is not served"),
    ({"truncate": "START"}, "truncate START"),
    ({"embedding_types": ["float"], "truncate": "NONE", "texts": ["word " * 400]}, "limit of 256"),
])
def test_cohere_embed_refusals_are_bad_requests(
    live_server: str, options: dict[str, Any], message: str
) -> None:
    client = cohere.ClientV2(api_key="x", base_url=live_server, max_retries=0)
    with pytest.raises(cohere.BadRequestError) as caught:
        client.embed(**{"model": "minilm", "texts": ["hello"], "input_type": "search_query", **options})
    assert message in json.dumps(caught.value.body)


@pytest.mark.parametrize("top_k", [2, None])
def test_voyageai_rerank(live_server: str, reranker_reference: np.ndarray, top_k: int | None) -> None:
    voyageai = pytest.importorskip("voyageai")
    client = voyageai.Client(api_key="x", base_url=live_server + "/v1", max_retries=0)
    ranked = client.rerank(QUERY, DOCUMENTS, model="reranker", top_k=top_k)
    assert len(ranked.results) == (top_k or len(DOCUMENTS))
    check_top_two(ranked.results[:2], reranker_reference)
    assert all(r.document == DOCUMENTS[r.index] for r in ranked.results)


@pytest.fixture(scope="module")
def voyage(live_server: str):
    voyageai = pytest.importorskip("voyageai")
    return voyageai.Client(api_key="x", base_url=live_server + "/v1", max_retries=0)


def test_voyageai_embed_floats_and_dimensions(voyage, minilm_reference) -> None:
    want = reference_embeddings(minilm_reference, TEXTS)
    assert_same_vectors(voyage.embed(TEXTS, model="minilm", input_type="document").embeddings, want)
    cut = np.asarray(voyage.embed(TEXTS, model="minilm", output_dimension=128).embeddings)
    assert cut.shape == (len(TEXTS), 128)  # Matryoshka truncation, re-normalised as the model normalises
    assert_same_vectors(cut, want[:, :128] / np.linalg.norm(want[:, :128], axis=1, keepdims=True))


def test_voyageai_embed_quantised_types_are_what_cohere_gets(voyage, live_server: str) -> None:
    """Voyage's client decodes base64 by the output_dtype it asked for: int8 and uint8 are the
    calibrated vectors Cohere's embedding_types get, binary and ubinary their packed sign bits."""
    wait_for_ranges(live_server, "minilm")
    cohere_client = cohere.ClientV2(api_key="x", base_url=live_server, max_retries=0)
    by_type = cohere_client.embed(model="minilm", texts=TEXTS, input_type="search_document",
                                  embedding_types=["int8", "uint8", "binary", "ubinary"]).embeddings
    for kind in ("int8", "uint8", "binary", "ubinary"):
        got = voyage.embed(TEXTS, model="minilm", output_dtype=kind).embeddings
        assert np.array_equal(np.asarray(got), np.asarray(getattr(by_type, kind))), kind
    with_dimensions = voyage.embed(TEXTS, model="minilm", output_dtype="ubinary", output_dimension=128)
    assert np.asarray(with_dimensions.embeddings).shape == (len(TEXTS), 16)  # 128 bits a vector


# -- litellm ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm():
    return pytest.importorskip("litellm")


EMBEDDING_BASES = [("openai", "/v1"), ("cohere", "/v2/embed"), ("infinity", "")]


@pytest.mark.parametrize(("provider", "suffix"), EMBEDDING_BASES)
def test_litellm_embedding(litellm, live_server: str, minilm_reference, provider: str, suffix: str) -> None:
    base = live_server + suffix
    response = litellm.embedding(model=f"{provider}/minilm", input=TEXTS, api_base=base, api_key="x")
    got = [item["embedding"] for item in sorted(response.data, key=lambda item: item["index"])]
    assert_same_vectors(got, reference_embeddings(minilm_reference, TEXTS))


def test_litellm_embedding_null_encoding_format(litellm, live_server: str, minilm_reference) -> None:
    """litellm passes encoding_format through as given, null included (dspy does this)."""
    response = litellm.embedding(model="openai/minilm", input=TEXTS[:2], api_base=live_server + "/v1",
                                 api_key="x", encoding_format=None)
    got = [d["embedding"] for d in response.data]
    assert_same_vectors(got, reference_embeddings(minilm_reference, TEXTS[:2]))


@pytest.mark.parametrize(("provider", "suffix"), [
    ("infinity", ""), ("cohere", ""), ("hosted_vllm", "/v1"), ("huggingface", ""),
])
def test_litellm_rerank(
    litellm, live_server: str, reranker_reference: np.ndarray, provider: str, suffix: str
) -> None:
    """Each provider's route and document shape: Infinity's string at /rerank, Cohere's
    {"text"} at /v2/rerank, vLLM's {"text"} at /v1/rerank, TEI's `texts` with `top_n` and
    `return_text` at /rerank (litellm's huggingface/ provider)."""
    response = litellm.rerank(model=f"{provider}/reranker", query=QUERY, documents=DOCUMENTS, top_n=2,
                              api_base=live_server + suffix, api_key="x", return_documents=True)
    results = [type("R", (), r)() for r in response.results]
    check_top_two(results, reranker_reference)
    assert [r.document["text"] for r in results] == [DOCUMENTS[r.index] for r in results]


# -- infinity_client ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def infinity(live_server: str):
    with InfinityClient(base_url=live_server, raise_on_unexpected_status=True, timeout=60) as client:
        yield client


def test_infinity_client_embeddings(infinity, minilm_reference) -> None:
    body = OpenAIEmbeddingInputText(input_=TEXTS, model="minilm")
    result = infinity_embeddings.sync(client=infinity, body=body)
    assert isinstance(result, OpenAIEmbeddingResult)
    assert [d.index for d in result.data] == list(range(len(TEXTS)))
    assert_same_vectors([d.embedding for d in result.data], reference_embeddings(minilm_reference, TEXTS))
    assert result.usage.prompt_tokens == token_count(minilm_reference, TEXTS)


async def test_infinity_client_async_embeddings(live_server: str, minilm_reference) -> None:
    async with InfinityClient(base_url=live_server, raise_on_unexpected_status=True, timeout=60) as client:
        result = await infinity_embeddings.asyncio(
            client=client, body=OpenAIEmbeddingInputText(input_="hello world", model="minilm")
        )
    assert isinstance(result, OpenAIEmbeddingResult)
    assert_same_vectors([result.data[0].embedding], reference_embeddings(minilm_reference, ["hello world"]))


def test_infinity_client_rerank(infinity, reranker_reference: np.ndarray) -> None:
    body = RerankInput(query=QUERY, documents=DOCUMENTS, model="reranker", top_n=2, return_documents=True)
    result = infinity_rerank.sync(client=infinity, body=body)
    assert isinstance(result, ReRankResult)
    check_top_two(result.results, reranker_reference)
    assert [r.document for r in result.results] == [DOCUMENTS[r.index] for r in result.results]

    everything = infinity_rerank.sync(client=infinity, body=RerankInput(query=QUERY, documents=DOCUMENTS,
                                                                        model="reranker"))
    assert sorted(r.index for r in everything.results) == list(range(len(DOCUMENTS)))
    scores = [r.relevance_score for r in everything.results]
    assert scores == sorted(scores, reverse=True)


def test_infinity_client_classify(infinity, classifier_reference) -> None:
    texts = ["hello world", "the weather is sunny today"]
    result = infinity_classify.sync(client=infinity, body=ClassifyInput(input_=texts, model="classifier"))
    assert isinstance(result, ClassifyResult)
    probs, id2label = classifier_reference(texts)
    for row, want in zip(result.data, probs, strict=True):
        assert [o.score for o in row] == sorted((o.score for o in row), reverse=True)
        got = {o.label: o.score for o in row}
        assert set(got) == set(id2label.values())
        for i, p in enumerate(want):
            assert got[id2label[i]] == pytest.approx(float(p), abs=1e-4)


def test_infinity_client_validation_error_parses(infinity) -> None:
    """A 422 carries FastAPI's `detail` list, which the client parses."""
    from infinity_client.models import HTTPValidationError

    response = infinity_embeddings.sync_detailed(
        client=infinity, body=OpenAIEmbeddingInputText(input_=["x"], model="minilm", dimensions="x")  # type: ignore[arg-type]
    )
    assert response.status_code == 422
    assert isinstance(response.parsed, HTTPValidationError)
    assert response.parsed.detail


def test_infinity_client_lists_models(infinity) -> None:
    result = infinity_models.sync(client=infinity)
    assert isinstance(result, OpenAIModelInfo)
    assert {m.id for m in result.data} == {"minilm", "reranker", "classifier"}


def test_openai_sdk_retrieves_a_model(openai_client) -> None:
    model = openai_client.models.retrieve("minilm")
    assert (model.id, model.object) == ("minilm", "model")
    with pytest.raises(openai.NotFoundError, match="not served here"):
        openai_client.models.retrieve("org/no-such-model")  # an id holding '/' reaches the route


def test_openai_null_optional_fields_mean_their_defaults(live_server: str, minilm_reference) -> None:
    """litellm (and so dspy) sends `encoding_format: null`."""
    body = {"model": "minilm", "input": TEXTS[:2], "encoding_format": None, "dimensions": None, "user": None}
    response = httpx.post(live_server + "/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    assert_same_vectors([d["embedding"] for d in response.json()["data"]],
                        reference_embeddings(minilm_reference, TEXTS[:2]))


def test_llama_index_openai_like_embedding(live_server: str, minilm_reference) -> None:
    openai_like = pytest.importorskip("llama_index.embeddings.openai_like")
    embedder = openai_like.OpenAILikeEmbedding(model_name="minilm", api_base=live_server + "/v1", api_key="x")
    got = embedder.get_text_embedding_batch(TEXTS)
    assert_same_vectors(got, reference_embeddings(minilm_reference, TEXTS))


def test_haystack_openai_text_embedder(live_server: str, minilm_reference) -> None:
    embedders = pytest.importorskip("haystack.components.embedders")
    from haystack.utils import Secret

    embedder = embedders.OpenAITextEmbedder(
        api_base_url=live_server + "/v1", model="minilm", api_key=Secret.from_token("x"))
    got = embedder.run(text=TEXTS[2])["embedding"]
    assert_same_vectors([got], reference_embeddings(minilm_reference, TEXTS[2:3]))


# -- langchain ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [8191, 5])
def test_langchain_openai_default_sends_token_ids_and_gets_the_texts_vectors(
    live_server: str, minilm_reference, cl100k, chunk: int
) -> None:
    """OpenAIEmbeddings' default counts with tiktoken and sends cl100k_base token ids (in
    chunks of `embedding_ctx_length`, averaged back per text): read as text, not as ids of
    MiniLM's vocabulary. At 5 tokens a chunk, langchain averages the chunks' vectors itself."""
    lc_openai = pytest.importorskip("langchain_openai")
    sent: list[Any] = []

    class Recording(httpx.Client):
        def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
            sent.append(json.loads(request.content))
            return super().send(request, **kwargs)

    embedder = lc_openai.OpenAIEmbeddings(
        model="minilm", base_url=live_server + "/v1", api_key="x", max_retries=0,
        embedding_ctx_length=chunk, http_client=Recording(),
    )
    assert embedder.check_embedding_ctx_length  # the default being tested
    got = embedder.embed_documents(TEXTS)
    assert all(isinstance(item, list) and isinstance(item[0], int) for body in sent for item in body["input"])
    if chunk == 5:
        return  # chunk averages are langchain's own maths, not the texts' vectors
    assert_same_vectors(got, reference_embeddings(minilm_reference, TEXTS))
    assert_same_vectors([embedder.embed_query(QUERY)], reference_embeddings(minilm_reference, [QUERY]))


def test_own_vocabulary_setting_refuses_openai_sdk_token_ids(minilm_dir: Path, cl100k) -> None:
    """--token-ids model reads ids as MiniLM's own: an OpenAI SDK client's cl100k_base ids
    would then be other text, so they get a 400 naming the fix instead of wrong vectors."""
    lc_openai = pytest.importorskip("langchain_openai")
    args = ("--model-id", str(minilm_dir), "--served-model-name", "minilm", "--token-ids", "model")
    with server_process(*args) as url:
        embedder = lc_openai.OpenAIEmbeddings(
            model="minilm", base_url=url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="--token-ids openai"):
            embedder.embed_documents(["hello world"])
        plain = httpx.post(url + "/v1/embeddings", json={"input": [[7592, 2088]]})  # not an OpenAI SDK
        assert plain.status_code == 200 and plain.json()["usage"]["prompt_tokens"] == 4


def test_langchain_infinity_embeddings(live_server: str, minilm_reference) -> None:
    lc = pytest.importorskip("langchain_community.embeddings")
    embedder = lc.InfinityEmbeddings(model="minilm", infinity_api_url=live_server)
    # 130 texts: langchain sorts by length, sends batches of 128 from a thread pool, unsorts.
    texts = [f"{TEXTS[i % len(TEXTS)]} {i}" for i in range(130)]
    assert_same_vectors(embedder.embed_documents(texts), reference_embeddings(minilm_reference, texts))
    assert_same_vectors([embedder.embed_query(TEXTS[1])], reference_embeddings(minilm_reference, TEXTS[1:2]))


async def test_langchain_infinity_embeddings_async(live_server: str, minilm_reference) -> None:
    lc = pytest.importorskip("langchain_community.embeddings")
    embedder = lc.InfinityEmbeddings(model="minilm", infinity_api_url=live_server)
    got = await embedder.aembed_documents(TEXTS)
    assert_same_vectors(got, reference_embeddings(minilm_reference, TEXTS))


def test_langchain_infinity_rerank(infinity, reranker_reference: np.ndarray) -> None:
    compressors = pytest.importorskip("langchain_community.document_compressors")
    from langchain_core.documents import Document

    reranker = compressors.InfinityRerank(client=infinity, model="reranker", top_n=2)
    ranked = reranker.rerank(DOCUMENTS, QUERY)
    check_top_two([type("R", (), r)() for r in ranked], reranker_reference)

    docs = [Document(page_content=d, metadata={"n": i}) for i, d in enumerate(DOCUMENTS)]
    kept = reranker.compress_documents(docs, QUERY)
    want = np.argsort(-reranker_reference)[:2]
    assert [d.metadata["n"] for d in kept] == list(want)
    assert kept[0].metadata["relevance_score"] == pytest.approx(float(reranker_reference[want[0]]), abs=1e-4)


# -- fields clients send by default (TEI's, Cohere's) and the errors they read -----------


LONG_DOCUMENT = "the capital of france is paris " * 200  # past every model's limit here


def test_rerankers_tei_provider_sends_top_n_and_return_text(live_server: str, reranker_reference) -> None:
    """The rerankers library's TEI provider posts `texts` with `top_n` and `return_text`."""
    pytest.importorskip("requests")
    from rerankers import Reranker

    ranker = Reranker("reranker", model_type="text-embeddings-inference", api_key="x",
                      url=live_server + "/rerank", verbose=0)
    ranked = ranker.rank(QUERY, DOCUMENTS)
    want = np.argsort(-reranker_reference)
    assert [r.document.text for r in ranked.results] == [DOCUMENTS[i] for i in want]
    best_first = sorted(reranker_reference, reverse=True)
    assert [r.score for r in ranked.results] == pytest.approx(best_first, abs=1e-4)


def test_tei_rerank_top_n_keeps_the_best(live_server: str, reranker_reference) -> None:
    answer = httpx.post(f"{live_server}/rerank", json={
        "model": "reranker", "query": QUERY, "texts": DOCUMENTS, "top_n": 2, "return_text": True,
    }, timeout=60)
    assert answer.status_code == 200, answer.text
    assert [r["index"] for r in answer.json()] == list(np.argsort(-reranker_reference)[:2])
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in answer.json())


def test_haystack_tei_embedder_gets_the_vector_before_normalize(
    live_server: str, minilm_reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """haystack's HuggingFaceAPITextEmbedder sends TEI `normalize: false` by default: TEI's
    answer is the vector before the model's Normalize module, not unit length."""
    embedders = pytest.importorskip("haystack_integrations.components.embedders.huggingface_api")
    from huggingface_hub import constants
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize

    # Offline mode (set for every test) blocks huggingface_hub's requests to any URL, this one too.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    embedder = embedders.HuggingFaceAPITextEmbedder(
        api_type="text_embeddings_inference", api_params={"url": live_server}, token=None,
    )
    got = np.asarray(embedder.run(text=TEXTS[2])["embedding"])
    modules = [m for m in minilm_reference if not isinstance(m, Normalize)]
    before_normalize = SentenceTransformer(modules=modules, device="cpu")
    want = before_normalize.encode([TEXTS[2]], convert_to_numpy=True)[0]
    assert abs(np.linalg.norm(want) - 1) > 0.1  # the module does change it
    assert np.linalg.norm(got) == pytest.approx(np.linalg.norm(want), rel=5e-3)  # bfloat16 on some CPUs
    assert_same_vectors(got[None], want[None])
    normalized = embedders.HuggingFaceAPITextEmbedder(
        api_type="text_embeddings_inference", api_params={"url": live_server}, token=None, normalize=True,
    ).run(text=TEXTS[2])["embedding"]
    assert np.linalg.norm(normalized) == pytest.approx(1, abs=1e-5)


def cut_to_tokens(tokenizer_dir: Path, texts: list[str], tokens: int) -> list[str]:
    """Each text up to the start of its token `tokens` (special tokens not counted), by the
    transformers tokenizer's own offsets: what Cohere's max_tokens_per_doc keeps."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = []
    for text in texts:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        out.append(text[: offsets[tokens][0]].rstrip() if len(offsets) > tokens else text)
    return out


def test_cohere_haystack_ranker_sends_max_tokens_per_doc(live_server: str, reranker_reference) -> None:
    """cohere-haystack's CohereRanker sends max_tokens_per_doc=4096 on every call."""
    rankers = pytest.importorskip("haystack_integrations.components.rankers.cohere")
    from haystack import Document
    from haystack.utils import Secret

    ranker = rankers.CohereRanker(model="reranker", api_key=Secret.from_token("x"), api_base_url=live_server,
                                  top_k=2)
    ranked = ranker.run(query=QUERY, documents=[Document(content=d) for d in DOCUMENTS])["documents"]
    want = np.argsort(-reranker_reference)[:2]
    assert [d.content for d in ranked] == [DOCUMENTS[i] for i in want]
    assert [d.score for d in ranked] == pytest.approx(list(reranker_reference[want]), abs=1e-4)


def test_cohere_max_tokens_per_doc_cuts_each_document(live_server: str, tiny_reranker: Path) -> None:
    from sentence_transformers import CrossEncoder

    client = cohere.ClientV2(api_key="x", base_url=live_server, max_retries=0)
    documents = [*DOCUMENTS, LONG_DOCUMENT]
    response = client.rerank(model="reranker", query=QUERY, documents=documents, max_tokens_per_doc=4)
    cut = cut_to_tokens(tiny_reranker, documents, 4)
    assert cut[1] != documents[1]  # the cap does cut
    want = CrossEncoder(str(tiny_reranker), device="cpu").predict(
        [(QUERY, d) for d in cut], activation_fn=torch.nn.Sigmoid()
    )
    got = {r.index: r.relevance_score for r in response.results}
    assert [got[i] for i in range(len(documents))] == pytest.approx(list(want), abs=1e-4)


def test_jina_and_voyage_clients_read_our_errors(live_server: str, reranker_reference) -> None:
    """Jina's clients (jina-haystack) raise `detail`, Voyage's read it too; Cohere's SDK
    keeps the body, where its own API puts `message`. Voyage's message names Voyage's field."""
    jina = pytest.importorskip("haystack_integrations.components.rankers.jina")
    from haystack import Document
    from haystack.utils import Secret

    ranker = jina.JinaRanker(model="reranker", api_key=Secret.from_token("x"), top_k=2,
                             base_url=live_server + "/v1/rerank")
    ranked = ranker.run(query=QUERY, documents=[Document(content=d) for d in DOCUMENTS])["documents"]
    assert [d.content for d in ranked] == [DOCUMENTS[i] for i in np.argsort(-reranker_reference)[:2]]
    with pytest.raises(RuntimeError, match="empty"):  # it read our `detail` (a KeyError before)
        ranker.run(query=QUERY, documents=[Document(content="")])
    empty = {"model": "reranker", "query": QUERY, "documents": []}
    body = httpx.post(f"{live_server}/v1/rerank", json=empty, timeout=60).json()
    assert "'documents' is empty" in body["detail"] and body["message"] == body["detail"]
    assert body["error"]["message"] == body["detail"]  # and OpenAI's shape, which its SDK reads

    voyageai = pytest.importorskip("voyageai")
    client = voyageai.Client(api_key="x", base_url=live_server + "/v1", max_retries=0)
    with pytest.raises(voyageai.error.InvalidRequestError) as caught:
        client.rerank(QUERY, [LONG_DOCUMENT], model="reranker", truncation=False)
    assert "send truncation=true" in str(caught.value) and "truncate=" not in str(caught.value)
    with pytest.raises(voyageai.error.InvalidRequestError) as caught:
        client.embed([LONG_DOCUMENT], model="minilm", truncation=False)
    assert "send truncation=true" in str(caught.value)
