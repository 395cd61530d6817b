"""Memory admission over HTTP (issue 50, N1): every route that does work is admitted by the
memory budget (tokenize and decode included), and a server whose memory will not admit even a
minimal request for longer than its deadline says so on /health, for an orchestrator to act.
The budget's parts: test_memory.py; a download's bytes counted once: test_images.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import fake, serve_in_process, spec_of

from infinity_cloud.admission.memory import MB, MemoryBudget, resident_bytes
from infinity_cloud.engine import Engine

ROOM = 64 * MB  # what the tests leave requests of the budget, beside the served model


def _room_for_requests(engine: Engine, room: int) -> None:
    """Set the budget so that an idle server has `room` bytes for requests."""
    memory = engine.memory
    memory.limit_bytes = (memory.limit_bytes or 0) + room - (memory.room_for_requests() or 0)


async def test_tokenize_and_decode_are_admitted_by_the_memory_budget(tiny_embedder: Path) -> None:
    """/tokenize answers a dict per token: 80 texts of 200,000 characters took 2.7 GB each under a
    1,400 MB budget, which it ignored. Now one past what an idle server holds is a 413 naming the
    budget before any work, one that fits is answered, and what it held is released."""
    engine = Engine(spec_of(fake(tiny_embedder, "emb")))
    async with serve_in_process(engine) as client:
        _room_for_requests(engine, ROOM)
        text = "tokens listed one by one, each a dict in the answer " * 3800  # 197,600 characters
        big = await client.post("/tokenize", json={"inputs": [text] * 4})
        assert big.status_code == 413, big.text
        assert "memory budget" in big.text and "free when idle" in big.text, big.text
        small = await client.post("/tokenize", json={"inputs": [text[:2000]]})
        assert small.status_code == 200 and len(small.json()[0]) > 100, small.text
        ids = small.json()[0]
        decoded = await client.post("/decode", json={"ids": [t["id"] for t in ids]})
        assert decoded.status_code == 200, decoded.text
        many = await client.post("/decode", json={"ids": [[t["id"] for t in ids]] * 2000})  # 1.2 M ids
        assert many.status_code == 413 and "memory budget" in many.text, many.text
        assert engine.memory.held_bytes == 0


async def test_health_is_not_ready_while_memory_admits_no_minimal_request(tiny_embedder: Path) -> None:
    """A process that holds more than its budget with nothing in progress (a leak trimming
    cannot return) answers requests 503 with Retry-After (a wait for others would not help), and
    /health turns 503 once that has lasted past the deadline; back to 200 when memory is."""
    leak = {"bytes": 0}
    engine = Engine(spec_of(fake(tiny_embedder, "emb", deadline_s=0.5)))
    async with serve_in_process(engine) as client:
        # The process as the budget sees it: its resident memory, and a leak the test sets.
        engine.memory = MemoryBudget(1 << 40, resident=lambda: resident_bytes() + leak["bytes"])
        _room_for_requests(engine, ROOM)
        one = {"model": "emb", "input": ["one short text"]}
        assert (await client.post("/v1/embeddings", json=one)).status_code == 200
        assert (await client.get("/health")).status_code == 200
        leak["bytes"] = 2 * ROOM
        refused = await client.post("/v1/embeddings", json=one)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["type"] == "memory_exhausted"
        assert int(refused.headers["retry-after"]) >= 1
        for _ in range(1200):  # a minute at most: /health turns 503 after the 0.5 s deadline
            health = await client.get("/health")
            if health.status_code == 503:
                break
            await asyncio.sleep(0.05)
        assert health.status_code == 503, health.text
        assert "memory budget" in health.json()["error"]["message"]
        assert int(health.headers["retry-after"]) >= 1
        leak["bytes"] = 0
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/v1/embeddings", json=one)).status_code == 200
