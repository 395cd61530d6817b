"""The result cache (`infinity_cloud/cache/`): answers are the same with it and without it for
every task, only misses reach the model, a request may opt out, and Redis (a real
redis-server) is shared by two server processes, and when it is down requests are still
answered, uncached."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import free_port, serve_in_process, server_process, spec_of

from infinity_cloud.core.config import ModelSpec

CACHED = {"cache_mb": 64}


def cache_stats(metrics: str) -> dict[str, float]:
    """The cache's counters from a /metrics page."""
    found: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("infinity_cloud_cache_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def hits(stats: dict[str, float], store: str = "memory") -> float:
    return stats.get(f'infinity_cloud_cache_hits_total{{store="{store}"}}', 0.0)


TEXTS = ["the first chunk", "a second, longer chunk of a document", "the first chunk", "three"]


async def answers(spec: Any, calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], dict[str, float]]:
    """Each call's JSON answer, in order, from one server; then its cache counters."""
    out = []
    async with serve_in_process(spec) as client:
        for route, body in calls:
            response = await client.post(route, json=body)
            assert response.status_code == 200, response.text
            out.append(response.json())
        stats = cache_stats((await client.get("/metrics")).text)
    return out, stats


def comparable(answer: Any) -> Any:
    """An answer less what differs by request anyway (ids, timings), base64 vectors decoded."""
    if isinstance(answer, dict):
        return {k: comparable(np.frombuffer(base64.b64decode(v), dtype=np.float32).tolist()
                              if k == "embedding" and isinstance(v, str) else v)
                for k, v in answer.items() if k not in ("id", "created", "meta")}
    if isinstance(answer, list):
        return [comparable(v) for v in answer]
    return answer


def assert_same(ours: Any, theirs: Any, where: str = "answer") -> None:
    """Equal, numbers to float32's round-off: the model's numbers move by that much with the
    batch an input is run in (padding, rows), cache or not; a hit is the row first computed."""
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), where
        for key in ours:
            assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(ours, float) and not isinstance(theirs, bool):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6), where
    else:
        assert ours == theirs, where


CASES = {
    "embed": ("tiny_embedder", [
        ("/v1/embeddings", {"model": "m", "input": TEXTS}),
        ("/v1/embeddings", {"model": "m", "input": TEXTS[::-1]}),
        ("/v1/embeddings", {"model": "m", "input": TEXTS, "dimensions": 8}),
        ("/v1/embeddings", {"model": "m", "input": TEXTS, "encoding_format": "base64"}),
    ]),
    "rerank": ("tiny_reranker", [
        ("/rerank", {"model": "m", "query": "which chunk", "documents": TEXTS}),
        ("/rerank", {"model": "m", "query": "which chunk", "documents": TEXTS, "top_n": 2}),
    ]),
    "classify": ("tiny_classifier", [
        ("/classify", {"model": "m", "input": TEXTS}),
        ("/classify", {"model": "m", "input": TEXTS, "raw_scores": True}),
    ]),
    "sparse": ("splade", [("/embed_sparse", {"inputs": TEXTS}), ("/embed_sparse", {"inputs": TEXTS[:2]})]),
    "multi-vector": ("colbert", [("/embed_all", {"inputs": TEXTS}), ("/embed_all", {"inputs": TEXTS[1:]})]),
}


@pytest.mark.parametrize("task", sorted(CASES))
async def test_answers_are_the_same_with_the_cache_and_without(
    task: str, request: pytest.FixtureRequest, build_model: Callable[..., Path]
) -> None:
    fixture, calls = CASES[task]
    path = request.getfixturevalue(fixture) if fixture.startswith("tiny") else build_model(fixture)
    model = ModelSpec(model_id=str(path), served_model_name="m", backend="torch")
    plain, none = await answers(spec_of(model), calls)
    cached, stats = await answers(spec_of(model, **CACHED), calls + calls[:1])
    assert_same(comparable(cached[: len(calls)]), comparable(plain))
    assert comparable(cached[-1]) == comparable(cached[0]), "a hit is exactly the row first computed"
    assert not none, "no cache counters without a cache"
    distinct = len({t for t in TEXTS}) if task != "rerank" else len(set(TEXTS))
    assert hits(stats) > 0 and stats["infinity_cloud_cache_misses_total"] <= distinct + 1, stats


