"""A re-index with and without the result cache: a corpus embedded once, then again with 40%
of its chunks changed (what a RAG pipeline does at each re-index), timing the second pass.

    HF_HUB_OFFLINE=1 python benchmarks/reindex_cache.py --model-id <model folder> \\
        [--redis-url redis://127.0.0.1:6379/0] [--corpus corpus.jsonl] [--markdown out.md]

Modes, each in fresh engines: no cache; the in-process cache (the second pass in the same
engine as the first); Redis (the second pass in another engine with no memory cache of its
own, as a second replica would: every hit comes from Redis). Hits count the second pass's
inputs answered from the cache (a chunk repeated in the corpus is a hit in either pass).
Chunks are sent as an indexer sends them: requests of --batch passages, --concurrency at a
time. The ratio is the second pass's time without the cache over its time with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

from corpus import add_corpus_argument, load_texts

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.cache.result_cache import KEY_PREFIX
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.hardware import cpu_model
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.models.model_source import packaged_default_model


def changed_corpus(chunks: list[str], share: float, seed: int = 7) -> list[str]:
    """The corpus after an edit: `share` of the chunks changed."""
    rng = random.Random(seed)
    picked = set(rng.sample(range(len(chunks)), round(share * len(chunks))))
    # At the start: an edit past the model's input limit would not change what the model reads.
    return [f"Revised ({i}): {chunk}" if i in picked else chunk for i, chunk in enumerate(chunks)]


async def index(engine: Engine, chunks: list[str], batch: int, concurrency: int) -> float:
    """Embed every chunk in requests of `batch`, `concurrency` in flight; seconds taken."""
    requests = [chunks[i : i + batch] for i in range(0, len(chunks), batch)]
    gate = asyncio.Semaphore(concurrency)

    async def one(texts: list[str]) -> None:
        async with gate:
            await engine.embeddings(EmbedAsk(texts))

    started = time.perf_counter()
    await asyncio.gather(*(one(texts) for texts in requests))
    return time.perf_counter() - started


async def forget(engine: Engine) -> None:
    """Start from an empty cache: this model's rows dropped from memory and from Redis (only
    its own keys: a shared Redis may hold other things)."""
    if not engine.cache.enabled:
        return
    name = engine.model().cache_namespace("text")
    engine.cache.forget(name)
    if engine.cache.redis is not None:
        await engine.cache.redis.flushed()
        await engine.cache.redis.delete_namespace(KEY_PREFIX + name.encode() + b":")


def spec(model: str, **cache: object) -> DeploymentSpec:
    # No deadline: a whole corpus queued at once is a batch job, not shedding.
    return DeploymentSpec(models=(ModelSpec(model_id=model, deadline_s=None),), server=cache)


async def measure(args: argparse.Namespace) -> list[dict]:
    chunks = load_texts(args.corpus, "passage")[: args.chunks]
    edited = changed_corpus(chunks, args.changed)
    rows = []
    modes = [("none", {}, None), ("in-process", {"cache_mb": args.cache_mb}, None)]
    if args.redis_url:
        modes.append(("redis", {"cache_url": args.redis_url}, {"cache_url": args.redis_url}))
    for mode, first, second in modes:
        async with Engine(spec(args.model_id, **first)) as engine:
            await index(engine, chunks[:64], args.batch, args.concurrency)  # warm-up, not timed
            await forget(engine)
            first_s = await index(engine, chunks, args.batch, args.concurrency)
            if second is None:
                before = engine.cache.describe()
                second_s = await index(engine, edited, args.batch, args.concurrency)
                stats = engine.cache.describe()
            else:  # another replica: its own engine, only Redis shared
                await engine.cache.redis.flushed()
        if second is not None:
            async with Engine(spec(args.model_id, **second)) as replica:
                await index(replica, chunks[:64], args.batch, args.concurrency)
                before = replica.cache.describe()
                second_s = await index(replica, edited, args.batch, args.concurrency)
                stats = replica.cache.describe()
        hits = sum(stats["hits"].values()) - sum(before["hits"].values()) if mode != "none" else 0
        rows.append({"mode": mode, "first_s": round(first_s, 2), "second_s": round(second_s, 2),
                     "hits": hits, "chunks": len(chunks), "distinct": len(set(chunks)),
                     "unchanged": sum(a == b for a, b in zip(chunks, edited, strict=True))})
    base = rows[0]["second_s"]
    for row in rows:
        row["ratio"] = round(base / row["second_s"], 2)
    return rows


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Re-index of {rows[0]['chunks']} chunks ({rows[0]['distinct']} distinct; {rows[0]['unchanged']} "
        f"unchanged in the second pass), {args.label}, requests of {args.batch}, {args.concurrency} at a "
        f"time, on {cpu_model()} ({os.cpu_count()} cores)",
        "",
        "| cache | first pass s | second pass s | hits in the second | ratio (no cache / this) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['mode']} | {r['first_s']} | {r['second_s']} | {r['hits']} | {r['ratio']} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-id", default=None,
                        help="model folder or hub id (default: the packaged MiniLM)")
    parser.add_argument("--chunks", type=int, default=1300)
    parser.add_argument("--changed", type=float, default=0.4, help="share of the chunks changed")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--redis-url", default=None, help="a Redis to measure the shared cache with")
    parser.add_argument("--markdown", type=Path, default=None)
    add_corpus_argument(parser)
    args = parser.parse_args()
    args.label = args.model_id or "all-MiniLM-L6-v2 (the packaged copy)"
    args.model_id = args.model_id or str(packaged_default_model())
    rows = asyncio.run(measure(args))
    print(json.dumps(rows, indent=1))
    text = markdown(rows, args)
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
