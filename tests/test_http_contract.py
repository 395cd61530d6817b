"""The HTTP contract of shared/spec/api.md, success paths: every route and response shape,
in-process over ASGI against the deterministic fake backend on tiny model folders."""

from __future__ import annotations

import base64
import json
import math
import shutil
import time
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
from conftest import fake, serve_in_process, spec_of
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

DOCS = ["a cat sat on the mat", "the weather is fine today", "dogs and cats", "stock markets fell"]
LABELS = {"negative", "neutral", "positive"}


@pytest.fixture(scope="module")
async def client(tiny_embedder, tiny_reranker, tiny_classifier) -> AsyncIterator[httpx.AsyncClient]:
    """One app serving three models: `emb`, `rr` and `cl`."""
    spec = spec_of(fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"), fake(tiny_classifier, "cl"))
    async with serve_in_process(spec) as c:
        yield c


@pytest.fixture(scope="module")
async def solo(tiny_embedder) -> AsyncIterator[httpx.AsyncClient]:
    """One app serving one embedder, `solo`."""
    async with serve_in_process(spec_of(fake(tiny_embedder, "solo"))) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(tiny_embedder) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_embedder / "tokenizer.json"))


async def ok(client: httpx.AsyncClient, method: str, url: str, **kwargs: object) -> dict:
    response = await client.request(method, url, **kwargs)
    assert response.status_code == 200, response.text
    return response.json()


