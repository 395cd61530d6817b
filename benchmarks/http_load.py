"""Closed-loop load on a running server's /embeddings: texts/s, tokens/s, p50/p99 latency.

    infinity-cloud serve --port 7997 &
    python benchmarks/http_load.py --url http://127.0.0.1:7997 --corpus ../shared/data/corpus.jsonl \\
        --concurrency 32 --per-request 32

Each of --concurrency clients sends requests of --per-request passages back to back for
--seconds; `usage.prompt_tokens` gives real tokens. Works against Infinity too (same API).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from pathlib import Path

import httpx


def load_texts(path: Path, kind: str) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["text"] for r in rows if r.get("kind") == kind]


async def load(
    url: str, model: str | None, texts: list[str], concurrency: int, per_request: int, seconds: float
) -> dict[str, float]:
    batches = itertools.cycle(
        [texts[i : i + per_request] for i in range(0, len(texts) - per_request, per_request)]
    )
    latencies: list[float] = []
    done_texts = done_tokens = 0
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(
        base_url=url, timeout=120, limits=httpx.Limits(max_connections=concurrency)
    ) as c:

        async def client() -> None:
            nonlocal done_texts, done_tokens
            while time.perf_counter() < deadline:
                batch = next(batches)
                started = time.perf_counter()
                response = await c.post("/embeddings", json={"input": batch, "model": model})
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)
                done_texts += len(batch)
                done_tokens += response.json()["usage"]["prompt_tokens"]

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "texts_per_s": round(done_texts / elapsed, 1),
        "tokens_per_s": round(done_tokens / elapsed),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
        "requests": len(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:7997")
    parser.add_argument("--model", default=None)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--kind", default="passage", choices=["passage", "query"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    texts = load_texts(args.corpus, args.kind)
    result = asyncio.run(load(args.url, args.model, texts, args.concurrency, args.per_request, args.seconds))
    print(json.dumps({"concurrency": args.concurrency, "per_request": args.per_request, **result}))


if __name__ == "__main__":
    main()
