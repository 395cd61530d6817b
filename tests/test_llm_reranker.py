"""LLM rerankers (`families/llm_reranker.py`): tiny Qwen3-Reranker and bge-reranker-v2-gemma
folders, written as sentence-transformers 6 writes them (Transformer in text-generation, then
LogitScore), served over HTTP by the real app and compared with sentence-transformers'
CrossEncoder on the same folder: within 1e-3 in float32 on OpenVINO and torch, the same order
at the precision the server picks; the instruction changed per request (every dialect that
ranks with `documents`) and per model. And no silent misload: a text folder whose
architecture the server cannot serve as what it is is refused at load, naming it."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import serve_in_process, spec_of
from sentence_transformers import CrossEncoder

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import ModelLoadError, UnsupportedError
from infinity_cloud.families import read_model_info

SCORE_ATOL = 1e-3
MODELS = ("qwen3_reranker", "gemma_reranker")
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "the quick brown fox jumps over the lazy dog",
    "xyzzy",
    "London is a big city. " * 3,
    "Numbers like 0 1 2 3 and symbols ∑∫√ appear too!",
    # Past the model's 512 tokens: cut, and the template's tail put back, as sentence-transformers does.
    " ".join(["the people of the north read a story about the sea"] * 60),
]
INSTRUCTION = "Find a passage that names a city"
# Each dialect that ranks `documents`, and where its scores are.
ROUTES = {"/rerank": "results", "/v1/rerank": "results", "/v2/rerank": "results"}


@functools.cache
def cross_encoder(path: Path) -> CrossEncoder:
    return CrossEncoder(str(path), device="cpu")


def reference(path: Path, instruction: str | None = None) -> np.ndarray:
    return cross_encoder(path).predict([(QUERY, d) for d in DOCUMENTS], prompt=instruction)


def scores_of(body: dict[str, Any]) -> np.ndarray:
    scores = np.full(len(DOCUMENTS), np.nan)
    for result in body["results"]:
        scores[result["index"]] = result["relevance_score"]
    return scores


async def ranked(spec: ModelSpec, route: str = "/rerank", **fields: Any) -> np.ndarray:
    async with serve_in_process(spec_of(spec)) as client:
        response = await client.post(route, json={"model": "rr", "query": QUERY, "documents": DOCUMENTS,
                                                  **fields})
        assert response.status_code == 200, response.text
        return scores_of(response.json())


@pytest.mark.parametrize("kind", MODELS)
def test_each_is_read_as_an_llm_reranker(build_model: Callable[..., Path], kind: str) -> None:
    info = read_model_info(build_model(kind))
    assert (info.family.name, info.capability.value, info.towers) == ("llm-reranker", "rerank",
                                                                     {"text": "answer_logits"})


def test_the_reference_scores_differ_per_document(build_model: Callable[..., Path]) -> None:
    """The comparisons below could not pass with another document's score."""
    for kind in MODELS:
        want = reference(build_model(kind))
        assert len(set(np.round(want, 4))) == len(DOCUMENTS), (kind, want)


@pytest.mark.parametrize("backend", ["openvino", "torch"])
@pytest.mark.parametrize("kind", MODELS)
async def test_float32_scores_match_cross_encoder(
    build_model: Callable[..., Path], kind: str, backend: str
) -> None:
    path = build_model(kind)
    spec = ModelSpec(model_id=str(path), served_model_name="rr", backend=backend, dtype="float32")
    got = await ranked(spec)
    want = reference(path)
    np.testing.assert_allclose(got, want, atol=SCORE_ATOL, err_msg=f"{kind} on {backend}")


@pytest.mark.parametrize("kind", MODELS)
async def test_the_default_precision_keeps_the_order(build_model: Callable[..., Path], kind: str) -> None:
    path = build_model(kind)
    got = await ranked(ModelSpec(model_id=str(path), served_model_name="rr"))
    want = reference(path)
    np.testing.assert_array_equal(np.argsort(-got), np.argsort(-want))


@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_a_requests_instruction_is_the_models_prompt(
    build_model: Callable[..., Path], route: str
) -> None:
    path = build_model("qwen3_reranker")
    spec = ModelSpec(model_id=str(path), served_model_name="rr", dtype="float32")
    got = await ranked(spec, route, instruction=INSTRUCTION)
    want = reference(path, INSTRUCTION)
    assert np.abs(want - reference(path)).max() > 1e-3, "the instruction changes the scores"
    np.testing.assert_allclose(got, want, atol=SCORE_ATOL)