def vectors(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def assert_envelope(body: dict, kind: str, model: str) -> None:
    assert body["object"] == kind
    assert body["model"] == model
    assert isinstance(body["id"], str) and body["id"]
    assert isinstance(body["created"], int) and abs(body["created"] - time.time()) < 600
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0


# -- routes at the root and under /v1 ---------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "/v1"])
async def test_embeddings_at_root_and_v1(client, prefix):
    body = await ok(client, "POST", f"{prefix}/embeddings", json={"model": "emb", "input": ["hi", "you"]})
    assert_envelope(body, "list", "emb")
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    assert vectors(body).shape == (2, 32)


@pytest.mark.parametrize("prefix", ["", "/v1"])
async def test_classify_at_root_and_v1(client, prefix):
    body = await ok(client, "POST", f"{prefix}/classify", json={"model": "cl", "input": ["good", "bad day"]})
    assert_envelope(body, "classify", "cl")
    assert len(body["data"]) == 2
    for row in body["data"]:
        assert {entry["label"] for entry in row} == LABELS
        scores = [entry["score"] for entry in row]
        assert scores == sorted(scores, reverse=True)
        assert math.isclose(sum(scores), 1.0, rel_tol=1e-6)


async def test_classify_single_string_and_raw_scores(client):
    soft = await ok(client, "POST", "/classify", json={"model": "cl", "input": "fine"})
    raw = await ok(client, "POST", "/classify", json={"model": "cl", "input": ["fine"], "raw_scores": True})
    logits = {e["label"]: e["score"] for e in raw["data"][0]}
    assert [e["label"] for e in raw["data"][0]] == [e["label"] for e in soft["data"][0]]
    exp = {label: math.exp(v) for label, v in logits.items()}
    for entry in soft["data"][0]:
        assert math.isclose(entry["score"], exp[entry["label"]] / sum(exp.values()), rel_tol=1e-6)


@pytest.mark.parametrize("prefix", ["", "/v1"])
async def test_models_at_root_and_v1(client, prefix):
    await ok(client, "POST", "/embeddings", json={"model": "emb", "input": "count me"})
    body = await ok(client, "GET", f"{prefix}/models")
    assert body["object"] == "list"
    by_id = {m["id"]: m for m in body["data"]}
    assert set(by_id) == {"emb", "rr", "cl"}
    for model in body["data"]:
        assert model["object"] == "model"
        assert isinstance(model["owned_by"], str) and isinstance(model["created"], int)
        assert model["backend"] == "fake" and model["dtype"] == "float32" and model["device"] == "cpu"
        assert model["max_input_tokens"] == 128
        assert model["stats"]["queue_depth"] == 0
        assert isinstance(model["stats"]["batches_done"], int)
    assert {i: m["capabilities"] for i, m in by_id.items()} == {
        "emb": ["embed"], "rr": ["rerank"], "cl": ["classify"],
    }
    assert by_id["emb"]["dimensions"] == 32
    assert by_id["emb"]["stats"]["batches_done"] >= 1


# -- embeddings --------------------------------------------------------------------------


async def test_base64_is_little_endian_float32_of_the_float_answer(client):
    texts = ["first text", "a second, longer text"]
    floats = await ok(client, "POST", "/v1/embeddings", json={"model": "emb", "input": texts})
    packed = await ok(
        client, "POST", "/v1/embeddings", json={"model": "emb", "input": texts, "encoding_format": "base64"}
    )
    assert [d["index"] for d in packed["data"]] == [0, 1]
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in packed["data"]])
    np.testing.assert_allclose(decoded, vectors(floats), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dimensions", [8, 31])
async def test_dimensions_truncate_and_renormalise(client, dimensions):
    full = vectors(await ok(client, "POST", "/embeddings", json={"model": "emb", "input": "matryoshka"}))[0]
    short = vectors(await ok(
        client, "POST", "/embeddings", json={"model": "emb", "input": "matryoshka", "dimensions": dimensions}
    ))[0]
    assert short.shape == (dimensions,)
    expected = full[:dimensions] / np.linalg.norm(full[:dimensions])  # the tiny embedder normalises
    np.testing.assert_allclose(short, expected, rtol=1e-5, atol=1e-6)
    assert math.isclose(float(np.linalg.norm(full)), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("dimensions", [0, 32, None])
async def test_dimensions_zero_absent_or_full_width_is_the_full_vector(client, dimensions):
    body = {"model": "emb", "input": "whole"} | ({} if dimensions is None else {"dimensions": dimensions})
    assert vectors(await ok(client, "POST", "/embeddings", json=body)).shape == (1, 32)


async def test_single_string_equals_list_of_one(client):
    one = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": "same text"})
    listed = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": ["same text"]})
    assert len(one["data"]) == 1
    np.testing.assert_array_equal(vectors(one), vectors(listed))
    assert one["usage"] == listed["usage"]


async def test_token_id_inputs_match_the_text(client, tokenizer, cl100k):
    """Token ids are OpenAI's cl100k_base by default (what OpenAI clients send): one list or
    several, they mean the text, and usage counts the model's own tokens of it."""
    text = "the cat sat"
    ids = cl100k.encode(text)
    from_text = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": [text]})
    flat = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": ids})
    nested = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": [ids, ids[:1]]})
    assert len(flat["data"]) == 1 and len(nested["data"]) == 2
    np.testing.assert_allclose(vectors(flat)[0], vectors(from_text)[0], rtol=1e-6)
    np.testing.assert_allclose(vectors(nested)[0], vectors(from_text)[0], rtol=1e-6)
    assert flat["usage"] == from_text["usage"]
    assert flat["usage"]["prompt_tokens"] == len(tokenizer.encode(text).ids)
    first_word = cl100k.decode(ids[:1])
    assert nested["usage"]["prompt_tokens"] == len(tokenizer.encode(text).ids) + len(
        tokenizer.encode(first_word).ids)


async def test_usage_counts_real_tokens(client, tokenizer):
    texts = ["short", "a somewhat longer sentence about the weather", "x"]
    body = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": texts})
    expected = sum(len(e.ids) for e in tokenizer.encode_batch(texts))
    assert body["usage"] == {"prompt_tokens": expected, "total_tokens": expected}
    assert expected != sum(len(t) for t in texts)  # tokens, not characters


async def test_data_is_in_input_order(client):
    texts = ["a much longer text than the others, to be batched apart", "b", "medium length text", "c"]
    together = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": texts})
    assert [d["index"] for d in together["data"]] == list(range(len(texts)))
    for i, text in enumerate(texts):
        alone = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": text})
        np.testing.assert_allclose(vectors(together)[i], vectors(alone)[0], rtol=1e-5, atol=1e-6)


async def test_user_field_is_accepted_and_ignored(client):
    await ok(client, "POST", "/embeddings", json={"model": "emb", "input": "x", "user": "someone"})


@pytest.mark.parametrize("name", ["solo", "text-embedding-3-small", None])
async def test_with_one_model_any_name_resolves(solo, name):
    body = {"input": "anything"} | ({} if name is None else {"model": name})
    answer = await ok(solo, "POST", "/v1/embeddings", json=body)
    assert answer["model"] == "solo"


# -- reranking ---------------------------------------------------------------------------


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("return_documents", [False, True])
@pytest.mark.parametrize("route", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank_shapes(client, route, return_documents):
    body = await ok(client, "POST", route, json={
        "model": "rr", "query": "cats", "documents": DOCS, "return_documents": return_documents,
    })
    assert body["model"] == "rr" and body["id"] and isinstance(body["results"], list)
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all(0 < s < 1 for s in scores)
    for r in results:
        if route == "/rerank":  # Infinity: a string or null, always present
            assert r["document"] == (DOCS[r["index"]] if return_documents else None)
        elif route == "/v1/rerank" or return_documents:  # Jina always, Cohere v2 on request
            assert r["document"] == {"text": DOCS[r["index"]]}
        else:
            assert "document" not in r
    if route == "/rerank":
        assert_envelope(body, "rerank", "rr")
    else:
        assert body["meta"]["api_version"]["version"] == ("1" if route == "/v1/rerank" else "2")
        assert body["meta"]["billed_units"]["input_tokens"] == body["usage"]["total_tokens"]


@pytest.mark.parametrize("top_n", [None, 0, 2, 10])
async def test_top_n(client, top_n):
    full = await ok(client, "POST", "/rerank", json={"model": "rr", "query": "cats", "documents": DOCS})
    body = {"model": "rr", "query": "cats", "documents": DOCS} | ({} if top_n is None else {"top_n": top_n})
    answer = await ok(client, "POST", "/v2/rerank", json=body)
    expected = full["results"][: top_n or None]
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == [
        (r["index"], r["relevance_score"]) for r in expected
    ]


async def test_documents_as_strings_or_text_objects(client):
    plain = await ok(client, "POST", "/v1/rerank", json={"model": "rr", "query": "q", "documents": DOCS})
    objects = await ok(client, "POST", "/v1/rerank", json={
        "model": "rr", "query": "q", "documents": [{"text": d} for d in DOCS[:2]] + DOCS[2:],
    })
    assert plain["results"] == objects["results"]


async def test_rerank_raw_scores_are_logits(client):
    query = {"model": "rr", "query": "dogs", "documents": DOCS}
    scored = await ok(client, "POST", "/rerank", json=query)
    raw = await ok(client, "POST", "/rerank", json=query | {"raw_scores": True})
    assert [r["index"] for r in raw["results"]] == [r["index"] for r in scored["results"]]
    for logit, score in zip(raw["results"], scored["results"], strict=True):
        assert math.isclose(_sigmoid(logit["relevance_score"]), score["relevance_score"], rel_tol=1e-6)


# -- status: health, ping, metrics, docs -------------------------------------------------


@pytest.mark.parametrize("route", ["/health", "/ping"])
async def test_health_and_ping(client, route):
    body = await ok(client, "GET", route)
    assert body["status"] == "ok"
    assert {m["id"]: m["state"] for m in body["models"]} == {"emb": "ready", "rr": "ready", "cl": "ready"}


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_per_model_series(client):
    before = _samples((await client.get("/metrics")).text)
    answer = await ok(client, "POST", "/embeddings", json={"model": "emb", "input": ["one", "two", "three"]})
    # It names no model: of the three served, the embedder is meant, and counted.
    bad = await client.post("/embeddings", json={"input": [""]})
    assert bad.status_code == 400
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    after = _samples(response.text)

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        assert key in after, f"no {name}{labels} in /metrics"
        return after[key] - before.get(key, 0.0)

    assert delta("infinity_cloud_requests_total", model="emb", route="/embeddings", status="200") == 1
    assert delta("infinity_cloud_requests_total", model="emb", route="/embeddings", status="400") == 1
    assert delta("infinity_cloud_inputs_total", model="emb") == 3
    assert delta("infinity_cloud_tokens_total", model="emb") == answer["usage"]["total_tokens"]
    assert delta("infinity_cloud_errors_total", model="emb", kind="InvalidInputError") == 1
    assert after[("infinity_cloud_queue_depth", frozenset({("model", "emb")}))] == 0
    # The autoscalers' metric (targets/kubernetes).
    assert after[("infinity_cloud_queued_tokens", frozenset({("model", "emb")}))] == 0
    on_cpu = frozenset({("model", "emb"), ("device", "cpu")})  # its one replica's, by device
    assert after[("infinity_cloud_device_queued_tokens", on_cpu)] == 0
    assert after[("infinity_cloud_device_up", on_cpu)] == 1
    assert after[("infinity_cloud_memory_held_bytes", frozenset())] == 0  # nothing in progress
    assert after[("infinity_cloud_memory_budget_bytes", frozenset())] > 0
    assert after[("process_resident_memory_bytes", frozenset())] > 0
    for histogram in ("batch_size", "batch_tokens", "queue_wait_seconds", "inference_seconds"):
        assert delta(f"infinity_cloud_{histogram}_count", model="emb", device="cpu") >= 1  # each replica's
    assert delta("infinity_cloud_request_seconds_count", model="emb", route="/embeddings") == 1
    assert any(
        name == "infinity_cloud_batch_size_bucket" and ("model", "emb") in labels for name, labels in after
    )


async def test_docs_and_openapi(client):
    docs = await client.get("/docs")
    assert docs.status_code == 200 and "text/html" in docs.headers["content-type"]
    # Offline: every script and stylesheet the page loads is served here, none from a CDN.
    import re

    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', docs.text)
    assert len(assets) >= 3 and all(a.startswith("/docs/assets/") for a in assets), assets
    for asset in assets:
        fetched = await client.get(asset)
        assert fetched.status_code == 200 and len(fetched.content) > 500, asset
    schema = await ok(client, "GET", "/openapi.json")
    # Every status a route answers, with the shape it answers in (was: 200 and 422 only).
    shapes = [("/embeddings", "ErrorBody"), ("/v1/rerank", "ErrorBody"), ("/embed", "TeiErrorBody")]
    for path, shape in shapes:
        responses = schema["paths"][path]["post"]["responses"]
        assert set(responses) >= {"200", "400", "401", "404", "408", "413", "422", "429", "500", "503"}, path
        for status in ("400", "422", "429", "503"):
            assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith(shape)
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    paths = set(schema["paths"])
    assert {
        "/embeddings", "/v1/embeddings", "/classify", "/v1/classify", "/models", "/v1/models",
        "/rerank", "/v1/rerank", "/v2/rerank", "/invocations", "/health", "/ping", "/metrics",
    } <= paths


async def test_openapi_states_the_limits_the_server_enforces(tiny_embedder):
    """Each limit in the document is the running server's, and breaking it is answered with
    the contract's status (400, 413), not the 422 pydantic would give."""
    limits = {"max_inputs_per_request": 300, "max_chars_per_text": 50, "max_media_per_request": 8}
    async with serve_in_process(spec_of(fake(tiny_embedder, "emb"), limits=limits)) as c:
        document = await ok(c, "GET", "/openapi.json")
        schemas = document["components"]["schemas"]
        one, many = schemas["ClassifyRequest"]["properties"]["input"]["anyOf"]
        assert one == {"type": "string", "minLength": 1, "maxLength": 50}
        assert (many["minItems"], many["maxItems"], many["items"]) == (1, 300, one)
        images = schemas["CohereEmbedRequest"]["properties"]["images"]["anyOf"][0]
        assert images["maxItems"] == 8  # the smaller of the media and the inputs limits
        top_n = schemas["RerankRequest"]["properties"]["top_n"]["anyOf"][0]
        assert top_n["minimum"] == 0
        assert "x-limits" not in json.dumps(document)
        for inputs, status in [("", 400), ([], 400), (["x"] * 301, 413), ("x" * 51, 413), ("x" * 50, 200)]:
            response = await c.post("/embed", json={"inputs": inputs})  # TEI's inputs: the same schema
            assert response.status_code == status, (inputs, response.text)


# -- SageMaker /invocations --------------------------------------------------------------

SAGEMAKER = "X-Amzn-SageMaker-Custom-Attributes"


async def test_invocations_routes_by_header(client):
    body = {"model": "rr", "query": "cats", "documents": DOCS, "return_documents": True}
    routed = await ok(client, "POST", "/invocations", json=body, headers={SAGEMAKER: "route=rerank"})
    named = await ok(client, "POST", "/rerank", json=body)
    assert routed["object"] == "rerank" and routed["results"] == named["results"]
    # the header wins over the body: an embeddings request without `input` is a 422 on `input`
    wrong = await client.post("/invocations", json=body, headers={SAGEMAKER: "trace=1, route=embeddings"})
    assert wrong.status_code == 422 and wrong.json()["error"]["param"] == "input"


@pytest.mark.parametrize(("body", "kind", "same_as"), [
    ({"model": "rr", "query": "cats", "documents": DOCS}, "rerank", "/rerank"),
    ({"model": "emb", "input": ["hello"]}, "list", "/embeddings"),
    ({"model": "cl", "input": ["hello"]}, "classify", "/classify"),
])
async def test_invocations_routes_by_body(client, body, kind, same_as):
    routed = await ok(client, "POST", "/invocations", json=body)
    named = await ok(client, "POST", same_as, json=body)
    assert routed["object"] == kind
    for key in ("data", "results", "usage", "model"):
        assert routed.get(key) == named.get(key)


async def test_invocations_routes_by_capability(client):
    """Neither `query` nor `input`: the model's capability picks the schema (rerank: `query`)."""
    response = await client.post("/invocations", json={"model": "rr", "documents": DOCS})
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "query"


async def test_invocations_with_one_model_needs_no_name(solo):
    assert (await ok(solo, "POST", "/invocations", json={"input": "hello"}))["model"] == "solo"


# -- deployment settings: API keys, CORS, URL prefix -------------------------------------


async def test_several_api_keys_each_accepted_and_open_routes(tiny_embedder):
    spec = spec_of(fake(tiny_embedder, "emb"), api_keys=["key-one", "key-two"])
    async with serve_in_process(spec) as c:
        for key in ("key-one", "key-two"):
            auth = {"Authorization": f"Bearer {key}"}
            await ok(c, "POST", "/v1/embeddings", json={"input": "x"}, headers=auth)
            await ok(c, "GET", "/v1/models", headers=auth)
            assert (await c.get("/metrics", headers=auth)).status_code == 200
        for route in ("/health", "/ping", "/docs", "/openapi.json"):
            assert (await c.get(route)).status_code == 200, route


async def test_cors_preflight_with_allowed_origin(tiny_embedder):
    origin = "https://app.example.com"
    spec = spec_of(fake(tiny_embedder, "emb"), api_keys=["secret"], cors_origins=[origin])
    async with serve_in_process(spec) as c:
        preflight = await c.options("/v1/embeddings", headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        })
        assert preflight.status_code == 200, preflight.text  # answered before the key check
        assert preflight.headers["access-control-allow-origin"] == origin
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        actual = await c.post(
            "/v1/embeddings", json={"input": "x"},
            headers={"Origin": origin, "Authorization": "Bearer secret"},
        )
        assert actual.status_code == 200
        assert actual.headers["access-control-allow-origin"] == origin


async def test_url_prefix_moves_every_route(tiny_embedder, tiny_reranker):
    spec = spec_of(fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"), url_prefix="api/")
    rerank = {"model": "rr", "query": "q", "documents": ["a", "b"]}
    embed = {"model": "emb", "input": "x"}
    async with serve_in_process(spec, base_url="http://testserver/api") as c:  # GET /api/health
        for method, route, body in [
            ("POST", "/embeddings", embed), ("POST", "/v1/embeddings", embed),
            ("POST", "/classify", embed), ("POST", "/v1/classify", embed),
            ("POST", "/rerank", rerank), ("POST", "/v1/rerank", rerank), ("POST", "/v2/rerank", rerank),
            ("POST", "/invocations", embed),
            ("GET", "/models", None), ("GET", "/v1/models", None), ("GET", "/health", None),
            ("GET", "/ping", None), ("GET", "/metrics", None), ("GET", "/docs", None),
            ("GET", "/openapi.json", None),
        ]:
            moved = await c.request(method, route.lstrip("/"), json=body)
            # /classify on an embedder is a 400 from the engine: the route exists under the prefix
            assert moved.status_code == (400 if "classify" in route else 200), (route, moved.text)
            at_root = await c.request(method, f"http://testserver{route}", json=body)
            assert at_root.status_code == 404, route



async def test_json_without_a_content_type_is_accepted(solo):
    # Bare HTTP clients often send no Content-Type; the body is JSON all the same.
    response = await solo.post("/embeddings", content=b'{"input": ["hello"]}', headers={"Content-Type": ""})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 1


async def test_rerank_dialects_by_route_and_body(client):
    """Each route answers in its dialect's document shape; Voyage's `top_k` gets Voyage's."""
    docs = ["a cat", "a dog", "a car"]
    base = {"model": "rr", "query": "pets", "documents": docs, "return_documents": True}
    infinity = await ok(client, "POST", "/rerank", json=base)
    assert all(isinstance(r["document"], str) for r in infinity["results"])
    jina = await ok(client, "POST", "/v1/rerank", json=base)
    assert all(r["document"] == {"text": docs[r["index"]]} for r in jina["results"])
    voyage = await ok(client, "POST", "/v1/rerank", json={**base, "top_n": None, "top_k": 2})
    assert set(voyage) == {"object", "data", "model", "usage"} and len(voyage["data"]) == 2
    assert [d["index"] for d in voyage["data"]] == [r["index"] for r in infinity["results"][:2]]
    assert all(d["document"] == docs[d["index"]] for d in voyage["data"])
    assert voyage["usage"]["total_tokens"] == infinity["usage"]["total_tokens"]


async def test_null_optional_fields_mean_their_defaults(client):
    nulls = {"top_n": None, "return_documents": None, "raw_scores": None, "max_tokens_per_doc": None}
    body = {"model": "rr", "query": "q", "documents": ["a", "b"], **nulls}
    ranked = await ok(client, "POST", "/v2/rerank", json=body)
    assert len(ranked["results"]) == 2
    missing = await client.post("/embeddings", json={"model": "emb", "input": None})
    assert missing.status_code == 422 and "input" in missing.json()["error"]["message"]


@pytest.fixture(scope="module")
async def prompted(tiny_embedder, tmp_path_factory) -> AsyncIterator[httpx.AsyncClient]:
    """The tiny embedder with sentence-transformers prompts declared, as e5-style models do."""
    folder = tmp_path_factory.mktemp("prompted") / "model"
    shutil.copytree(tiny_embedder, folder)
    config = folder / "config_sentence_transformers.json"
    data = json.loads(config.read_text()) if config.exists() else {}
    config.write_text(json.dumps({**data, "prompts": {"query": "query: ", "document": "passage: "}}))
    async with serve_in_process(spec_of(fake(folder, "emb"))) as c:
        yield c


@pytest.mark.parametrize(("input_type", "prefix"), [
    ("search_query", "query: "), ("search_document", "passage: "), ("clustering", ""), (None, ""),
])
async def test_cohere_input_type_uses_the_models_prompt(prompted, input_type, prefix):
    body = {"model": "emb", "texts": ["hello world"], "input_type": input_type}
    cohere = await ok(prompted, "POST", "/v2/embed", json=body)
    prefixed = {"model": "emb", "input": [prefix + "hello world"]}
    plain = await ok(prompted, "POST", "/embeddings", json=prefixed)
    np.testing.assert_allclose(cohere["embeddings"]["float"], vectors(plain), rtol=1e-6)
    assert cohere["meta"]["billed_units"]["input_tokens"] == plain["usage"]["prompt_tokens"]
