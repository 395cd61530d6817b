"""Many requests at once, faults inside batches, and clients that leave.

Timeouts and polling loops here only keep a regression from hanging the suite; no test
asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import FAKE, cosines, serve_in_process, server_process, spec_of, wait_until
from tokenizers import Tokenizer

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.engine import Engine
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.numerics.inputs import ModelInputs

HANG_GUARD_S = 60.0
MARKER = "paris"  # one token in the tiny models' vocabulary
SENTENCE = (
    "the quick brown fox jumps over a lazy dog while paris and london sleep under one sunny sky "
    "embedding models map every sentence to vectors that rerankers and classifiers never see"
)
WORDS = SENTENCE.split()


def random_text(rng: random.Random) -> str:
    n = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55])
    return " ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice(["", ".", "!", "?"])


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text, whatever the order of its labels."""
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample.split("{")[0] == name and all(f'{k}="{v}"' in sample for k, v in labels.items()):
            return float(value)
    return 0.0


# -- many requests at once against the real MiniLM -----------------------------------------


@pytest.mark.slow
async def test_200_concurrent_requests_each_get_their_own_embeddings(
    live_server: str, minilm_dir: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    rng = random.Random(2024)
    pool = sorted({random_text(rng) for _ in range(300)})  # distinct texts, so a mix-up shows
    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(pool, convert_to_numpy=True)
    index = {text: i for i, text in enumerate(pool)}
    requests = [rng.sample(pool, rng.randint(1, 16)) for _ in range(200)]

    before = minilm_stats(live_server)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=live_server, limits=limits, timeout=HANG_GUARD_S * 5) as client:
        async def embed(texts: list[str]) -> dict[str, Any]:
            response = await client.post("/v1/embeddings", json={"model": "minilm", "input": texts})
            assert response.status_code == 200, response.text
            return response.json()

        answers = await asyncio.gather(*(embed(texts) for texts in requests))

    for texts, body in zip(requests, answers, strict=True):
        assert [d["index"] for d in body["data"]] == list(range(len(texts)))
        got = np.asarray([d["embedding"] for d in body["data"]])
        want = reference[[index[t] for t in texts]]
        assert cosines(got, want).min() >= 0.9999
    after = minilm_stats(live_server)
    inputs = sum(len(t) for t in requests)
    assert after["inputs_done"] - before["inputs_done"] == inputs
    assert after["batches_done"] - before["batches_done"] < inputs  # it batched across requests
    assert after["batches_failed"] == before["batches_failed"] and after["worker_alive"]


def minilm_stats(url: str) -> dict[str, Any]:
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    return next(m["stats"] for m in models if m["id"] == "minilm")


# -- a failing batch fails only its own requests -------------------------------------------


def marker_id(model_dir: Path) -> int:
    token_id = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(MARKER)
    assert token_id is not None
    return token_id


def fault_requests() -> list[tuple[list[str], bool]]:
    """(texts, holds the marker). A marked text is long (40+ tokens) and the budget is 64
    padded tokens, so a batch holding one holds nothing else: which requests fail is fixed."""
    rng = random.Random(5)
    short = ["hello world", "the cat", "a quick brown fox", "dogs", "one two three", "sunny day"]
    marked = f"{MARKER} " + " ".join(["the"] * 40)
    out = []
    for r in range(30):
        texts = rng.sample(short, rng.randint(1, 4))
        if r % 4 == 1:
            texts.insert(rng.randint(0, len(texts)), marked)
        out.append((texts, r % 4 == 1))
    return out


def raise_on_marker(forward: Callable[[ModelInputs], np.ndarray], token_id: int,
                    error: Callable[[], BaseException]) -> Callable[[ModelInputs], np.ndarray]:
    def patched(inputs: ModelInputs) -> np.ndarray:
        if (inputs.input_ids == token_id).any():
            raise error()
        return forward(inputs)

    return patched


async def check_fault_isolation(client: httpx.AsyncClient) -> None:
    cases = fault_requests()
    responses = await asyncio.gather(
        *(client.post("/embeddings", json={"model": "tiny", "input": texts}) for texts, _ in cases)
    )
    for (texts, marked), response in zip(cases, responses, strict=True):
        if marked:
            assert response.status_code == 500, response.text
            error = response.json()["error"]
            assert error["type"] == "inference_error"
            assert "failed for the batch holding this request's inputs" in error["message"]
        else:
            assert response.status_code == 200, response.text
            assert len(response.json()["data"]) == len(texts)

    after = await client.post("/embeddings", json={"model": "tiny", "input": ["hello world", "the cat"]})
    assert after.status_code == 200
    assert (await client.get("/health")).status_code == 200
    stats = (await client.get("/models")).json()["data"][0]["stats"]
    assert stats["worker_alive"]
    assert stats["batches_failed"] == sum(marked for _, marked in cases)
    metrics = (await client.get("/metrics")).text
    assert metric(metrics, "infinity_cloud_errors_total", model="tiny", kind="BatchFailedError") == 8


