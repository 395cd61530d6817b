"""Data parallel (issue 56), tested where no GPU is: N CPU "devices", each a replica of the
model with its own backend, queue and batch worker (`models.replicas`). What a multi-GPU
instance does with `--device cuda` is the same code with `cuda:i` devices; the GPU script
(`benchmarks/gpu_check.py`) runs it on the GPUs it finds.

Timeouts here only keep a regression from hanging the suite; no test asserts on time.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import cosines, fake, serve_in_process, spec_of
from test_concurrency import metric, random_text

from infinity_cloud.admission.memory import MB, MemoryBudget
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.hardware import usable_cores
from infinity_cloud.engine import Engine
from infinity_cloud.engine.asks import EmbedAsk


def two_cpus(path: Path, **options: object) -> ModelSpec:
    return ModelSpec(model_id=str(path), served_model_name="tiny", device="cpu", device_ids=(0, 1), **options)


async def embed(client: httpx.AsyncClient, texts: list[str]) -> np.ndarray:
    response = await client.post("/v1/embeddings", json={"model": "tiny", "input": texts})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(texts)))
    return np.asarray([d["embedding"] for d in data])


async def test_two_cpu_replicas_share_requests_and_answer_each_in_order(tiny_embedder: Path) -> None:
    """The real backend on two CPU replicas: every request's rows are its own, in its order,
    as one replica answers them; both replicas took batches; /models and /metrics say each
    device's own."""
    rng = random.Random(56)
    pool = sorted({random_text(rng) for _ in range(200)})
    requests = [rng.sample(pool, rng.randint(1, 12)) for _ in range(80)]
    one = ModelSpec(model_id=str(tiny_embedder), served_model_name="tiny", device="cpu")
    async with serve_in_process(spec_of(one)) as client:
        reference = await embed(client, pool)
    index = {text: i for i, text in enumerate(pool)}

    async with serve_in_process(spec_of(two_cpus(tiny_embedder))) as client:
        model = (await client.get("/models")).json()["data"][0]
        assert set(model["stats"]["devices"]) == {"cpu:0", "cpu:1"}
        answers = await asyncio.wait_for(asyncio.gather(*(embed(client, texts) for texts in requests)), 120)
        for texts, got in zip(requests, answers, strict=True):
            assert cosines(got, reference[[index[t] for t in texts]]).min() >= 0.9999
        stats = (await client.get("/models")).json()["data"][0]["stats"]
        devices = stats["devices"]
        assert all(devices[d]["batches_done"] > 0 and devices[d]["alive"] for d in devices), devices
        assert stats["batches_done"] == sum(d["batches_done"] for d in devices.values())
        text = (await client.get("/metrics")).text
        for device in ("cpu:0", "cpu:1"):
            assert metric(text, "infinity_cloud_device_up", model="tiny", device=device) == 1
            assert metric(text, "infinity_cloud_batch_size_count", model="tiny", device=device) > 0
        assert 'infinity_cloud_device_queued_tokens{device="cpu:1",model="tiny"}' in text