async def test_images_are_cached_by_their_pixels(build_model: Callable[..., Path]) -> None:
    from test_images import data_uri, picture

    model = ModelSpec(model_id=str(build_model("clip")), served_model_name="m", backend="torch")
    images = [data_uri(picture(64, 48, 1)), data_uri(picture(40, 40, 2))]
    body = {"model": "m", "input": images, "modality": "image"}
    calls = [("/v1/embeddings", body), ("/v1/embeddings", body)]
    plain, _ = await answers(spec_of(model), calls)
    cached, stats = await answers(spec_of(model, **CACHED), calls)
    assert_same(comparable(cached), comparable(plain))
    assert hits(stats) == 2 and stats["infinity_cloud_cache_misses_total"] == 2, stats


async def test_only_misses_reach_the_model_and_a_request_may_opt_out(tiny_embedder: Path) -> None:
    spec = spec_of(ModelSpec(model_id=str(tiny_embedder), served_model_name="m"), **CACHED)
    async with serve_in_process(spec) as client:
        async def embed(texts: list[str], **headers: str) -> list[list[float]]:
            body = {"model": "m", "input": texts}
            response = await client.post("/v1/embeddings", json=body, headers=headers)
            assert response.status_code == 200, response.text
            return [row["embedding"] for row in response.json()["data"]]

        async def inputs_run() -> float:
            """Inputs the model ran: the sum of its batches' sizes."""
            text = (await client.get("/metrics")).text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("infinity_cloud_batch_size_sum"))

        first = await embed(["a", "b", "c"])
        ran = await inputs_run()
        again = await embed(["c", "d", "a"])  # two hits, one miss
        assert again[0] == first[2] and again[2] == first[0]
        assert await inputs_run() == ran + 1, "only the miss went to the model"
        await embed(["a", "b"], **{"Cache-Control": "no-store"})  # neither read nor kept
        assert await inputs_run() == ran + 3
        await embed(["e"], **{"Cache-Control": "no-store"})
        await embed(["e"])  # "e" was not kept
        assert await inputs_run() == ran + 5
        await embed(["a"], **{"Cache-Control": "no-cache"})  # recomputed, and kept
        assert await inputs_run() == ran + 6
        stats = cache_stats((await client.get("/metrics")).text)
    assert hits(stats) == 2 and stats["infinity_cloud_cache_memory_bytes"] > 0, stats


def test_the_in_process_cache_is_bounded_in_bytes() -> None:
    from infinity_cloud.cache.memory_store import MemoryStore

    store = MemoryStore(10_000)
    rows = {bytes([i]): np.full(256, i, dtype=np.float32) for i in range(20)}  # 1 KB each
    store.put(rows.items())
    assert store.bytes <= 10_000 and 5 <= len(store) < 20
    newest = store.get([bytes([19]), bytes([0])])
    assert newest[0] is not None and newest[1] is None, "the least recently used went first"


# -- Redis: a real redis-server ---------------------------------------------------------

def redis_binary() -> str | None:
    """redis-server on PATH, or where INFINITY_CLOUD_REDIS_SERVER says (the README's test
    command sets it from .ci/fetch-redis, which unpacks Debian's package where none is installed)."""
    return os.environ.get("INFINITY_CLOUD_REDIS_SERVER") or shutil.which("redis-server")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = redis_binary()
    if binary is None:
        message = ("redis-server is not installed (apt-get install redis-server, or set "
                   "INFINITY_CLOUD_REDIS_SERVER)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start (exit {process.poll()})") from None
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


def embed_over_http(url: str, texts: list[str]) -> list[list[float]]:
    response = httpx.post(f"{url}/v1/embeddings", json={"model": "m", "input": texts}, timeout=60)
    assert response.status_code == 200, response.text
    return [row["embedding"] for row in response.json()["data"]]