def fault_spec(model_dir: Path, **options: Any):
    defaults = {"served_model_name": "tiny", "device": "cpu", "batch_tokens": 64, "max_batch_size": 8}
    return spec_of(ModelSpec(model_id=str(model_dir), **{**defaults, **options}))


def injected_error() -> Exception:
    return RuntimeError("injected: marker token in batch")


async def test_failing_torch_batch_fails_only_its_requests(tiny_embedder: Path, monkeypatch) -> None:
    engine = Engine(fault_spec(tiny_embedder, backend="torch"))
    async with serve_in_process(engine) as client:
        backend = engine.models["tiny"].loaded.backend
        patched = raise_on_marker(backend.forward, marker_id(tiny_embedder), injected_error)
        monkeypatch.setattr(backend, "forward", patched)
        await check_fault_isolation(client)
        assert "injected: marker token" in (await client.post(
            "/embeddings", json={"input": fault_requests()[1][0]})).json()["error"]["message"]


async def test_fake_backend_fail_token_fails_only_its_requests(tiny_embedder: Path) -> None:
    options = {"fail_token_id": marker_id(tiny_embedder)}
    # No warm-up: the tiny vocabulary maps parts of the warm-up texts to the marker too.
    spec = fault_spec(tiny_embedder, backend=FAKE, backend_options=options, warmup=False)
    async with serve_in_process(spec) as client:
        await check_fault_isolation(client)


async def test_a_dead_worker_answers_503_and_fails_health(tiny_embedder: Path, monkeypatch) -> None:
    """A non-Exception error kills the worker: nothing hangs, and the orchestrator can see it."""

    class Crash(BaseException):
        pass

    engine = Engine(fault_spec(tiny_embedder, backend=FAKE))
    async with serve_in_process(engine) as client:
        backend = engine.models["tiny"].loaded.backend
        patched = raise_on_marker(backend.forward, marker_id(tiny_embedder), Crash)
        monkeypatch.setattr(backend, "forward", patched)
        response = await asyncio.wait_for(client.post("/embeddings", json={"input": [f"{MARKER} hello"]}),
                                          HANG_GUARD_S)
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"]
        health = await client.get("/health")
        assert health.status_code == 503
        assert "Crash" in health.json()["error"]["message"]
        later = await client.post("/embeddings", json={"input": ["hello"]})
        assert later.status_code == 503
        assert "not serving" in later.json()["error"]["message"]


# -- a client that leaves has its queued inputs dropped ------------------------------------


async def test_cancelled_request_inputs_never_reach_the_backend(tiny_embedder: Path, monkeypatch) -> None:
    """In process, a client that gives up cancels the request's task (as servers that cancel
    on disconnect do): its inputs still queued must be dropped, not run."""
    engine = Engine(fault_spec(tiny_embedder, backend=FAKE, max_batch_size=1))
    async with serve_in_process(engine) as client:
        loaded = engine.models["tiny"].loaded
        forward, queue = loaded.backend.forward, loaded.replicas()[0].queue
        gate, entered = threading.Event(), threading.Event()
        rows: list[int] = []

        def gated(inputs: ModelInputs) -> np.ndarray:
            rows.append(len(inputs.input_ids))
            entered.set()
            gate.wait(HANG_GUARD_S)
            return forward(inputs)

        monkeypatch.setattr(loaded.backend, "forward", gated)
        try:
            first = asyncio.ensure_future(client.post("/embeddings", json={"input": ["first"]}))
            await wait_until(entered.is_set, HANG_GUARD_S)
            leaving = client.post("/embeddings", json={"input": ["gone one", "gone two"]})
            leaver = asyncio.ensure_future(leaving)
            await wait_until(lambda: queue.depth == 2, HANG_GUARD_S)
            leaver.cancel()
            with pytest.raises(asyncio.CancelledError):
                await leaver
        finally:
            gate.set()
        assert (await first).status_code == 200
        assert (await client.post("/embeddings", json={"input": ["after"]})).status_code == 200
        assert sum(rows) == 2  # "first" and "after"; the leaver's two inputs were dropped
        stats = (await client.get("/models")).json()["data"][0]["stats"]
        assert stats["inputs_done"] == 2 and stats["queue_depth"] == 0


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/models", timeout=30).json()["data"][0]["stats"]


def _poll(condition: Callable[[], bool]) -> None:
    asyncio.run(wait_until(condition, HANG_GUARD_S, interval=0.02))


