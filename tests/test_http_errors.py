"""The error table of shared/spec/api.md, row by row: status, the OpenAI error shape, a
message naming the field, the extra headers; and after each error, a good request still
succeeds. In-process over ASGI against the deterministic fake backend."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from conftest import fake, serve_in_process, spec_of, unwaited, wait_healthy, wait_until

from infinity_cloud.admission.memory import MB, MemoryBudget
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.engine import Engine
from infinity_cloud.engine.asks import EmbedAsk

MAX_BYTES = 4096
MAX_INPUTS = 128
LONG_TEXT = "word " * 300  # over the tiny models' 128 tokens
SAGEMAKER = "X-Amzn-SageMaker-Custom-Attributes"
JSON = {"content-type": "application/json"}

GOOD = {
    "/embeddings": {"model": "emb", "input": ["fine"]},
    "/v1/embeddings": {"model": "emb", "input": ["fine"]},
    "/rerank": {"model": "rr", "query": "q", "documents": ["a", "b"]},
    "/v1/rerank": {"model": "rr", "query": "q", "documents": ["a", "b"]},
    "/v2/rerank": {"model": "rr", "query": "q", "documents": ["a", "b"]},
    "/classify": {"model": "cl", "input": ["fine"]},
    "/invocations": {"model": "emb", "input": ["fine"]},
}


@pytest.fixture(scope="module")
def engine(tiny_embedder, tiny_reranker, tiny_classifier) -> Engine:
    return Engine(spec_of(
        fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"), fake(tiny_classifier, "cl"),
        limits={"max_payload_bytes": MAX_BYTES, "max_inputs_per_request": MAX_INPUTS},
    ))


@pytest.fixture(scope="module")
async def client(engine) -> AsyncIterator[httpx.AsyncClient]:
    """One app serving `emb`, `rr` and `cl`, with a 4 KiB body and 128-input limit."""
    async with serve_in_process(engine) as c:
        yield c


def assert_error(response: httpx.Response, status: int, param: str | None, *words: str) -> dict:
    """The OpenAI error shape, with the status as code and a message naming `words`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    assert error["code"] == status
    assert error["param"] == param
    for word in words:
        assert word in error["message"], (word, error["message"])
    if status == 422:  # infinity_client reads FastAPI's list
        assert isinstance(body["detail"], list) and body["detail"]
        assert all({"loc", "msg", "type"} <= set(d) for d in body["detail"])
    else:  # where Jina's and Voyage's clients (`detail`) and Cohere's (`message`) read it
        assert body["detail"] == body["message"] == error["message"]
    return error


async def assert_still_serving(client: httpx.AsyncClient, route: str = "/embeddings", **kwargs: Any) -> None:
    response = await client.post(route, json=GOOD[route], **kwargs)
    assert response.status_code == 200, response.text


# -- 422, 400, 404, 413 on the shared app ------------------------------------------------

