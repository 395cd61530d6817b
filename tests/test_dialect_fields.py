"""No ignored field in any dialect: every field of every request model the server accepts
(OpenAI, Infinity, Cohere, Jina, Voyage, TEI, vLLM's rerank) is walked here, and each one is
shown to change the answer, or to be refused with a 4xx that names it, or (a few metadata
fields) to be accepted on purpose with the reason said. A field added to a request model
without a line here fails `test_every_field_of_every_request_model_is_walked`."""

from __future__ import annotations

import importlib
import json
import pkgutil
import shutil
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import httpx
import pytest
from conftest import fake, post_through_calibration, serve_in_process, spec_of
from pydantic import BaseModel

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.server import dialects
from infinity_cloud.server.dialects import common

LONG = "word " * 400  # past every tiny model's limit


class Case(NamedTuple):
    model: type[BaseModel]
    field: str
    route: str
    base: dict[str, Any]
    variant: dict[str, Any]  # laid over `base`
    expect: int | str  # "changes", a 4xx status (whose message names the field), or "same: why"


EMB = {"model": "emb", "input": ["hello world", "a b c"]}
RR = {"model": "rr", "query": "q", "documents": ["a", "b c", "d e f"]}
TEI_RR = {"model": "rr", "query": "q", "texts": ["a", "b c", "d e f"]}
VO_RR = {**RR, "truncation": True}  # as the voyageai client sends it
CL = {"model": "cl", "input": ["hello"]}
CO = {"model": "emb", "texts": ["hello"], "input_type": "search_document", "embedding_types": ["float"]}
TEI = {"model": "emb", "inputs": ["hello"]}
SIM = {"model": "emb", "inputs": {"source_sentence": "a b", "sentences": ["a", "b c"]}}
SP = {"model": "sp", "inputs": ["hello world"]}
CH = {"model": "emb", "input": ["hello world. a b c d e f g h i j", "x y z"], "chunk_tokens": 4}


def request_models() -> dict[str, type[BaseModel]]:
    """The request models of every module of the dialects package (each dialect's, and what
    they share), by name: every `_Request`, and the models their fields hold. A dialect's
    other models (its error shape) are answers, not requests."""
    modules = [importlib.import_module(f"{dialects.__name__}.{info.name}")
               for info in pkgutil.iter_modules(dialects.__path__)]
    found = {name: obj for module in modules for name, obj in vars(module).items()
             if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__
             and not name.startswith("_")}
    requests = {name: model for name, model in found.items() if issubclass(model, common._Request)}
    fields = [field for request in requests.values() for field in request.model_fields.values()]
    held = {name: model for name, model in found.items() if any(holds(f.annotation, model) for f in fields)}
    return {**requests, **held}


def holds(annotation: Any, model: type[BaseModel]) -> bool:
    """Whether a field's type is `model` or contains it (a list of it, a union with it)."""
    return annotation is model or any(holds(arg, model) for arg in typing.get_args(annotation))


