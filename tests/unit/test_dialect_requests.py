"""Each dialect's request models, alone: a body as its clients send it parses to what it
means, and translates to the engine's ask (`asks.EmbedAsk`) the engine answers. No server, no
model: what a route adds on top is the HTTP tests' (tests/test_tei.py, test_clients.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from starlette.requests import Request

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import InvalidInputError, UnsupportedError
from infinity_cloud.engine.asks import ANY_EMBEDDING, EmbedAsk
from infinity_cloud.server.dialects import cohere, openai, tei, voyage
from infinity_cloud.server.dialects.common import RerankRequest
from infinity_cloud.server.dialects.infinity import ClassifyRequest


def http_request(**headers: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "query_string": b"",
                    "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]})


def openai_ask(body: dict[str, Any], **headers: str) -> EmbedAsk:
    return openai.embed_ask(openai.EmbeddingRequest.model_validate(body), http_request(**headers))


# -- OpenAI (and Voyage's names for three of its fields) -------------------------------------


@pytest.mark.parametrize(("sent", "inputs"), [
    ("one text", ["one text"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),  # one pre-tokenized input
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_openai_inputs_keep_their_order_and_shape(sent: Any, inputs: list[Any]) -> None:
    assert list(openai_ask({"input": sent}).inputs) == inputs


def test_openai_defaults_ask_any_embedding_as_the_model_serves_it() -> None:
    ask = openai_ask({"input": "x", "model": "m"})
    assert ask == EmbedAsk(["x"], "m", accepts=ANY_EMBEDDING, wait=False)


def test_openai_sparse_asks_a_splade_model_and_base64_is_packed() -> None:
    assert openai_ask({"input": "x", "encoding_format": "sparse"}).accepts == (Capability.SPARSE,)
    assert openai_ask({"input": "x", "encoding_format": "base64"}).packed
    assert not openai_ask({"input": "x", "encoding_format": "float"}).packed


def test_openai_fields_reach_the_ask() -> None:
    ask = openai_ask({"input": ["q"], "dimensions": 64, "embedding_type": "int8", "input_type": "query",
                      "modality": "text", "truncate": False})
    assert (ask.dimensions, ask.dtype, ask.use, ask.truncate) == (64, "int8", "query", False)


def test_voyage_names_mean_ours_and_errors_name_theirs() -> None:
    body = {"input": "x", "output_dtype": "float", "output_dimension": 32, "truncation": False}
    request = openai.EmbeddingRequest.model_validate(body)
    ask = openai.embed_ask(request, http_request())
    assert (ask.dtype, ask.dimensions, ask.truncate) == ("float32", 32, False)
    assert request.field_names() == {"embedding_types": "output_dtype", "dimensions": "output_dimension",
                                     "truncate": "truncation"}
    assert openai.EmbeddingRequest.model_validate({"input": "x"}).field_names() == {
        "embedding_types": "embedding_type"}


@pytest.mark.parametrize(("ours", "voyage", "value"), [
    ("embedding_type", "output_dtype", "int8"), ("dimensions", "output_dimension", 8),
    ("truncate", "truncation", True),
])
def test_a_field_and_its_voyage_name_are_not_both_sent(ours: str, voyage: str, value: Any) -> None:
    """Each is valid alone: both is a client's mistake the schema cannot state, a 400 naming
    the Voyage field (not a 422: the OpenAPI fuzz sends schema-valid bodies)."""
    with pytest.raises(InvalidInputError, match=f"'{ours}' or Voyage's '{voyage}'") as refused:
        openai.EmbeddingRequest.model_validate({"input": "x", ours: value, voyage: value})
    assert refused.value.param == voyage


def test_the_openai_sdk_is_told_by_its_headers() -> None:
    assert openai_ask({"input": "x"}, x_stainless_lang="python").openai_sender
    assert openai_ask({"input": "x"}, user_agent="OpenAI/Python 1.50").openai_sender
    assert not openai_ask({"input": "x"}, user_agent="python-httpx/0.27").openai_sender


# Parsing refuses a value of the wrong kind; counts, lengths and ranges (an empty list, a
# negative dimension) are admission's checks, after parsing (tests/test_http_errors.py).
@pytest.mark.parametrize("body", [
    {}, {"input": 3}, {"input": "x", "encoding_format": "hex"}, {"input": "x", "embedding_type": "int4"},
    {"input": "x", "modality": "video"}, {"input": "x", "dimensions": "64"},
    {"input": "x", "task": "retrieval.query"},  # Jina's, not served: refused, not ignored
])
def test_openai_bodies_that_are_mistakes_are_refused_while_parsing(body: dict[str, Any]) -> None:
    with pytest.raises((ValidationError, UnsupportedError)):
        openai.EmbeddingRequest.model_validate(body)


def test_null_means_the_default() -> None:  # litellm sends encoding_format: null
    body = openai.EmbeddingRequest.model_validate({"input": "x", "encoding_format": None})
    assert body.encoding_format == "float"


# -- Cohere ----------------------------------------------------------------------------------


def cohere_ask(body: dict[str, Any]) -> EmbedAsk:
    return cohere.embed_ask(cohere.CohereEmbedRequest.model_validate(body))


def test_cohere_texts_with_their_use_and_types_by_type() -> None:
    ask = cohere_ask({"texts": ["a", "b"], "input_type": "search_query", "embedding_types": ["float", "int8"],
                      "output_dimension": 16, "truncate": "NONE"})
    assert ask == EmbedAsk(["a", "b"], None, accepts=(Capability.EMBED,), dimensions=16, truncate=False,
                           use="search_query", dtype=("float", "int8"), wait=False)


def test_cohere_without_types_takes_the_models_own() -> None:
    ask = cohere_ask({"texts": ["a"]})
    assert (ask.dtype, ask.truncate, ask.modality) == (None, True, "text")


def test_cohere_images_are_embedded_as_images() -> None:
    ask = cohere_ask({"images": ["data:image/png;base64,AAAA"]})
    assert (list(ask.inputs), ask.modality) == (["data:image/png;base64,AAAA"], "image")


@pytest.mark.parametrize("body", [{}, {"texts": ["a"], "images": ["data:,"]}, {"texts": "a"},
                                  {"texts": ["a"], "input_type": "chat"},
                                  {"texts": ["a"], "truncate": "MIDDLE"}])
def test_cohere_bodies_that_are_mistakes_are_refused_while_parsing(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        cohere.CohereEmbedRequest.model_validate(body)


def test_cohere_truncating_the_start_is_refused_not_ignored() -> None:
    with pytest.raises(InvalidInputError, match="truncate START") as refused:
        cohere_ask({"texts": ["a"], "truncate": "START"})
    assert refused.value.param == "truncate"


# -- TEI -------------------------------------------------------------------------------------


def test_tei_inputs_one_or_many() -> None:
    assert tei.TeiEmbedRequest.model_validate({"inputs": "a"}).texts() == ["a"]
    assert tei.TeiEmbedRequest.model_validate({"inputs": ["a", "b"]}).texts() == ["a", "b"]


def test_tei_embed_normalises_unless_told_not_to() -> None:
    assert tei.TeiEmbedRequest.model_validate({"inputs": "a"}).normalize is True
    assert tei.TeiEmbedRequest.model_validate({"inputs": "a", "normalize": False}).normalize is False


def test_tei_root_tells_a_similarity_body_by_its_inputs() -> None:
    body = tei.TeiAnyRequest.model_validate({"inputs": {"source_sentence": "s", "sentences": ["a", "b"]}})
    assert isinstance(body.inputs, tei.SimilarityInputs) and body.inputs.sentences == ["a", "b"]
    assert tei.TeiAnyRequest.model_validate({"inputs": ["a"], "raw_scores": True}).raw_scores


def test_tei_left_truncation_is_refused_not_ignored() -> None:
    tei.check_direction("right")
    tei.check_direction("Right")
    with pytest.raises(InvalidInputError, match="left"):
        tei.check_direction("Left")


def test_tei_rerank_and_decode_bodies() -> None:
    rerank = tei.TeiRerankRequest.model_validate({"query": "q", "texts": ["a", "b"], "return_text": True})
    assert (rerank.texts, rerank.top_n, rerank.return_text) == (["a", "b"], None, True)
    assert tei.TeiDecodeRequest.model_validate({"ids": [[1, 2], [3]]}).ids == [[1, 2], [3]]
    with pytest.raises(ValidationError):
        tei.TeiDecodeRequest.model_validate({"ids": ["one"]})


# -- the rerank bodies (Infinity, Jina, Cohere; Voyage's own) and Infinity's classify --------


def test_rerank_documents_as_strings_or_text_objects_keep_their_order() -> None:
    body = RerankRequest.model_validate({"query": "q", "documents": ["a", {"text": "b"}, "c"], "top_n": 2})
    assert (body.docs(), body.top_n) == (["a", "b", "c"], 2)


def test_voyage_rerank_has_its_own_names() -> None:
    body = voyage.VoyageRerankRequest.model_validate({"query": "q", "documents": ["a"], "top_k": 1,
                                                      "truncation": False})
    assert (body.top_k, body.truncation, body.docs()) == (1, False, ["a"])


@pytest.mark.parametrize("body", [{"query": "q"}, {"query": 1, "documents": ["a"]},
                                  {"query": "q", "documents": [1]},
                                  {"query": "q", "documents": ["a"], "top_n": "2"},
                                  {"query": "q", "documents": ["a"], "modality": "audio"}])
def test_rerank_bodies_that_are_mistakes_are_refused_while_parsing(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RerankRequest.model_validate(body)


def test_classify_inputs_one_or_many() -> None:
    assert ClassifyRequest.model_validate({"input": "a"}).inputs() == ["a"]
    assert ClassifyRequest.model_validate({"input": ["a", "b"], "raw_scores": True}).inputs() == ["a", "b"]