# (route, body, status, param, words the message names)
CASES = [
    # 422: schema
    ("/embeddings", {"model": "emb", "input": 3}, 422, "input", ["input"]),
    ("/embeddings", {"model": "emb", "input": [1, "a"]}, 422, "input", ["input"]),
    ("/embeddings", {"model": "emb", "input": "a", "dimensions": "8"}, 422, "dimensions", ["dimensions"]),
    ("/embeddings", {"model": "emb", "input": "a", "encoding_format": "hex"}, 422, "encoding_format",
     ["encoding_format"]),
    ("/embeddings", {"model": "emb", "input": "a", "modality": "video"}, 422, "modality", ["modality"]),
    ("/embeddings", {"model": "emb"}, 422, "input", ["input", "required"]),
    ("/rerank", {"model": "rr", "query": "q", "documents": "a"}, 422, "documents", ["documents"]),
    ("/v2/rerank", {"model": "rr", "query": "q", "documents": ["a"], "top_n": "2"}, 422, "top_n", ["top_n"]),
    ("/v1/rerank", {"model": "rr", "query": 5, "documents": ["a"]}, 422, "query", ["query"]),
    ("/classify", {"model": "cl", "input": [{"text": "x"}]}, 422, "input", ["input"]),
    # 400: content
    ("/embeddings", {"model": "emb", "input": []}, 400, "input", ["input", "empty"]),
    ("/embeddings", {"model": "emb", "input": ""}, 400, "input", ["input", "empty"]),
    ("/embeddings", {"model": "emb", "input": ["ok", ""]}, 400, "input", ["input", "item 1", "empty"]),
    ("/embeddings", {"model": "emb", "input": [[]]}, 400, "input", ["input", "empty"]),
    ("/rerank", {"model": "rr", "query": "q", "documents": []}, 400, "documents", ["documents", "empty"]),
    ("/rerank", {"model": "rr", "query": "", "documents": ["a"]}, 400, "query", ["query", "empty"]),
    ("/classify", {"model": "cl", "input": []}, 400, "input", ["input", "empty"]),
    ("/embeddings", {"model": "emb", "input": "a", "dimensions": -1}, 400, "dimensions",
     ["dimensions", "-1"]),
    ("/embeddings", {"model": "emb", "input": "a", "dimensions": 33}, 400, "dimensions",
     ["dimensions", "32"]),
    ("/embeddings", {"model": "emb", "input": "http://x/a.png", "modality": "image"}, 400, "modality",
     ["modality", "image"]),
    ("/rerank", {"model": "emb", "query": "q", "documents": ["a"]}, 400, "model", ["emb", "rerank"]),
    ("/embeddings", {"model": "rr", "input": "a"}, 400, "model", ["rr", "embedding"]),
    ("/classify", {"model": "emb", "input": "a"}, 400, "model", ["emb", "classif"]),
    ("/embeddings", {"model": "emb", "input": ["ok", LONG_TEXT], "truncate": False}, 400, "input",
     ["input 1", "has over 2", "tokens", "limit of 128"]),  # counted only up to the limit and past it
    # cl100k_base ids (the default reading): 1917 is " world", so 200 words here
    ("/embeddings", {"model": "emb", "input": [[1917] * 200], "truncate": False}, 400, "input",
     ["input 0", "128"]),
    ("/rerank", {"model": "rr", "query": "q", "documents": [LONG_TEXT], "truncate": False}, 400, "input",
     ["input 0", "128"]),
    ("/classify", {"model": "cl", "input": [LONG_TEXT], "truncate": False}, 400, "input", ["input 0", "128"]),
    ("/embeddings", {"model": "emb", "input": [[5, 10**6]]}, 400, "input",
     ["input 0", "1000000", "vocabulary"]),
    ("/embeddings", {"model": "emb", "input": [5, -1]}, 400, "input", ["-1", "vocabulary"]),
    ("/v2/rerank", {"model": "rr", "query": "q", "documents": ["a"], "top_n": -1}, 400, "top_n", ["top_n"]),
    # 404: unknown model with several loaded
    ("/embeddings", {"model": "nope", "input": "a"}, 404, "model", ["nope", "emb", "rr", "cl"]),
    ("/rerank", {"model": "nope", "query": "q", "documents": ["a"]}, 404, "model", ["nope"]),
    # (no name: the one classifier answers, tests/test_model_routing.py)
    ("/classify", {"model": "gpt-4", "input": "a"}, 404, "model", ["gpt-4", "served models"]),
    # 413: more inputs than the per-request limit
    ("/embeddings", {"model": "emb", "input": ["a"] * (MAX_INPUTS + 1)}, 413, "input",
     ["input", "129", "128"]),
    ("/rerank", {"model": "rr", "query": "q", "documents": ["a"] * (MAX_INPUTS + 1)}, 413, "documents",
     ["documents", "128"]),
    ("/classify", {"model": "cl", "input": ["a"] * (MAX_INPUTS + 1)}, 413, "input", ["input", "128"]),
]


def _case_id(case: tuple) -> str:
    route, body, status, param, _ = case
    return f"{status}-{route.strip('/').replace('/', '_')}-{param}-{len(str(body))}"


@pytest.mark.parametrize(("route", "body", "status", "param", "words"), CASES, ids=map(_case_id, CASES))
async def test_error_table(client, route, body, status, param, words):
    assert_error(await client.post(route, json=body), status, param, *words)
    await assert_still_serving(client, route)


@pytest.mark.parametrize("route", ["/embeddings", "/v1/rerank", "/invocations"])
async def test_malformed_json_is_422(client, route):
    response = await client.post(route, content=b'{"input": ["a",', headers=JSON)
    assert_error(response, 422, None, "malformed JSON")
    await assert_still_serving(client, route)


@pytest.mark.parametrize(("body", "words"), [
    (b'{"input": "x\\ud800y"}', "no low surrogate"),  # a lone surrogate, escaped
    (b'{"input": "\xff\xfe"}', "not valid UTF-8: byte 0xff at byte 11"),
    (b'{"input": "x\xc3\x28"}', "not valid UTF-8: byte 0xc3 at byte 12"),
    (gzip.compress(b'{"input": "a"}', mtime=0), "gzip-compressed"),
    ('{"input": "a"}'.encode("utf-16"), "UTF-16"),
    ('{"input": "a"}'.encode("utf-16-le"), "UTF-16"),
    (b'{"input": ' + b"[" * 1100 + b"]" * 1100 + b"}", "depth limit"),
    (b'{"input": "a", "dimensions": 1e400}', "too large"),
    (b'{"input": "a", "dimensions": 1' + b"0" * 4000 + b"}", "too large"),  # 4,001 digits
])
@pytest.mark.parametrize("route", ["/embeddings", "/invocations"])
async def test_every_malformed_body_is_a_422_saying_why(client, route: str, body: bytes, words: str):
    """Parsed strictly (orjson): never a 400 without a reason, a 500, or text the tokenizer
    chokes on; a body that is not UTF-8 at all is told what it is."""
    response = await client.post(route, content=body, headers=JSON)
    assert_error(response, 422, None, "malformed JSON", words)
    await assert_still_serving(client, route)


