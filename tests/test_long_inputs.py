"""Long inputs on a long-context model (a tiny ModernBERT with an 8,192-token window, built at
test time): an 8,192-token input is admitted and served as transformers computes it; short
inputs queued beside it are batched by length, not padded to it (the batch reports count the
padded tokens); OpenVINO says at load which attention kernel it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import serve_in_process, spec_of
from transformers import AutoModel, AutoTokenizer

from infinity_cloud.batching.worker import BatchReport
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.engine import Engine

LONG = 8192


@pytest.fixture(scope="module")
def modernbert(build_model: Callable[..., Path]) -> Path:
    return build_model("modernbert_embedder")


def _reference(path: Path, text: str) -> tuple[np.ndarray, int]:
    """transformers' mean-pooled, normalised vector of `text`, and its token count."""
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path)).eval()
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        states = model(**encoded).last_hidden_state[0]
    mean = states.mean(0).numpy()
    return mean / np.linalg.norm(mean), int(encoded["input_ids"].shape[1])


async def test_an_8192_token_input_is_served_and_short_ones_are_not_padded_to_it(modernbert) -> None:
    reports: list[BatchReport] = []
    model = ModelSpec(model_id=str(modernbert), served_model_name="long", backend="torch", dtype="float32")
    engine = Engine(spec_of(model), observers=[reports.append])
    long_text = " ".join(["word"] * (LONG - 2))  # one token a word, [CLS] and [SEP] around
    shorts = [f"short text number {i} " + "word " * (i % 7) for i in range(24)]
    async with serve_in_process(engine) as client:
        reports.clear()  # the warm-up's
        posts = [client.post("/v1/embeddings", json={"input": long_text, "truncate": False}, timeout=600)]
        posts += [client.post("/v1/embeddings", json={"input": text}, timeout=600) for text in shorts]
        answers = await asyncio.gather(*posts)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:1]
    got = np.array(answers[0].json()["data"][0]["embedding"], np.float32)
    want, tokens = _reference(modernbert, long_text)
    assert tokens == LONG and answers[0].json()["usage"]["prompt_tokens"] == LONG
    assert float(got @ want) / np.linalg.norm(got) >= 0.9999

    with_long = [r for r in reports if r.padded_tokens >= LONG]
    assert len(with_long) == 1 and with_long[0].size == 1, "the long input runs alone"
    short_padded = sum(r.padded_tokens for r in reports) - LONG
    short_real = sum(r.real_tokens for r in reports) - LONG
    assert short_real > 0 and short_padded <= 2 * short_real, (short_padded, short_real)


async def test_openvino_says_at_load_which_attention_kernel_runs(modernbert, caplog) -> None:
    model = ModelSpec(model_id=str(modernbert), served_model_name="long", backend="openvino", dtype="float32")
    with caplog.at_level(logging.INFO, logger="infinity_cloud"):
        async with serve_in_process(spec_of(model)) as client:
            response = await client.post("/v1/embeddings", json={"input": "a b c"})
            assert response.status_code == 200, response.text
    said = [r.getMessage() for r in caplog.records if "attention on OpenVINO" in r.getMessage()]
    assert len(said) == 1, said
    kinds = ("OpenVINO's SDPA kernel (2 layer", "in one Snippets kernel per layer", "unfused MatMul, Softmax")
    assert any(kind in said[0] for kind in kinds), said[0]
    assert "2 layer(s)" in said[0] or "(2 Softmax" in said[0], "one attention per layer of the 2"
    assert "2 ScaledDotProductAttention op(s) in the IR" in said[0], said[0]


async def test_a_burst_of_long_inputs_is_refused_with_a_retry_after_that_holds(modernbert) -> None:
    """Attention's square counted in the queue's work (`BatchQueue.work`): a burst of
    8,192-token requests is admitted only as far as the deadline allows at their real cost,
    and the rest get a 429 whose Retry-After covers the work admitted before them. Counted at a
    short input's pace (tokens alone), three of six were admitted with a 3 s deadline on the
    2-core EPYC, the last answered after 18 s, and the 429s said to retry after 2 to 5 s."""
    deadline = 3
    model = ModelSpec(model_id=str(modernbert), served_model_name="long", backend="openvino", dtype="float32",
                      deadline_s=deadline)
    engine = Engine(spec_of(model))
    texts = [" ".join(["word"] * (LONG - 3)) + f" {i}" for i in range(6)]

    async with serve_in_process(engine) as client:

        async def post(text: str) -> tuple[httpx.Response, float]:
            answer = await client.post("/v1/embeddings", json={"input": text, "truncate": False}, timeout=600)
            return answer, time.monotonic() - started

        started = time.monotonic()
        answered = await asyncio.gather(*(post(text) for text in texts))
        assert (await client.get("/health")).status_code == 200, "served on, nothing ran out of memory"
    answers = [answer for answer, _ in answered]
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) <= {200, 429} and statuses[0] == 200, statuses
    refused = [a for a in answers if a.status_code == 429]
    assert refused, "a burst past the deadline's work is refused"
    # When the work admitted was done: a client back after its Retry-After waits at most the
    # deadline behind what is left of it (the server's promise, checked against what it did).
    drained = max(at for answer, at in answered if answer.status_code == 200)
    for answer in refused:
        retry_after = int(answer.headers["Retry-After"])
        assert retry_after + deadline >= drained, (retry_after, drained, statuses)
        assert answer.json()["error"]["type"], answer.text  # the route's own error shape