P = SimpleNamespace(**request_models())
CASES = [
    # OpenAI / Infinity / Jina / Voyage embeddings
    Case(P.EmbeddingRequest, "model", "/v1/embeddings", EMB, {"model": "nope"}, 404),
    Case(P.EmbeddingRequest, "input", "/v1/embeddings", EMB, {"input": ["other"]}, "changes"),
    Case(P.EmbeddingRequest, "encoding_format", "/v1/embeddings", EMB, {"encoding_format": "base64"},
         "changes"),
    Case(P.EmbeddingRequest, "dimensions", "/v1/embeddings", EMB, {"dimensions": 8}, "changes"),
    Case(P.EmbeddingRequest, "modality", "/v1/embeddings", EMB, {"modality": "image"}, 400),
    Case(P.EmbeddingRequest, "embedding_type", "/v1/embeddings", EMB, {"embedding_type": "ubinary"},
         "changes"),
    Case(P.EmbeddingRequest, "embedding_types", "/v1/embeddings", EMB,
         {"embedding_types": ["float", "binary"]}, "changes"),
    Case(P.EmbeddingRequest, "input_type", "/v1/embeddings", EMB, {"input_type": "query"}, "changes"),
    Case(P.EmbeddingRequest, "truncate", "/v1/embeddings", {**EMB, "input": [LONG]}, {"truncate": False},
         400),
    Case(P.EmbeddingRequest, "user", "/v1/embeddings", EMB, {"user": "u-1"},
         "same: OpenAI's end-user id, for its abuse monitoring; it changes no answer"),
    Case(P.EmbeddingRequest, "output_dtype", "/v1/embeddings", EMB, {"output_dtype": "int8"}, "changes"),
    Case(P.EmbeddingRequest, "late_chunking", "/v1/embeddings", EMB, {"late_chunking": True}, "changes"),
    Case(P.EmbeddingRequest, "output_dimension", "/v1/embeddings", EMB, {"output_dimension": 8},
         "changes"),
    Case(P.EmbeddingRequest, "truncation", "/v1/embeddings", {**EMB, "input": [LONG]},
         {"truncation": False}, 400),
    # our chunked embeddings
    Case(P.ChunkedEmbeddingRequest, "model", "/v1/embeddings/chunked", CH, {"model": "nope"}, 404),
    Case(P.ChunkedEmbeddingRequest, "input", "/v1/embeddings/chunked", CH, {"input": ["other"]}, "changes"),
    Case(P.ChunkedEmbeddingRequest, "chunk_tokens", "/v1/embeddings/chunked", CH, {"chunk_tokens": 2},
         "changes"),
    Case(P.ChunkedEmbeddingRequest, "overlap_tokens", "/v1/embeddings/chunked", CH, {"overlap_tokens": 2},
         "changes"),
    Case(P.ChunkedEmbeddingRequest, "encoding_format", "/v1/embeddings/chunked", CH,
         {"encoding_format": "base64"}, "changes"),
    Case(P.ChunkedEmbeddingRequest, "dimensions", "/v1/embeddings/chunked", CH, {"dimensions": 8}, "changes"),
    Case(P.ChunkedEmbeddingRequest, "input_type", "/v1/embeddings/chunked", CH, {"input_type": "query"},
         "changes"),
    Case(P.ChunkedEmbeddingRequest, "late_chunking", "/v1/embeddings/chunked", CH, {"late_chunking": True},
         "changes"),
    Case(P.ChunkedEmbeddingRequest, "prompt_name", "/v1/embeddings/chunked", CH, {"prompt_name": "query"},
         "changes"),
    # Infinity / Cohere / Jina rerank (and vLLM's, on Jina's path)
    Case(P.RerankRequest, "model", "/rerank", RR, {"model": "nope"}, 404),
    Case(P.RerankRequest, "query", "/rerank", RR, {"query": "another query"}, "changes"),
    Case(P.RerankRequest, "documents", "/rerank", RR, {"documents": ["x", "y"]}, "changes"),
    Case(P.RerankRequest, "top_n", "/rerank", RR, {"top_n": 1}, "changes"),
    Case(P.RerankRequest, "return_documents", "/rerank", RR, {"return_documents": True}, "changes"),
    Case(P.RerankRequest, "raw_scores", "/rerank", RR, {"raw_scores": True}, "changes"),
    Case(P.RerankRequest, "truncate", "/rerank", {**RR, "documents": [LONG]}, {"truncate": False}, 400),
    Case(P.RerankRequest, "modality", "/rerank", RR, {"modality": "image"}, 400),
    Case(P.RerankRequest, "max_tokens_per_doc", "/v2/rerank", {**RR, "documents": ["a b c d e", "a f"]},
         {"max_tokens_per_doc": 1}, "changes"),
    Case(P.RerankRequest, "max_tokens_per_doc", "/v2/rerank", RR, {"max_tokens_per_doc": 0}, 400),
    # An LLM reranker reads it (tests/test_llm_reranker.py: it changes the scores); this one reads none.
    Case(P.RerankRequest, "instruction", "/rerank", RR, {"instruction": "find a city"}, 400),
    # TEI's rerank, on Infinity's path
    Case(P.TeiRerankRequest, "model", "/rerank", TEI_RR, {"model": "emb"}, 400),
    Case(P.TeiRerankRequest, "query", "/rerank", TEI_RR, {"query": "another query"}, "changes"),
    Case(P.TeiRerankRequest, "texts", "/rerank", RR, {"documents": None, "texts": RR["documents"]},
         "changes"),
    Case(P.TeiRerankRequest, "top_n", "/rerank", TEI_RR, {"top_n": 1}, "changes"),
    Case(P.TeiRerankRequest, "return_text", "/rerank", TEI_RR, {"return_text": True}, "changes"),
    Case(P.TeiRerankRequest, "raw_scores", "/rerank", TEI_RR, {"raw_scores": True}, "changes"),
    Case(P.TeiRerankRequest, "truncate", "/rerank", {**TEI_RR, "texts": [LONG]}, {"truncate": False}, 400),
    Case(P.TeiRerankRequest, "truncation_direction", "/rerank", TEI_RR, {"truncation_direction": "left"},
         400),
    # Voyage's rerank, on the rerank paths (its client's is /v1/rerank)
    Case(P.VoyageRerankRequest, "model", "/v1/rerank", VO_RR, {"model": "nope"}, 404),
    Case(P.VoyageRerankRequest, "query", "/v1/rerank", VO_RR, {"query": "another query"}, "changes"),
    Case(P.VoyageRerankRequest, "documents", "/v1/rerank", VO_RR, {"documents": ["x", "y"]}, "changes"),
    Case(P.VoyageRerankRequest, "top_k", "/v1/rerank", VO_RR, {"top_k": 1}, "changes"),
    Case(P.VoyageRerankRequest, "top_k", "/rerank", RR, {"top_k": 1}, "changes"),
    Case(P.VoyageRerankRequest, "return_documents", "/v1/rerank", VO_RR, {"return_documents": True},
         "changes"),
    Case(P.VoyageRerankRequest, "raw_scores", "/v1/rerank", VO_RR, {"raw_scores": True}, "changes"),
    Case(P.VoyageRerankRequest, "truncation", "/v1/rerank", {**VO_RR, "documents": [LONG]},
         {"truncation": False}, 400),
    Case(P.VoyageRerankRequest, "truncation", "/rerank", {**RR, "documents": [LONG]}, {"truncation": False},
         400),
    Case(P.VoyageRerankRequest, "modality", "/v1/rerank", VO_RR, {"modality": "image"}, 400),
    # classification
    Case(P.ClassifyRequest, "model", "/classify", CL, {"model": "nope"}, 404),
    Case(P.ClassifyRequest, "input", "/classify", CL, {"input": ["another text entirely"]}, "changes"),
    Case(P.ClassifyRequest, "raw_scores", "/classify", CL, {"raw_scores": True}, "changes"),
    Case(P.ClassifyRequest, "truncate", "/classify", {**CL, "input": [LONG]}, {"truncate": False}, 400),
    # Cohere embed
    Case(P.CohereEmbedRequest, "model", "/v2/embed", CO, {"model": "nope"}, 404),
    Case(P.CohereEmbedRequest, "texts", "/v2/embed", CO, {"texts": ["other"]}, "changes"),
    Case(P.CohereEmbedRequest, "input_type", "/v2/embed", CO, {"input_type": "search_query"}, "changes"),
    Case(P.CohereEmbedRequest, "embedding_types", "/v2/embed", CO, {"embedding_types": ["ubinary"]},
         "changes"),
    Case(P.CohereEmbedRequest, "truncate", "/v2/embed", {**CO, "texts": [LONG]}, {"truncate": "NONE"},
         400),
    Case(P.CohereEmbedRequest, "output_dimension", "/v2/embed", CO, {"output_dimension": 8}, "changes"),
    Case(P.CohereEmbedRequest, "images", "/v2/embed", CO,
         {"texts": None, "images": ["data:image/png;base64,iVBORw0KGgo="]}, 400),
    # TEI (a name no model has goes to the one model that does the route's task: test_tei.py)
    Case(P.TeiEmbedRequest, "model", "/embed", TEI, {"model": "rr"}, 400),
    Case(P.TeiEmbedRequest, "inputs", "/embed", TEI, {"inputs": ["other"]}, "changes"),
    Case(P.TeiEmbedRequest, "truncate", "/embed", {**TEI, "inputs": [LONG]}, {"truncate": False}, 400),
    Case(P.TeiEmbedRequest, "truncation_direction", "/embed", TEI, {"truncation_direction": "left"}, 400),
    Case(P.TeiEmbedRequest, "normalize", "/embed", TEI, {"normalize": False}, "changes"),
    Case(P.TeiEmbedRequest, "prompt_name", "/embed", TEI, {"prompt_name": "query"}, "changes"),
    Case(P.TeiEmbedRequest, "dimensions", "/embed", TEI, {"dimensions": 8}, "changes"),
    Case(P.TeiAnyRequest, "model", "/", TEI, {"model": "cl"}, "changes"),
    Case(P.TeiAnyRequest, "inputs", "/", TEI, {"inputs": ["other"]}, "changes"),
    Case(P.TeiAnyRequest, "truncate", "/", {**TEI, "inputs": [LONG]}, {"truncate": False}, 400),
    Case(P.TeiAnyRequest, "truncation_direction", "/", TEI, {"truncation_direction": "left"}, 400),
    Case(P.TeiAnyRequest, "normalize", "/", TEI, {"normalize": False}, "changes"),
    Case(P.TeiAnyRequest, "prompt_name", "/", TEI, {"prompt_name": "query"}, "changes"),
    Case(P.TeiAnyRequest, "dimensions", "/", TEI, {"dimensions": 8}, "changes"),
    Case(P.TeiAnyRequest, "raw_scores", "/", {**TEI, "model": "cl"}, {"raw_scores": True}, "changes"),
    Case(P.TeiPredictRequest, "model", "/predict", {**TEI, "model": "cl"}, {"model": "emb"}, 400),
    Case(P.TeiPredictRequest, "inputs", "/predict", {**TEI, "model": "cl"}, {"inputs": ["other"]},
         "changes"),
    Case(P.TeiPredictRequest, "truncate", "/predict", {"model": "cl", "inputs": [LONG]}, {"truncate": False},
         400),
    Case(P.TeiPredictRequest, "truncation_direction", "/predict", {**TEI, "model": "cl"},
         {"truncation_direction": "left"}, 400),
    Case(P.TeiPredictRequest, "raw_scores", "/predict", {**TEI, "model": "cl"}, {"raw_scores": True},
         "changes"),
    Case(P.TeiSimilarityRequest, "model", "/similarity", SIM, {"model": "rr"}, 400),
    Case(P.TeiSimilarityRequest, "inputs", "/similarity", SIM,
         {"inputs": {"source_sentence": "d e", "sentences": ["a", "b c"]}}, "changes"),
    Case(P.TeiSimilarityRequest, "truncate", "/similarity",
         {**SIM, "inputs": {"source_sentence": LONG, "sentences": ["a"]}}, {"truncate": False}, 400),
    Case(P.TeiSimilarityRequest, "truncation_direction", "/similarity", SIM,
         {"truncation_direction": "left"}, 400),
    Case(P.TeiSimilarityRequest, "prompt_name", "/similarity", SIM, {"prompt_name": "query"}, "changes"),
    Case(P.TeiEmbedSparseRequest, "model", "/embed_sparse", SP, {"model": "emb"}, 400),
    Case(P.TeiEmbedSparseRequest, "inputs", "/embed_sparse", SP, {"inputs": ["other"]}, "changes"),
    Case(P.TeiEmbedSparseRequest, "truncate", "/embed_sparse", {**SP, "inputs": [LONG]},
         {"truncate": False}, 400),
    Case(P.TeiEmbedSparseRequest, "truncation_direction", "/embed_sparse", SP,
         {"truncation_direction": "left"}, 400),
    Case(P.TeiEmbedSparseRequest, "prompt_name", "/embed_sparse", SP, {"prompt_name": "no-such-prompt"}, 400),
    Case(P.TeiTokenizeRequest, "model", "/tokenize", TEI, {"model": "nope"}, 404),
    Case(P.TeiTokenizeRequest, "inputs", "/tokenize", TEI, {"inputs": ["other"]}, "changes"),
    Case(P.TeiTokenizeRequest, "add_special_tokens", "/tokenize", TEI, {"add_special_tokens": False},
         "changes"),
    Case(P.TeiTokenizeRequest, "prompt_name", "/tokenize", TEI, {"prompt_name": "query"}, "changes"),
    Case(P.TeiDecodeRequest, "model", "/decode", {"model": "emb", "ids": [2, 10, 3]},
         {"model": "nope"}, 404),
    Case(P.TeiDecodeRequest, "ids", "/decode", {"model": "emb", "ids": [2, 10, 3]},
         {"ids": [2, 3]}, "changes"),
    Case(P.TeiDecodeRequest, "skip_special_tokens", "/decode", {"model": "emb", "ids": [2, 10, 3]},
         {"skip_special_tokens": False}, "changes"),
]
# Models whose fields are walked through the model that holds them.
NESTED = {P.TextDocument: "RerankRequest.documents", P.SimilarityInputs: "TeiSimilarityRequest.inputs"}