async def test_a_models_instruction_is_its_default(build_model: Callable[..., Path]) -> None:
    path = build_model("gemma_reranker")
    spec = ModelSpec(model_id=str(path), served_model_name="rr", dtype="float32", instruction=INSTRUCTION)
    np.testing.assert_allclose(await ranked(spec), reference(path, INSTRUCTION), atol=SCORE_ATOL)


async def test_a_folders_default_prompt_is_its_instruction(build_model: Callable[..., Path]) -> None:
    path = build_model("qwen3_reranker", prompts={"web": INSTRUCTION}, default_prompt="web")
    spec = ModelSpec(model_id=str(path), served_model_name="rr", dtype="float32")
    got = await ranked(spec)
    np.testing.assert_allclose(got, reference(path, INSTRUCTION), atol=SCORE_ATOL)
    np.testing.assert_allclose(got, reference(path), atol=SCORE_ATOL)  # what CrossEncoder does by default


async def test_a_cross_encoder_refuses_an_instruction(tiny_reranker: Path) -> None:
    spec = ModelSpec(model_id=str(tiny_reranker), served_model_name="rr")
    async with serve_in_process(spec_of(spec)) as client:
        response = await client.post("/rerank", json={"model": "rr", "query": QUERY, "documents": DOCUMENTS,
                                                      "instruction": INSTRUCTION})
    assert response.status_code == 400, response.text
    assert "instruction" in response.text


def without_sentence_transformers(folder: Path, target: Path) -> Path:
    """The folder as a bare causal LM with its chat template (mxbai-rerank-v2's layout)."""
    shutil.copytree(folder, target)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (target / name).unlink()
    shutil.rmtree(target / "1_LogitScore")
    return target


async def test_a_bare_causal_lm_with_a_reranker_template_is_scored_as_cross_encoder_does(
    build_model: Callable[..., Path], tmp_path: Path
) -> None:
    """CrossEncoder scores such a folder by "yes" less "no"."""
    path = without_sentence_transformers(build_model("qwen3_reranker"), tmp_path / "bare")
    assert read_model_info(path).family.name == "llm-reranker"
    got = await ranked(ModelSpec(model_id=str(path), served_model_name="rr", dtype="float32"))
    np.testing.assert_allclose(got, reference(path), atol=SCORE_ATOL)


# -- no silent misload --------------------------------------------------------------------


def test_a_causal_lm_without_a_reranker_template_is_refused(
    build_model: Callable[..., Path], tmp_path: Path
) -> None:
    path = without_sentence_transformers(build_model("qwen3_reranker"), tmp_path / "bare")
    (path / "chat_template.jinja").unlink()
    with pytest.raises(UnsupportedError) as refused:
        read_model_info(path)
    message = str(refused.value)
    assert "Qwen3ForCausalLM" in message and "llm-reranker" in message and "text-encoder" in message, message


def test_logit_score_without_a_pair_template_is_refused(
    build_model: Callable[..., Path], tmp_path: Path
) -> None:
    path = tmp_path / "no-pairs"
    shutil.copytree(build_model("qwen3_reranker"), path)
    (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ModelLoadError, match=r"Qwen3ForCausalLM.*no chat template that renders a 'query'"):
        read_model_info(path)


@pytest.mark.parametrize("architecture", [
    "BertForTokenClassification", "BertForFooBar", "T5ForConditionalGeneration",
])
def test_a_bare_folder_of_another_head_is_refused(
    build_model: Callable[..., Path], tmp_path: Path, architecture: str
) -> None:
    path = tmp_path / "other"
    shutil.copytree(build_model("bert_reranker"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    with pytest.raises(UnsupportedError, match=rf"architecture {architecture} is not served.*text-encoder"):
        read_model_info(path)


@pytest.mark.parametrize(("kind", "options"), [
    ("decoder_embedder", {}),  # a decoder with sentence-transformers' last-token pooling
    ("bert_embedder", {}),
    ("splade", {"sentence_transformers": False}),  # a bare masked LM: its base model's states
])
def test_embedders_stay_served(build_model: Callable[..., Path], kind: str, options: dict[str, Any]) -> None:
    assert read_model_info(build_model(kind, **options)).family.name == "text-encoder"


def test_a_causal_lm_pooled_by_the_caller_is_an_embedder(
    build_model: Callable[..., Path], tmp_path: Path
) -> None:
    path = without_sentence_transformers(build_model("qwen3_reranker"), tmp_path / "bare")
    (path / "chat_template.jinja").unlink()
    assert read_model_info(path, pooling="lasttoken").family.name == "text-encoder"