async def test_numbers_beyond_64_bits_are_answered(client):
    """JSON Schema's integer admits them (the document says integer), so they are read, and what
    they are for refuses them by name (400); never a 500."""
    for body, param in ((b'{"input": "a", "dimensions": 123456789012345678901234567890}', "dimensions"),
                        (b'{"input": [[1, 123456789012345678901234567890]]}', "input")):
        response = await client.post("/embeddings", content=body, headers=JSON)
        assert_error(response, 400, param)
    await assert_still_serving(client, "/embeddings")


async def test_a_form_body_is_told_to_be_json(client):
    response = await client.post("/embeddings", content=b'{"input": "a"}',
                                 headers={"content-type": "application/x-www-form-urlencoded"})
    assert_error(response, 422, None, "Content-Type: application/json", "curl -d")


async def test_the_python_api_refuses_lone_surrogates(tiny_embedder):
    from infinity_cloud.core.errors import InvalidInputError

    async with Engine(fake(tiny_embedder, "emb")) as engine:
        with pytest.raises(InvalidInputError, match="item 1 is not well-formed Unicode"):
            await engine.embeddings(EmbedAsk(["fine", "x\ud800y"]))


async def test_unknown_route_and_method_use_the_error_shape(client):
    assert_error(await client.get("/nowhere"), 404, None)
    assert_error(await client.get("/embeddings"), 405, None)
    # Allow names every method the path is served with, though two routes serve it (GET, TEI's POST)
    for method, path in (("OPTIONS", "/"), ("PUT", "/models/emb"), ("DELETE", "/")):
        refused = await client.request(method, path)
        assert_error(refused, 405, None)
        assert set(refused.headers["Allow"].split(", ")) >= {"GET", "POST"}, (path, refused.headers["Allow"])


# -- /invocations: the same errors as the named route ------------------------------------

SAME = [
    ("/embeddings", {"model": "emb", "input": []}, None),
    ("/embeddings", {"model": "emb", "input": 3}, None),
    ("/embeddings", {"model": "emb", "input": "a", "dimensions": 99}, None),
    ("/embeddings", {"model": "emb", "input": [[10**6]]}, None),
    ("/embeddings", {"model": "emb", "input": [LONG_TEXT], "truncate": False}, None),
    ("/embeddings", {"model": "emb", "input": ["a"] * (MAX_INPUTS + 1)}, None),
    ("/embeddings", {"model": "rr", "input": "a"}, None),
    ("/embeddings", {"model": "nope", "input": "a"}, None),
    ("/rerank", {"model": "emb", "query": "q", "documents": ["a"]}, None),
    ("/rerank", {"model": "rr", "query": "q", "documents": []}, "route=rerank"),
    ("/rerank", {"model": "rr", "query": "q", "documents": [1]}, None),
    ("/classify", {"model": "emb", "input": "a"}, "route=classify"),
    ("/classify", {"model": "cl", "input": [""]}, None),
]


@pytest.mark.parametrize(("route", "body", "attributes"), SAME, ids=range(len(SAME)))
async def test_invocations_answers_the_same_errors(client, route, body, attributes):
    named = await client.post(route, json=body)
    headers = {SAGEMAKER: attributes} if attributes else {}
    invoked = await client.post("/invocations", json=body, headers=headers)
    assert 400 <= named.status_code < 500
    assert invoked.status_code == named.status_code
    if named.status_code != 422:
        assert invoked.json() == named.json()
    else:  # pydantic words a few messages differently in FastAPI's validation; where is the same
        assert_error(invoked, 422, named.json()["error"]["param"])
        assert [d["loc"] for d in invoked.json()["detail"]] == [d["loc"] for d in named.json()["detail"]]
    await assert_still_serving(client, "/invocations")


async def test_invocations_unknown_route_attribute(client):
    response = await client.post("/invocations", json=GOOD["/invocations"], headers={SAGEMAKER: "route=chat"})
    assert_error(response, 400, "route", "chat", "embeddings")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"'])