def test_two_server_processes_share_the_redis_cache(tiny_embedder: Path, redis_url: str) -> None:
    args = ("--model-id", str(tiny_embedder), "--served-model-name", "m", "--backend", "torch",
            "--cache-url", redis_url)
    texts = ["shared across replicas", "and this one too", "a third"]
    with server_process(*args) as first, server_process(*args, "--cache-mb", "16") as second:
        computed = embed_over_http(first, texts)
        time.sleep(0.5)  # the first's writes go out after its answer
        shared = embed_over_http(second, texts)
        stats = cache_stats(httpx.get(f"{second}/metrics").text)
        again = embed_over_http(second, texts)  # now from the second's own memory
        stats_again = cache_stats(httpx.get(f"{second}/metrics").text)
    assert shared == computed == again
    assert hits(stats, "redis") == 3 and stats["infinity_cloud_cache_misses_total"] == 0, stats
    assert hits(stats_again, "memory") == 3, stats_again


async def test_redis_down_serves_uncached_within_the_deadline(
    tiny_embedder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    spec = spec_of(ModelSpec(model_id=str(tiny_embedder), served_model_name="m"), cache_url=dead)
    async with serve_in_process(spec) as client:
        for _ in range(3):
            response = await client.post("/v1/embeddings", json={"model": "m", "input": ["x", "y"]})
            assert response.status_code == 200, response.text
        stats = cache_stats((await client.get("/metrics")).text)
    assert stats["infinity_cloud_cache_redis_errors_total"] >= 1, stats
    warned = [r for r in caplog.records if "shared result cache" in r.getMessage()]
    assert len(warned) == 1, "logged once"


def _cached_keys(redis_url: str) -> list[bytes]:
    import redis

    return sorted(redis.Redis.from_url(redis_url).keys(b"infinity-cloud:*"))


async def _embed_with(spec: Any, texts: list[str]) -> tuple[list[Any], dict[str, float]]:
    """The texts' vectors from a fresh in-process server, its writes to Redis flushed."""
    from infinity_cloud.engine import Engine

    engine = Engine(spec)
    async with serve_in_process(engine) as client:
        # Connected (in the background) before the request: on a busy 2-core machine that
        # took more than the 5 s once waited here, and the request then ran without Redis.
        waited = time.monotonic() + 60
        while not engine.cache.redis.available and time.monotonic() < waited:
            await asyncio.sleep(0.01)
        assert engine.cache.redis.available, "the server did not reach redis-server within 60 s"
        response = await client.post("/v1/embeddings", json={"model": "m", "input": texts})
        assert response.status_code == 200, response.text
        stats = cache_stats((await client.get("/metrics")).text)
        await engine.cache.redis.flushed()
    return [row["embedding"] for row in response.json()["data"]], stats


async def test_rows_in_redis_that_are_not_the_models_are_recomputed(
    tiny_embedder: Path, redis_url: str
) -> None:
    """Rows overwritten in Redis with arrays of another shape, dtype or non-finite numbers
    (each a valid .npy) are not served: each is recomputed and counted as rejected, and the
    answer is the model's own (it used to be whatever was written, with a 200)."""
    import redis

    from infinity_cloud.cache.codec import encode_row

    redis.Redis.from_url(redis_url).flushdb()
    texts = [f"a tampered chunk {i}" for i in range(6)]
    spec = spec_of(ModelSpec(model_id=str(tiny_embedder), served_model_name="m", backend="torch"),
                   cache_url=redis_url, cache_timeout_ms=2000)  # a busy machine's Redis is slow too
    computed, _ = await _embed_with(spec, texts)
    keys = _cached_keys(redis_url)
    width = len(computed[0])
    forged = [np.zeros(10, np.float32), np.ones((width, width), np.float32), np.ones(width, np.float16),
              np.ones(width, bool), np.full(width, np.nan, np.float32), np.ones(width, np.float64)]
    client = redis.Redis.from_url(redis_url)
    for key, row in zip(keys, forged, strict=True):
        client.set(key, encode_row(row))
    served, stats = await _embed_with(spec, texts)
    assert_same(served, computed)
    assert hits(stats, "redis") == 0 and stats["infinity_cloud_cache_rejected_total"] == 6, stats
    client.flushdb()


async def test_with_a_shared_secret_only_rows_tagged_by_it_are_served(
    tiny_embedder: Path, redis_url: str, tmp_path: Path
) -> None:
    """Replicas that share --cache-secret-file read each other's rows; a row written without
    the secret (by hand, or a replica without it), or a tagged row moved to another key, is
    recomputed."""
    import redis

    from infinity_cloud.cache.codec import encode_row

    redis.Redis.from_url(redis_url).flushdb()
    secret = tmp_path / "cache-secret"
    secret.write_text("one secret for every replica\n", encoding="utf-8")
    model = ModelSpec(model_id=str(tiny_embedder), served_model_name="m", backend="torch")
    sealed = spec_of(model, cache_url=redis_url, cache_secret_file=secret, cache_timeout_ms=2000)
    texts = ["a sealed chunk", "another sealed chunk", "a third"]
    computed, _ = await _embed_with(sealed, texts)
    shared, stats = await _embed_with(sealed, texts)
    assert shared == computed and hits(stats, "redis") == 3, stats
    client = redis.Redis.from_url(redis_url)
    keys = _cached_keys(redis_url)
    client.set(keys[0], encode_row(np.asarray(computed[0], np.float32) * -1))  # well formed, untagged
    client.set(keys[1], client.get(keys[2]))  # tagged, but another key's row
    served, stats = await _embed_with(sealed, texts)
    assert_same(served, computed)
    assert hits(stats, "redis") == 1 and stats["infinity_cloud_cache_rejected_total"] == 2, stats
    _, unsealed = await _embed_with(spec_of(model, cache_url=redis_url, cache_timeout_ms=2000), texts)
    assert hits(unsealed, "redis") == 0 and unsealed["infinity_cloud_cache_rejected_total"] == 3, unsealed
    client.flushdb()


async def test_the_redis_password_is_never_logged_or_shown(
    tiny_embedder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from typer.testing import CliRunner

    from infinity_cloud.cli import app

    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"  # nothing listens there
    spec = spec_of(ModelSpec(model_id=str(tiny_embedder), served_model_name="m"), cache_url=url)
    async with serve_in_process(spec) as client:
        assert (await client.post("/v1/embeddings", json={"model": "m", "input": ["x"]})).status_code == 200
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "shared result cache at redis://:***@127.0.0.1" in logged and "hunter2" not in logged
    shown = CliRunner().invoke(app, ["config", "show", "--cache-url", url, "--admin-key", "adm1n"])
    assert shown.exit_code == 0 and "hunter2" not in shown.output and "adm1n" not in shown.output
    # redis-py also takes it as a query parameter
    from infinity_cloud.cache.redis_store import redacted

    assert redacted("redis://u@host:6379/0?Password=hunter2&ssl_cert_reqs=none") == (
        "redis://u@host:6379/0?Password=***&ssl_cert_reqs=none")
    shown = CliRunner().invoke(app, ["config", "show", "--cache-url", "redis://host/0?password=hunter2"])
    assert shown.exit_code == 0 and "hunter2" not in shown.output, shown.output


def test_a_models_row_form_is_known_before_it_is_ready(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lookups in Redis need the form of the model's rows; a request that found the model
    ready before its form was registered (a busy machine, seen in CI) skipped Redis."""
    from infinity_cloud.engine import Engine

    engine = Engine(spec_of(ModelSpec(model_id=str(tiny_embedder), served_model_name="m", backend="torch"),
                            cache_mb=8))
    states: list[str] = []
    expect = engine.cache.expect
    monkeypatch.setattr(engine.cache, "expect",
                        lambda *a: (states.append(engine.models["m"].state), expect(*a)))
    try:
        engine.load()
    finally:
        engine.close()
    assert states == ["loading"]