async def test_cpu_replicas_split_the_cores_and_run_the_chosen_backend(tiny_embedder: Path) -> None:
    """Each CPU replica runs with its share of the cores (two replicas with every core each
    would fight over them), in the backend and precision the first chose."""
    async with Engine(spec_of(two_cpus(tiny_embedder))) as engine:
        tower = engine.models["tiny"].loaded.towers["text"]
        assert [r.device for r in tower.replicas] == ["cpu:0", "cpu:1"]
        backends = [r.backend for r in tower.replicas]
        assert len({id(b) for b in backends}) == 2
        assert {(b.name, b.dtype) for b in backends} == {(backends[0].name, backends[0].dtype)}
        share = max(1, usable_cores() // 2)
        assert [b.spec.backend_options.get("threads") for b in backends] == [share, share]


async def test_a_call_goes_to_the_replica_with_the_least_work(tiny_embedder: Path) -> None:
    """Work admitted on one replica (queued tokens, coming or waiting) sends the next call to
    the other; with equal work, the first."""
    async with Engine(spec_of(fake(tiny_embedder, "tiny", device="cpu", device_ids=(0, 1, 2)))) as engine:
        served = engine.models["tiny"]
        first, second, third = served.loaded.towers["text"].replicas
        assert served.replica() is first
        first.queue.admit(500)
        assert served.replica() is second
        second.queue.admit(100)
        assert served.replica() is third
        third.queue.admit(300)
        assert served.replica() is second
        for replica, work in ((first, 500), (second, 100), (third, 300)):
            replica.queue.settle(work)
        assert served.replica() is first
        result = await engine.embeddings(EmbedAsk(["after the settles"]))
        assert result.embeddings.shape[0] == 1


async def test_the_memory_budget_counts_every_replica(tiny_embedder: Path) -> None:
    """Every replica runs its batches at once, so their working sets share the room: two
    replicas' batches are cut to fit it together, where one replica's are cut to fit alone.
    Resident memory is pinned so the room is exact: (100 - 60) / 2 = 20 MB for batches."""
    single = Engine(spec_of(fake(tiny_embedder, "tiny", device="cpu")))
    double = Engine(spec_of(fake(tiny_embedder, "tiny", device="cpu", device_ids=(0, 1))))
    for engine in (single, double):
        engine.memory = MemoryBudget(100 * MB, resident=lambda: 60 * MB, trim=lambda: None)
    async with single, double:
        for engine in (single, double):
            assert 15 * MB < engine.models["tiny"].working_set_bytes <= 20 * MB
        one = single.models["tiny"].loaded.towers["text"].replicas[0].queue.batch_tokens
        two = [r.queue.batch_tokens for r in double.models["tiny"].loaded.towers["text"].replicas]
        assert two[0] == two[1] and abs(2 * two[0] - one) <= 2, (one, two)


async def test_a_dead_replica_takes_only_its_own_requests(tiny_embedder: Path, rare_id: int) -> None:
    """The fake backend's worker dies on `rare_id` (SystemExit in its forward thread, as a lost
    device kills it): the request on it is answered 503, the model goes on serving on the
    other replica (healthy, degraded in /models, its device down in /metrics), and no later
    request is routed to the dead one."""
    spec = spec_of(fake(tiny_embedder, "tiny", device="cpu", device_ids=(0, 1),
                        backend_options={"exit_token_id": rare_id}, token_ids="model"))
    async with serve_in_process(spec) as client:
        killer = await asyncio.wait_for(client.post("/embeddings", json={"input": [rare_id]}), 30)
        assert killer.status_code == 503 and "died" in killer.text, killer.text
        answers = await asyncio.wait_for(asyncio.gather(
            *(client.post("/embeddings", json={"input": ["still serving", str(i)]}) for i in range(30))), 60)
        assert [a.status_code for a in answers] == [200] * 30, [a.text for a in answers]
        assert (await client.get("/health")).status_code == 200
        model = (await client.get("/models")).json()["data"][0]
        devices = model["stats"]["devices"]
        dead = [d for d, own in devices.items() if not own["alive"]]
        assert len(dead) == 1 and "SystemExit" in devices[dead[0]]["error"]
        assert "died" in model["degraded"] and "error" not in model
        (live,) = set(devices) - set(dead)
        assert devices[dead[0]]["batches_done"] == 0 and devices[live]["batches_done"] > 0
        text = (await client.get("/metrics")).text
        assert metric(text, "infinity_cloud_device_up", model="tiny", device=dead[0]) == 0
        assert metric(text, "infinity_cloud_device_up", model="tiny", device=live) == 1
        # The last one dies too: then the model is not serving, and says so.
        second = await asyncio.wait_for(client.post("/embeddings", json={"input": [rare_id]}), 30)
        assert second.status_code == 503
        assert (await client.get("/health")).status_code == 503
        after = await client.post("/embeddings", json={"input": ["anyone?"]})
        assert after.status_code == 503 and "not serving" in after.text


@pytest.mark.parametrize(("device", "ids", "says"), [
    ("cuda:1", "0,1", "names one device"),
    ("neuron", "0", "names one device"),
    ("cpu", "0,0", "distinct"),
    ("cuda", "-1", "distinct"),
])
def test_device_ids_that_cannot_mean_replicas_are_refused(device: str, ids: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ModelSpec(device=device, device_ids=ids)


def test_device_ids_read_from_a_flag_value() -> None:
    assert ModelSpec(device="cuda", device_ids="0, 2,3").device_ids == (0, 2, 3)


def test_a_bulk_job_on_two_replicas_writes_what_one_writes(tiny_embedder: Path, tmp_path: Path) -> None:
    """`embed --device cpu --device-ids 0,1` (each replica fed its shards: `bulk.local_runner`
    keeps twice the shards in flight): every row lands once, in its place, with the vector one
    replica gives it."""
    from test_bulk_embed import corpus, embed, read, summary_of, write_jsonl

    source = write_jsonl(tmp_path / "corpus.jsonl", corpus(300, seed=56))
    tables = {}
    for name, devices in (("one", ()), ("two", ("--device-ids", "0,1"))):
        out = tmp_path / name
        result = embed(str(source), "--out", str(out), "--model-id", str(tiny_embedder), "--device", "cpu",
                       "--shard-rows", "25", *devices)
        assert result.exit_code == 0, result.output
        assert summary_of(result)["rows"] == 300
        tables[name] = read(out)
    ids = [f"doc-{i}" for i in range(300)]
    assert tables["two"]["id"].to_pylist() == tables["one"]["id"].to_pylist() == ids
    got, want = (np.array(tables[n]["embedding"].to_pylist()) for n in ("two", "one"))
    assert cosines(got, want).min() >= 0.9999
    assert len(list((tmp_path / "two").glob("part-*.parquet"))) == 12  # a part a shard, each once
