"""A dialect is its module and one line in the registry: a toy dialect written here (its
request, route, answer, and a body on a path another dialect owns) is served by the real app
over HTTP when it is passed to `create_app`, with API keys and the error shapes applied to it
as to every other dialect."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import fake, spec_of, wait_healthy
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.server.app import create_app
from infinity_cloud.server.dialects import DIALECTS
from infinity_cloud.server.dialects.common import Text, Texts, _Request, ranked
from infinity_cloud.server.dialects.registry import Body, Dialect, Mount, mount
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.engine_calls import answer
from infinity_cloud.server.errors import error_responses
from infinity_cloud.server.parsing import JsonRoute

KEY = "toy-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


# -- the toy dialect: what a new dialect's module holds --------------------------------------


class ToyEmbedRequest(_Request):
    sentences: Texts


class ToyRankRequest(_Request):
    question: Text
    candidates: Texts


router = APIRouter(tags=["toy"], route_class=JsonRoute, responses=error_responses())


@router.post("/toy/embed", summary="Embed sentences (the toy dialect's shape)")
async def toy_embed(body: ToyEmbedRequest, request: Request) -> Response:
    engine = request.app.state.engine
    result = await answer(request, body.model, len(body.sentences), engine.embeddings(EmbedAsk(
        body.sentences, body.model, wait=False)))
    return json_response({"vectors": result.embeddings, "served_by": result.model})


async def toy_rank(body: ToyRankRequest, request: Request) -> Response:
    result = await ranked(request, body.model, body.question, body.candidates, top_n=None,
                          raw_scores=False, truncate=True)
    return json_response({"order": [r.index for r in result.results]})


TOY = Dialect("Toy", mounts=(Mount(router, ("", "/toy-v1")),), bodies=(
    Body("/rerank", ToyRankRequest, toy_rank, lambda data: data.get("candidates") is not None),
))


# -- served by the real app ------------------------------------------------------------------


async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as c:
            await wait_healthy(c)
            yield c


@pytest.fixture(scope="module")
async def client(tiny_embedder: Path, tiny_reranker: Path) -> AsyncIterator[httpx.AsyncClient]:
    spec = spec_of(fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"), api_keys=[KEY])
    async for c in served(create_app(spec, dialects=[*DIALECTS, TOY])):
        yield c


async def test_the_toy_route_calls_the_engine(client: httpx.AsyncClient) -> None:
    sentences = ["hello world", "a b c"]
    for path in ("/toy/embed", "/toy-v1/toy/embed"):  # each prefix it asked for
        toy = await client.post(path, json={"model": "emb", "sentences": sentences}, headers=AUTH)
        assert toy.status_code == 200, toy.text
        ours = await client.post("/embeddings", json={"model": "emb", "input": sentences}, headers=AUTH)
        want = [d["embedding"] for d in ours.json()["data"]]
        np.testing.assert_allclose(np.array(toy.json()["vectors"]), np.array(want), rtol=1e-6)
        assert toy.json()["served_by"] == "emb"


async def test_its_body_on_another_dialects_path(client: httpx.AsyncClient) -> None:
    docs = ["a cat", "a dog", "a car"]
    toy = await client.post("/rerank", json={"model": "rr", "question": "pets", "candidates": docs},
                            headers=AUTH)
    infinity = await client.post("/rerank", json={"model": "rr", "query": "pets", "documents": docs},
                                 headers=AUTH)
    assert toy.status_code == infinity.status_code == 200, (toy.text, infinity.text)
    assert toy.json() == {"order": [r["index"] for r in infinity.json()["results"]]}
    # Infinity's field with the toy's body: refused, naming it, not ignored.
    mixed = await client.post("/rerank", json={"model": "rr", "question": "pets", "candidates": docs,
                                               "top_n": 1}, headers=AUTH)
    assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "top_n", mixed.text


async def test_api_keys_apply_to_it(client: httpx.AsyncClient) -> None:
    bodies = {"/toy/embed": {"sentences": ["x"]}, "/rerank": {"question": "q", "candidates": ["x"]}}
    for path, body in bodies.items():
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = await client.post(path, json=body, headers=headers)
            assert refused.status_code == 401, refused.text
            assert refused.headers["WWW-Authenticate"] == "Bearer"
            assert refused.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "emb", "sentences": "not a list"}, 422, "sentences"),  # schema: FastAPI's detail too
    ({"model": "emb"}, 422, "sentences"),
    ({"model": "emb", "sentences": [""]}, 400, None),  # the engine's check: an empty text
    ({"model": "nope", "sentences": ["x"]}, 404, "model"),  # several models served
    ({"model": "emb", "sentences": ["x"], "rank_fields": ["x"]}, 400, "rank_fields"),
])
async def test_errors_come_in_the_one_shape(
    client: httpx.AsyncClient, body: dict[str, Any], status: int, param: str | None
) -> None:
    response = await client.post("/toy/embed", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    if param is not None:
        assert error["param"] == param
    if status == 422:
        assert response.json()["detail"], response.text
    malformed = await client.post("/toy/embed", content=b'{"sentences": [', headers={**AUTH,
                                  "Content-Type": "application/json"})
    assert malformed.status_code == 422 and "malformed JSON" in malformed.json()["error"]["message"]


async def test_the_document_states_it(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    operation = document["paths"]["/toy/embed"]["post"]
    assert operation["operationId"] == "toy_embed_toy_embed_post"
    assert document["paths"]["/toy-v1/toy/embed"]["post"]["operationId"] == "toy-v1_toy_embed"
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema["$ref"] == "#/components/schemas/ToyEmbedRequest"
    assert {"400", "401", "422", "429", "503"} <= set(operation["responses"])
    rerank = document["paths"]["/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"#/components/schemas/RerankRequest", "#/components/schemas/ToyRankRequest"} <= {
        ref["$ref"] for ref in rerank["anyOf"]}
    assert document["paths"]["/rerank"]["post"]["operationId"] == "rerank_infinity_rerank_post"


async def test_the_default_app_has_no_toy(tiny_embedder: Path) -> None:
    async for c in served(create_app(spec_of(fake(tiny_embedder, "emb")))):
        assert (await c.post("/toy/embed", json={"sentences": ["x"]})).status_code == 404
        assert "/toy/embed" not in (await c.get("/openapi.json")).json()["paths"]


def test_a_body_for_a_path_no_dialect_owns_is_refused() -> None:
    stray = Dialect("Stray", bodies=(Body("/nowhere", ToyRankRequest, toy_rank, lambda data: True),))
    with pytest.raises(ValueError, match="/nowhere"):
        mount(FastAPI(), [*DIALECTS, stray], "", [])