@pytest.mark.slow
def test_disconnected_client_inputs_are_dropped_by_a_real_server(tiny_embedder: Path, tmp_path: Path) -> None:
    """uvicorn tells the app the client left; the request's queued inputs never run."""
    config = tmp_path / "infinity-cloud.yaml"
    config.write_text(
        "models:\n"
        f"  - model_id: {tiny_embedder}\n"
        "    served_model_name: tiny\n"
        f"    backend: {FAKE}\n"
        "    max_batch_size: 1\n"
        "    backend_options: {delay_s: 0.5}\n"
        "server:\n"
        "  log_level: warning\n"
    )
    with server_process("--config", str(config)) as url:
        results: dict[str, Any] = {}
        # Four inputs, one per batch: the model is busy for two seconds.
        busy = threading.Thread(target=lambda: results.setdefault("busy", httpx.post(
            f"{url}/embeddings", json={"input": ["a", "b", "c", "d"]}, timeout=HANG_GUARD_S)))
        busy.start()
        _poll(lambda: _stats(url)["queue_depth"] >= 2)  # one running, two or three waiting
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/embeddings", json={"input": ["gone one", "gone two"]}, timeout=0.3)
        busy.join(HANG_GUARD_S)
        assert results["busy"].status_code == 200
        after = httpx.post(f"{url}/embeddings", json={"input": ["after"]}, timeout=HANG_GUARD_S)
        assert after.status_code == 200
        stats = _stats(url)
        assert stats["inputs_done"] == 5  # 4 + 1: the two inputs of the client that left never ran
        assert stats["queue_depth"] == 0
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert metric(metrics, "infinity_cloud_errors_total", model="tiny", kind="client_disconnected") == 1


def _storm_config(model_dir: Path, folder: Path) -> Path:
    """A model that is slow for its size: 50 ms a batch of at most 8 inputs (160 inputs/s), a
    0.5 s deadline; 200 requests of 1-12 texts are about 8 s of work, so most are shed first."""
    config = folder / "infinity-cloud.yaml"
    config.write_text(
        "models:\n"
        f"  - model_id: {model_dir}\n"
        "    served_model_name: tiny\n"
        f"    backend: {FAKE}\n"
        "    max_batch_size: 8\n"
        "    deadline_s: 0.5\n"
        "    backend_options: {delay_s: 0.05}\n"
        "server:\n"
        "  log_level: warning\n",
        encoding="utf-8",
    )
    return config


@pytest.mark.slow
def test_retrying_clients_all_converge_in_a_storm(tiny_embedder: Path, tmp_path: Path) -> None:
    """200 concurrent requests through the openai SDK's own retry (it honours Retry-After),
    far past capacity from a fresh start: every one is answered, with its own inputs in order
    (a request shed keeps its place in line: tests/unit/test_batching.py shows how)."""
    import openai

    rng = random.Random(7)
    requests = [[f"storm {r} text {i} " + random_text(rng) for i in range(rng.randint(1, 12))]
                for r in range(200)]

    async def alone() -> np.ndarray:  # the same deterministic model, in this process, unhurried
        async with Engine(ModelSpec(model_id=str(tiny_embedder), backend=FAKE)) as engine:
            return (await engine.embeddings(EmbedAsk([t for r in requests for t in r]))).embeddings

    want = asyncio.run(alone())
    with server_process("--config", str(_storm_config(tiny_embedder, tmp_path))) as url:

        tries: dict[bytes, int] = {}

        async def count(request: httpx.Request) -> None:
            tries[request.content] = tries.get(request.content, 0) + 1

        async def storm() -> list[Any]:
            limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
            async with httpx.AsyncClient(limits=limits, timeout=HANG_GUARD_S * 5,
                                         event_hooks={"request": [count]}) as http:
                client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=30, http_client=http)
                return await asyncio.gather(*(client.embeddings.create(model="tiny", input=texts)
                                              for texts in requests), return_exceptions=True)

        answers = asyncio.run(storm())
        failed = [repr(a)[:200] for a in answers if isinstance(a, BaseException)]
        assert not failed, f"{len(failed)} of 200 never answered: {failed[:3]}"
        start = 0
        for texts, answer in zip(requests, answers, strict=True):
            assert [d.index for d in answer.data] == list(range(len(texts)))
            got = np.asarray([d.embedding for d in answer.data])
            assert cosines(got, want[start : start + len(texts)]).min() >= 0.9999
            start += len(texts)
        shed = metric(httpx.get(f"{url}/metrics", timeout=30).text, "infinity_cloud_errors_total",
                      model="tiny", kind="QueueFullError")
        assert shed > 0, "nothing was shed: the storm did not overload the server"
        most = max(tries.values())
        print(f"storm: {shed:.0f} answers of 429 before all 200 were answered; at most {most} tries")