def test_every_field_of_every_request_model_is_walked() -> None:
    models = set(request_models().values()) - set(NESTED)
    walked = {(case.model, case.field) for case in CASES}
    missing = sorted(f"{m.__name__}.{f}" for m in models for f in m.model_fields if (m, f) not in walked)
    assert not missing, f"fields no case walks: {missing}"


@pytest.fixture(scope="module")
def with_prompts(tiny_embedder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny embedder with sentence-transformers prompts for queries and documents."""
    path = Path(shutil.copytree(tiny_embedder, tmp_path_factory.mktemp("prompted") / "m",
                                ignore=shutil.ignore_patterns(".infinity-cloud")))
    config = path / "config_sentence_transformers.json"
    data = json.loads(config.read_text(encoding="utf-8")) if config.exists() else {}
    config.write_text(json.dumps({**data, "prompts": {"query": "query: ", "document": "passage: "},
                                  "default_prompt_name": None}))
    return path


@pytest.fixture(scope="module")
async def client(
    with_prompts: Path, tiny_reranker: Path, tiny_classifier: Path, build_model
) -> AsyncIterator[Any]:
    splade = ModelSpec(model_id=str(build_model("splade")), served_model_name="sp", backend="torch",
                       dtype="float32")
    spec = spec_of(fake(with_prompts, "emb"), fake(tiny_reranker, "rr"), fake(tiny_classifier, "cl"), splade)
    async with serve_in_process(spec) as c:
        yield c


def answer(response: httpx.Response) -> Any:
    """The answer without what differs by call alone (an answer's id and time)."""
    data = response.json()
    return {k: v for k, v in data.items() if k not in ("id", "created")} if isinstance(data, dict) else data


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model.__name__}.{c.field}")
async def test_a_field_is_honoured_or_refused(client: httpx.AsyncClient, case: Case) -> None:
    base = await client.post(case.route, json=case.base)
    assert base.status_code == 200, (case.route, base.text)
    body = {k: v for k, v in {**case.base, **case.variant}.items() if v is not None}
    varied = await post_through_calibration(client, case.route, body)  # int8 calibrates first
    if case.expect == "changes":
        assert varied.status_code == 200, varied.text
        assert answer(varied) != answer(base), f"{case.field} changed nothing"
    elif isinstance(case.expect, int):
        assert varied.status_code == case.expect, varied.text
        error = varied.json()
        message = error["error"] if isinstance(error["error"], str) else error["error"]["message"]
        named = {case.field, *case.variant}
        assert any(name.rstrip("s") in message or name.replace("_", " ") in message for name in named) \
            or (case.expect == 404 and "nope" in message) or "limit" in message, message
    else:
        assert case.expect.startswith("same: ") and len(case.expect) > 20
        assert varied.status_code == 200 and answer(varied) == answer(base)


@pytest.mark.parametrize(("route", "body", "field", "value", "harmless"), [
    ("/v1/rerank", RR, "rank_fields", ["text"], None),
    ("/v1/embeddings", EMB, "task", "retrieval.query", None),
    ("/v1/embeddings", EMB, "normalized", False, True),
    ("/v1/rerank", RR, "truncate_prompt_tokens", 64, None),
])
async def test_a_dialects_field_no_request_model_serves_is_refused(
    client: httpx.AsyncClient, route: str, body: dict, field: str, value: Any, harmless: Any
) -> None:
    """Fields other dialects define (Cohere, Jina, vLLM) that the server does not do: a 400
    naming the field, except for the value that means what the server does anyway."""
    refused = await client.post(route, json={**body, field: value})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == field and f"'{field}' is not served" in refused.text
    if harmless is not None:
        assert (await client.post(route, json={**body, field: harmless})).status_code == 200
    assert (await client.post(route, json={**body, field: None})).status_code == 200  # null: not sent


@pytest.mark.parametrize(("route", "body", "field"), [
    ("/rerank", {**TEI_RR, "return_documents": True}, "return_documents"),  # Infinity's, with TEI's texts
    ("/rerank", {**TEI_RR, "documents": ["x"]}, "documents"),
    ("/rerank", {**RR, "return_text": True}, "return_text"),  # TEI's, with Infinity's documents
    ("/v1/rerank", {**VO_RR, "top_n": 1}, "top_n"),  # Jina's, with Voyage's truncation
    ("/v2/rerank", {**RR, "top_k": 1, "truncate": False}, "truncate"),
])
async def test_another_dialects_field_on_a_shared_path_is_refused(
    client: httpx.AsyncClient, route: str, body: dict, field: str
) -> None:
    """On a path several dialects share, a body is one dialect's: a field only another of
    them serves is a 400 naming it, not silently dropped."""
    refused = await client.post(route, json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == field and f"'{field}'" in refused.text
