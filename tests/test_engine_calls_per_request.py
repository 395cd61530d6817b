"""Each HTTP request enters the engine once, and the engine looks its model up once: counted
through the real app, per request, for every route that does work (an embeddings request in
each dialect, rerank, classify, tokenize, decode, similarity, TEI's `/`, SageMaker's
`/invocations`). A route that asks the
engine first which model a name means and then asks it the work (TEI's `/` did, and its
routes given a model name) enters it twice; an engine that resolves the name again in each of
its own steps looks up 3 to 5 times."""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections import Counter
from typing import Any

import pytest
from conftest import fake, serve_in_process, spec_of

from infinity_cloud import Engine

# Is a call already inside the engine (a public method calling another)? Only the outermost counts.
_inside = contextvars.ContextVar("inside", default=False)

ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/embeddings", {"model": "emb", "input": ["a text"]}),
    ("/v1/embeddings/chunked", {"model": "emb", "input": ["a text. another one."], "chunk_tokens": 3}),
    ("/v1/embeddings", {"model": "emb", "input": ["a text"], "embedding_type": "int8"}),
    ("/v1/embeddings", {"model": "emb", "input": ["a text"], "output_dtype": "int8", "output_dimension": 16}),
    ("/v1/embed", {"model": "emb", "texts": ["a text"], "input_type": "search_query"}),
    ("/v2/embed", {"model": "emb", "texts": ["a text"], "input_type": "search_document",
                   "embedding_types": ["float", "int8", "binary"]}),
    ("/embed", {"inputs": "a text"}),
    ("/embed", {"inputs": "a text", "model": "any name a TEI client sends"}),
    ("/similarity", {"inputs": {"source_sentence": "a text", "sentences": ["another", "a third"]}}),
    ("/similarity", {"inputs": {"source_sentence": "a text", "sentences": ["b"]}, "model": "emb"}),
    ("/", {"inputs": "a text", "model": "emb"}),
    ("/", {"inputs": "a text", "model": "cls"}),
    ("/", {"inputs": {"source_sentence": "a text", "sentences": ["b"]}, "model": "emb"}),
    ("/models/cls", {"inputs": "a text"}),
    ("/rerank", {"model": "rr", "query": "a query", "documents": ["one", "two"]}),
    ("/rerank", {"query": "a query", "texts": ["one", "two"]}),  # TEI's
    ("/v1/rerank", {"model": "rr", "query": "a query", "documents": ["one", {"text": "two"}]}),
    ("/v2/rerank", {"model": "rr", "query": "a query", "documents": ["one", "two"], "top_n": 1}),
    ("/classify", {"model": "cls", "input": ["a text"]}),
    ("/predict", {"inputs": "a text", "model": "cls"}),
    ("/tokenize", {"inputs": "a text", "model": "emb"}),
    ("/decode", {"ids": [5, 6, 7], "model": "emb"}),
    # SageMaker's one route, told by the body what it is for (it asked the model's kind first)
    ("/invocations", {"model": "emb", "input": ["a text"]}),
    ("/invocations", {"model": "cls", "input": ["a text"]}),
    ("/invocations", {"model": "emb", "input": ["a text"], "encoding_format": "base64"}),
    ("/invocations", {"model": "rr", "query": "a query", "documents": ["one", "two"]}),
]


# The engine's public calls, which a request may enter by.
PUBLIC = {name for name, _ in inspect.getmembers(Engine, inspect.isfunction) if not name.startswith("_")}


def counted(method: Any, name: str, calls: Counter[str]) -> Any:
    """`method`, counted in `calls` when called from outside the engine."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not _inside.get():
            calls[name] += 1
        token = _inside.set(True)
        try:
            result = method(*args, **kwargs)
        finally:
            _inside.reset(token)
        if not inspect.isawaitable(result):
            return result

        async def awaited() -> Any:  # what it calls while awaited is inside too
            token = _inside.set(True)
            try:
                return await result
            finally:
                _inside.reset(token)

        return awaited()

    return call


def counting(engine: Engine) -> tuple[Counter[str], list[int]]:
    """`engine` with its public calls counted where they come from outside it (by name), and
    its model lookups counted (all of them, from inside too)."""
    calls: Counter[str] = Counter()
    lookups = [0]
    for name, _ in inspect.getmembers(type(engine), inspect.isfunction):
        if not name.startswith("_"):
            setattr(engine, name, counted(getattr(engine, name), name, calls))
    lookup = engine.fleet.lookup

    def counted_lookup(*args: Any, **kwargs: Any) -> Any:
        lookups[0] += 1
        return lookup(*args, **kwargs)

    engine.fleet.lookup = counted_lookup  # type: ignore[method-assign]
    return calls, lookups


@pytest.fixture(scope="module")
def three_models(tiny_embedder, tiny_reranker, tiny_classifier):  # type: ignore[no-untyped-def]
    return spec_of(fake(tiny_embedder, "emb"), fake(tiny_reranker, "rr"), fake(tiny_classifier, "cls"))


async def test_a_request_enters_the_engine_once_and_looks_its_model_up_once(three_models: Any) -> None:
    engine = Engine(three_models)
    found = []
    async with serve_in_process(engine) as client:
        await engine.calibration("emb")  # int8's ranges made before: counted is the request alone
        calls, lookups = counting(engine)
        for route, body in ROUTES:
            calls.clear()
            lookups[0] = 0
            response = await client.post(route, json=body)
            assert response.status_code == 200, (route, body, response.text)
            entered = sum(calls.values())
            assert calls.keys() <= PUBLIC, calls  # what is counted is the engine's own calls
            if entered != 1 or lookups[0] != 1:
                found.append(f"{route} {body}: entered the engine {entered} times {dict(calls)}, "
                             f"looked its model up {lookups[0]} times")
    assert not found, "\n".join(found)