async def test_invocations_body_must_be_an_object(client, body):
    response = await client.post("/invocations", content=body, headers=JSON)
    assert_error(response, 422, None, "JSON object")


# -- 413: the body size limit ------------------------------------------------------------


@pytest.mark.parametrize("route", ["/embeddings", "/v1/rerank", "/invocations"])
async def test_body_over_the_limit_with_content_length(client, route):
    response = await client.post(route, json={"model": "emb", "input": ["x" * MAX_BYTES]})
    assert_error(response, 413, None, str(MAX_BYTES), "bytes")
    await assert_still_serving(client, route)


@pytest.mark.parametrize("route", ["/embeddings", "/v2/rerank", "/invocations"])
async def test_body_over_the_limit_chunked(client, route):
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "emb", "input": ["'
        for _ in range(8):
            yield b"x" * 1000
        yield b'"]}'

    response = await client.post(route, content=chunks(), headers=JSON)
    assert "content-length" not in {k.lower() for k in response.request.headers}
    assert_error(response, 413, None, str(MAX_BYTES), "bytes")
    await assert_still_serving(client, route)


async def test_body_under_the_limit_chunked_is_served(client):
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "emb",'
        yield b' "input": ["chunked"]}'

    response = await client.post("/embeddings", content=chunks(), headers=JSON)
    assert response.status_code == 200, response.text


# -- 500: a bug, and a failed batch ------------------------------------------------------


async def test_a_bug_is_a_500_with_a_request_id_and_the_server_lives_on(client, engine, monkeypatch, caplog):
    async def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("a bug in the engine")

    monkeypatch.setattr(engine, "_embed", broken)
    with caplog.at_level(logging.ERROR, logger="infinity_cloud.server.errors"):
        response = await client.post("/v1/embeddings", json=GOOD["/embeddings"])
    error = assert_error(response, 500, None, "request id")
    request_id = response.headers["x-request-id"]
    assert request_id in error["message"]
    assert "a bug in the engine" not in error["message"]  # details stay in the log
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged and logged[0].exc_info and "a bug in the engine" in str(logged[0].exc_info[1])
    # other routes are served meanwhile, and the route itself once the bug is gone
    assert (await client.post("/rerank", json=GOOD["/rerank"])).status_code == 200
    monkeypatch.undo()
    await assert_still_serving(client, "/v1/embeddings")


async def test_a_failed_batch_is_a_500_and_the_worker_survives(tiny_embedder, rare_id):
    spec = spec_of(fake(tiny_embedder, "emb", backend_options={"fail_token_id": rare_id}, token_ids="model"))
    async with serve_in_process(spec) as c:
        response = await c.post("/embeddings", json={"input": [rare_id]})
        assert_error(response, 500, None, "inference failed", "batch")
        assert response.json()["error"]["type"] == "inference_error"
        assert (await c.get("/health")).status_code == 200
        await assert_still_serving(c)


async def test_a_batch_out_of_device_memory_is_a_503_to_retry_and_the_worker_survives(tiny_embedder, rare_id):
    # The torch backend raises DeviceMemoryError for a CUDA out-of-memory
    # (test_torch_heads.py: a real torch allocation failure becomes one).
    spec = spec_of(fake(tiny_embedder, "emb", backend_options={"oom_token_id": rare_id}, token_ids="model"))
    async with serve_in_process(spec) as c:
        response = await c.post("/embeddings", json={"input": [rare_id]})
        assert_error(response, 503, None, "did not fit", "memory")
        assert response.json()["error"]["type"] == "device_out_of_memory"
        assert int(response.headers["retry-after"]) >= 1
        assert (await c.get("/health")).status_code == 200
        await assert_still_serving(c)


# -- 401 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def keyed(tiny_embedder, tiny_reranker) -> AsyncIterator[httpx.AsyncClient]:
    spec = spec_of(fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"), api_keys=["right-key", "other-key"])
    async with serve_in_process(spec) as c:
        yield c


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-key", "Bearer ", "Basic cmlnaHQta2V5", "right-key"]
)
@pytest.mark.parametrize(("method", "route"), [
    ("POST", "/embeddings"), ("POST", "/v1/embeddings"), ("POST", "/v1/rerank"), ("GET", "/v1/models"),
    ("GET", "/metrics"), ("POST", "/invocations"),
])
async def test_missing_or_wrong_api_key_is_401(keyed, authorization, method, route):
    headers = {"Authorization": authorization} if authorization is not None else {}
    body = GOOD.get(route)
    response = await keyed.request(method, route, json=body, headers=headers)
    assert_error(response, 401, None, "API key")
    assert response.headers["www-authenticate"] == "Bearer"
    fixed = await keyed.request(method, route, json=body, headers={"Authorization": "Bearer right-key"})
    assert fixed.status_code == 200, fixed.text


async def test_the_key_is_checked_before_the_body(keyed):
    """No key: 401 whatever the body is (malformed, over the size limit, a wrong schema), so an
    unauthenticated caller learns nothing and the server reads nothing."""
    for content, headers in [
        (b'{"input": ["a",', JSON),
        (b'{"input": 5}', JSON),
        (b"x" * 100, {**JSON, "content-length": str(10**9)}),
    ]:
        response = await keyed.post("/embeddings", content=content, headers=headers)
        assert_error(response, 401, None, "API key")
    for open_path in ("/health", "/ping", "/openapi.json", "/docs", "/docs/assets/swagger-ui.css"):
        assert (await keyed.get(open_path)).status_code == 200, open_path


async def test_keys_can_come_from_a_file(tiny_embedder, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# a comment\nfile-key-1\n\n  file-key-2  \n")
    spec = spec_of(fake(tiny_embedder, "emb"), api_key_file=str(keys), api_keys=["flag-key"])
    async with serve_in_process(spec, headers={}) as c:
        cases = [("file-key-1", 200), ("file-key-2", 200), ("flag-key", 200), ("# a comment", 401)]
        for key, status in cases:
            authorization = {"Authorization": f"Bearer {key}"}
            response = await c.post("/embeddings", json={"input": "a"}, headers=authorization)
            assert response.status_code == status, (key, response.text)


# -- 429 ---------------------------------------------------------------------------------


async def test_queue_full_is_429_with_retry_after(tiny_embedder):
    slow = fake(tiny_embedder, "emb", queue_size=2, max_batch_size=1, backend_options={"delay_s": 0.4})
    async with serve_in_process(spec_of(slow)) as c:
        requests = (c.post("/embeddings", json={"input": [f"text {i}"]}) for i in range(8))
        responses = await asyncio.gather(*requests)
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 429}, statuses
        for response in responses:
            if response.status_code == 429:
                error = assert_error(response, 429, None, "queue", "full")
                assert error["type"] == "rate_limit_exceeded"
                assert int(response.headers["retry-after"]) > 0
        await assert_still_serving(c)


async def test_overload_is_shed_by_deadline_not_left_to_time_out(tiny_embedder):
    """Once the model's throughput is known, requests that would wait past the deadline are
    answered 429 at once with Retry-After; the admitted ones are answered in full."""
    slow = fake(tiny_embedder, "emb", max_batch_size=1, deadline_s=0.5, backend_options={"delay_s": 0.1})
    async with serve_in_process(spec_of(slow)) as c:
        assert (await c.post("/embeddings", json={"input": ["warm up", "twice"]})).status_code == 200
        responses = await asyncio.gather(*(c.post("/embeddings", json={"input": [f"text {i}"] * 4})
                                           for i in range(12)))
        statuses = [r.status_code for r in responses]
        assert set(statuses) == {200, 429}, statuses
        for response in responses:
            if response.status_code == 429:
                assert_error(response, 429, None, "overloaded", "deadline")
                assert int(response.headers["retry-after"]) >= 1
            else:
                assert len(response.json()["data"]) == 4
        await assert_still_serving(c)


async def test_a_large_request_is_served_every_time_and_a_413_only_past_the_platforms_limit(tiny_embedder):
    """At 20 inputs a second with a 0.2 s deadline, 20 inputs take 1 s of their own: the
    deadline bounds waiting, not a request's own work, so the same large call is answered in
    full every time (the second used to be a 413 once the pace was measured). Only past the
    platform's own limit on one request (here 0.5 s) is it a 413, at once, naming the limit
    and what fits (and the server unhurt)."""
    large = {"input": [f"text {i}" for i in range(20)]}
    slow = fake(tiny_embedder, "emb", max_batch_size=1, deadline_s=0.2, backend_options={"delay_s": 0.05})
    async with serve_in_process(spec_of(slow)) as c:
        for _ in range(2):
            response = await c.post("/embeddings", json=large)
            assert response.status_code == 200, response.text
            assert [row["index"] for row in response.json()["data"]] == list(range(20))
    limited = fake(tiny_embedder, "emb", max_batch_size=1, deadline_s=0.2, request_limit_s=0.5,
                   backend_options={"delay_s": 0.05})
    async with serve_in_process(spec_of(limited)) as c:
        warm = await c.post("/embeddings", json={"input": [f"warm {i}" for i in range(6)]})
        assert warm.status_code == 200  # the pace is measured on it
        response = await c.post("/embeddings", json=large)
        error = assert_error(response, 413, None, "on an idle server", "0.5 s limit on one request",
                             "of its 20 inputs")
        assert error["type"] == "payload_too_large" and "retry-after" not in response.headers
        assert (await c.post("/embeddings", json={"input": ["fits"]})).status_code == 200


# -- 503 ---------------------------------------------------------------------------------


async def test_model_still_loading_is_503_with_retry_after(tiny_embedder):
    spec = spec_of(fake(tiny_embedder, "emb", backend_options={"load_delay_s": 1.5}))
    async with unwaited(spec) as c:
        for route in ("/health", "/ping"):
            response = await c.get(route)
            assert_error(response, 503, None, "emb", "loading")
            assert response.json()["status"] == "unavailable"
            assert int(response.headers["retry-after"]) > 0
        for route in ("/embeddings", "/v1/embeddings", "/invocations"):
            response = await c.post(route, json=GOOD[route])
            assert_error(response, 503, None, "emb", "loading")
            assert response.json()["error"]["type"] == "model_not_ready"
            assert int(response.headers["retry-after"]) > 0
        await wait_healthy(c)
        await assert_still_serving(c)


async def _wait_unhealthy(client: httpx.AsyncClient) -> httpx.Response:
    for _ in range(500):
        response = await client.get("/health")
        if response.status_code != 200:
            return response
        await asyncio.sleep(0.01)
    raise AssertionError("/health never turned 503 after the worker died")


async def test_dead_worker_is_503_on_health_and_requests(tiny_embedder, tiny_reranker, rare_id):
    dying = fake(tiny_embedder, "emb", backend_options={"exit_token_id": rare_id}, token_ids="model")
    spec = spec_of(dying, fake(tiny_reranker, "rr"))
    async with serve_in_process(spec) as c:
        killer = asyncio.ensure_future(c.post("/embeddings", json={"model": "emb", "input": [rare_id]}))
        try:
            health = await _wait_unhealthy(c)
            assert_error(health, 503, None, "emb", "died", "SystemExit")
            assert int(health.headers["retry-after"]) > 0
            states = {m["id"]: m for m in health.json()["models"]}
            assert "died" in states["emb"]["error"] and "error" not in states["rr"]
            assert_error(await c.get("/ping"), 503, None, "died")
            for route in ("/embeddings", "/invocations"):
                response = await c.post(route, json=GOOD[route])
                assert_error(response, 503, None, "emb", "not serving", "died")
                assert int(response.headers["retry-after"]) > 0
            models = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
            assert models["emb"]["stats"]["worker_alive"] is False
            # the other model keeps serving
            assert (await c.post("/rerank", json=GOOD["/rerank"])).status_code == 200
        finally:
            killer.cancel()
            await asyncio.gather(killer, return_exceptions=True)


async def test_the_request_whose_batch_killed_the_worker_gets_an_answer(tiny_embedder, rare_id):
    """Nothing waits forever: the batch that was running when its worker died is answered."""
    spec = spec_of(fake(tiny_embedder, "emb", backend_options={"exit_token_id": rare_id}, token_ids="model"))
    async with serve_in_process(spec) as c:
        # a hang guard, not a timing assertion: the answer comes in milliseconds or never
        response = await asyncio.wait_for(c.post("/embeddings", json={"input": [rare_id]}), 3)
        assert_error(response, 503, None, "emb", "died")
        assert int(response.headers["retry-after"]) > 0


async def test_shutting_down_is_503(tiny_embedder, monkeypatch):
    """A request arriving while the model stops (queue closed, a batch still running). The
    steps wait on events, not on time: the batch is held in its forward pass until released."""
    import threading

    from conftest import wait_until

    engine = Engine(spec_of(fake(tiny_embedder, "emb")))
    async with serve_in_process(engine) as c:
        loaded = engine.models["emb"].loaded
        forward, entered, release = loaded.backend.forward, threading.Event(), threading.Event()

        def held(inputs):
            entered.set()
            release.wait(60)
            return forward(inputs)

        monkeypatch.setattr(loaded.backend, "forward", held)
        running = asyncio.ensure_future(c.post("/embeddings", json={"input": ["slow"]}))
        await wait_until(entered.is_set)  # the worker is in that batch's forward pass
        stopping = asyncio.ensure_future(asyncio.to_thread(engine.models["emb"].stop))
        await wait_until(lambda: loaded.replicas()[0].queue.closed)  # stop() closed the queue, and waits
        response = await c.post("/embeddings", json={"input": ["late"]})
        release.set()
        await asyncio.gather(running, stopping, return_exceptions=True)
        assert_error(response, 503, None)
        assert response.json()["error"]["type"] == "model_not_ready"
        assert int(response.headers["retry-after"]) > 0


async def test_the_characters_per_text_limit_holds(tiny_embedder):
    spec = spec_of(fake(tiny_embedder, "emb"), limits={"max_chars_per_text": 50})
    async with serve_in_process(spec) as c:
        at_limit = await c.post("/embeddings", json={"input": ["a" * 50]})
        assert at_limit.status_code == 200, at_limit.text
        over = await c.post("/embeddings", json={"input": ["fine", "a" * 51]})
        assert_error(over, 413, "input", "item 1", "51 characters", "limit of 50")


# -- request ids -----------------------------------------------------------------------------


async def test_every_answer_carries_a_request_id(client):
    fresh = await client.post("/embeddings", json={"model": "emb", "input": "a"})
    assert len(fresh.headers["x-request-id"]) == 16
    traced = {"X-Request-Id": "trace-42"}
    mine = await client.post("/embeddings", json={"model": "emb", "input": ""}, headers=traced)
    assert mine.status_code == 400 and mine.headers["x-request-id"] == "trace-42"
    odd = await client.get("/nowhere", headers={"X-Request-Id": "bad id\twith spaces"})
    assert odd.status_code == 404 and odd.headers["x-request-id"] != "bad id\twith spaces"


def test_json_log_lines_carry_the_request_id():
    import json
    import subprocess
    import sys

    from conftest import ROOT

    code = (
        "import logging; from infinity_cloud.server.logs import configure_logging; "
        "from infinity_cloud.server import request_id; configure_logging('info', 'json'); "
        "token = request_id.current.set('abc123'); "
        "logging.getLogger('infinity_cloud.x').info('hello %s', 'there')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    line = json.loads(run.stderr.strip().splitlines()[-1])
    assert line["message"] == "hello there" and line["request_id"] == "abc123"
    assert line["level"] == "INFO" and line["logger"] == "infinity_cloud.x"


@pytest.mark.parametrize("form", ["json", "text"])
def test_a_servers_own_lines_and_uvicorns_share_one_format_with_the_request_id(
    tiny_embedder, tmp_path, form: str
) -> None:
    import json

    from conftest import FAKE, server_process

    log = tmp_path / "server.log"
    with server_process("--model-id", str(tiny_embedder), "--backend", FAKE, "--log-format", form,
                        log_path=log) as url:
        assert httpx.post(f"{url}/embeddings", json={"input": ["hi"]},
                          headers={"X-Request-Id": "trace-77"}).status_code == 200
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    assert not any("[None]" in line for line in lines)  # no request: no tag
    if form == "json":
        records = [json.loads(line) for line in lines if line.startswith("{")]
        access = [r for r in records if r["logger"] == "uvicorn.access" and "POST /emb" in r["message"]]
        assert [r["request_id"] for r in access] == ["trace-77"]
        assert any(r["logger"] == "uvicorn.error" and "Uvicorn running" in r["message"] for r in records)
    else:
        assert any("uvicorn.access" in line and line.endswith("[trace-77]") for line in lines), lines


async def test_the_front_page_lists_the_models_and_where_to_go(tiny_embedder) -> None:
    async with serve_in_process(spec_of(fake(tiny_embedder, "emb,tei"))) as client:
        page = (await client.get("/")).json()
    assert page["name"] == "infinity-cloud"
    assert [(m["id"], m["aliases"], m["state"]) for m in page["models"]] == [("emb", ["tei"], "ready")]
    assert page["links"]["docs"] == "/docs" and page["links"]["embeddings"] == "/v1/embeddings"


# -- memory budget -----------------------------------------------------------------------


async def test_memory_budget_sheds_what_would_not_fit(tiny_embedder):
    """Each request's memory is estimated before any work: one that could never fit is 413,
    ones that would fit once others finish are 429 with Retry-After, and when all admitted
    work is done the heap is trimmed. Resident memory is pinned so the arithmetic is exact."""
    trims = []
    slow = fake(tiny_embedder, "emb", max_batch_size=64, deadline_s=None, backend_options={"delay_s": 0.2})
    engine = Engine(spec_of(slow))
    engine.memory = MemoryBudget(100 * MB, resident=lambda: 40 * MB, trim=lambda: trims.append(1))
    long_text = ("a fairly ordinary sentence of words " * 223)[:8000]
    async with serve_in_process(engine) as c:
        # Beside the resident 40 MB, the model's full batches are set aside: 60 MB for requests.
        engine.memory.limit_bytes = 100 * MB + engine.models["emb"].working_set_bytes
        response = await c.post("/embeddings", json={"input": [long_text] * 2000})  # ~16 MB
        assert_error(response, 413, None, "would take about", "MB", "memory budget")
        # ~16 MB each by the estimate: three fit beside the 40 MB resident, not all six.
        medium = {"input": [long_text] * 300}
        responses = await asyncio.gather(*(c.post("/embeddings", json=medium) for _ in range(6)))
        statuses = sorted(r.status_code for r in responses)
        assert statuses.count(200) == 3 and statuses.count(429) == 3, statuses
        for response in responses:
            if response.status_code == 429:
                assert_error(response, 429, None, "memory budget")
                assert int(response.headers["retry-after"]) >= 1
            else:
                assert len(response.json()["data"]) == 300
        await wait_until(lambda: engine.memory.held_bytes == 0 and trims)
        await assert_still_serving(c)


async def test_an_answer_that_could_pass_the_response_limit_is_a_413_before_any_work(tiny_embedder) -> None:
    """Lambda and SageMaker pass at most 6 MB back: a request whose answer could be larger is
    refused up front, and what is let through, as JSON floats or base64, fits."""
    limit = 200_000  # a tiny model's answers reach it within the input limits
    model = ModelSpec(model_id=str(tiny_embedder), backend="onnx")
    spec = spec_of(model, limits={"max_response_bytes": limit})
    async with serve_in_process(spec) as client:
        width = len((await client.post("/embeddings", json={"input": ["x"]})).json()["data"][0]["embedding"])
        # The bounds the server uses: 17 bytes a number as JSON, 6 as base64, 96 an entry.
        for encoding, per_number in (("float", 17), ("base64", 6)):
            fits = (limit - 4096) // (per_number * width + 96)
            texts = [f"text number {i} with some words" for i in range(fits)]
            answer = await client.post("/embeddings", json={"input": texts, "encoding_format": encoding})
            assert answer.status_code == 200 and len(answer.content) <= limit, encoding
            twice = {"input": [*texts, *texts], "encoding_format": encoding}
            refused = await client.post("/embeddings", json=twice)
            assert refused.status_code == 413, encoding
            message = refused.json()["error"]["message"]
            assert "more than this deployment's response limit of 0.2 MB" in message
            assert "at least 2" in message


@pytest.mark.parametrize("where", ["user", "input", "model", "dimensions", "encoding_format"])
async def test_the_parsers_deepest_nesting_in_any_field_is_a_422_not_a_500(client, where: str) -> None:
    """orjson reads 1,024 levels; the 422 for them does not echo the value back (it used to
    recurse past Python's limit while encoding it: a 500)."""
    deep = "[" * 1000 + "]" * 1000
    body = {"input": '"a"', "user": '"u"', "model": '"emb"', "dimensions": "8", "encoding_format": '"float"'}
    body[where] = deep
    raw = "{" + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}"
    response = await client.post("/embeddings", content=raw.encode(), headers=JSON)
    assert_error(response, 422, where, "invalid request")
    assert all("input" not in d for d in response.json()["detail"])
    await assert_still_serving(client, "/embeddings")


async def test_head_health_answers_as_get_does(client) -> None:
    for route in ("/health", "/ping"):
        head = await client.head(route)
        assert head.status_code == (await client.get(route)).status_code == 200 and head.content == b""
    document = (await client.get("/openapi.json")).json()  # HEAD kept out: one id an operation
    ids = [op["operationId"] for path in document["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


# Every dialect's name for Matryoshka truncation, and where its answer keeps the first vector.
DIMENSIONS = [
    ("/v1/embeddings", {"input": "a"}, "dimensions", lambda body: body["data"][0]["embedding"]),
    ("/v1/embeddings", {"input": "a"}, "output_dimension", lambda body: body["data"][0]["embedding"]),
    ("/v2/embed", {"texts": ["a"]}, "output_dimension", lambda body: body["embeddings"]["float"][0]),
    ("/embed", {"inputs": "a"}, "dimensions", lambda body: body[0]),
]


@pytest.mark.parametrize(("route", "body", "field", "vector"), DIMENSIONS,
                         ids=[f"{r}-{f}" for r, _, f, _ in DIMENSIONS])
async def test_dimensions_zero_is_the_full_vector_in_every_dialect(client, route, body, field, vector):
    """api.md: 0 or absent means the full vector; a negative count is a 400 that says so, naming
    the field as the dialect calls it."""
    full = await client.post(route, json={**body, "model": "emb"})
    zero = await client.post(route, json={**body, "model": "emb", field: 0})
    assert full.status_code == zero.status_code == 200, zero.text
    assert len(vector(zero.json())) == len(vector(full.json())) == 32
    cut = await client.post(route, json={**body, "model": "emb", field: 8})
    assert cut.status_code == 200 and len(vector(cut.json())) == 8, cut.text
    negative = await client.post(route, json={**body, "model": "emb", field: -1})
    assert negative.status_code == 400, negative.text
    assert field in negative.text and "0 or absent (the full vector)" in negative.text, negative.text
