"""Closed-loop load on a server's OpenAI-compatible `/embeddings`: each client posts its next
request as soon as the last is answered. The one load loop of `infinity-cloud bench` and of the
project's benchmarks (benchmarks/http_load.py, benchmarks/vs_infinity.py)."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

# Fewer answered requests than this give no percentiles: p99 of 19 is the slowest one, and
# p50 = p95 = p99 of one request says nothing of the spread.
MIN_REQUESTS = 20
# How often a run in progress is reported to `load`'s `tick`.
TICK_S = 1.0


@dataclass(frozen=True)
class Batch:
    """One request's inputs; `tokens` None means "take the server's usage.prompt_tokens"."""

    texts: list[str]
    tokens: int | None = None


def make_batches(
    texts: Sequence[str], per_request: int, count: Callable[[list[str]], list[int]] | None = None
) -> list[Batch]:
    """Consecutive full batches of `per_request` texts, with their token counts if `count`."""
    chunks = [list(texts[i : i + per_request]) for i in range(0, len(texts) - per_request + 1, per_request)]
    if not chunks:
        raise ValueError(f"need at least {per_request} texts for requests of {per_request}, got {len(texts)}")
    if count is None:
        return [Batch(chunk) for chunk in chunks]
    return [Batch(chunk, sum(count(chunk))) for chunk in chunks]


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0..1) of sorted values: the least value that `q` of them
    are at or below (of 20, p95 is the 19th; `int(q * n)` took the 20th, the slowest)."""
    rank = math.ceil(q * len(ordered) - 1e-9)  # the tolerance: 0.95 * 20 is not exactly 19 in floats
    return ordered[min(len(ordered), max(1, rank)) - 1]


@dataclass
class LoadRun:
    """What one closed-loop run (or several pooled) observed."""

    elapsed_s: float = 0.0
    texts: int = 0
    tokens: int = 0
    latencies_s: list[float] = field(default_factory=list)
    shed: int = 0  # answered 429 (overloaded): the client waited Retry-After and went on
    # Stopped by its time limit before MIN_REQUESTS were answered (`load`'s `limit_s`).
    cut_short: bool = False

    def __add__(self, other: LoadRun) -> LoadRun:
        return LoadRun(
            self.elapsed_s + other.elapsed_s,
            self.texts + other.texts,
            self.tokens + other.tokens,
            self.latencies_s + other.latencies_s,
            self.shed + other.shed,
            self.cut_short or other.cut_short,
        )

    def summary(self) -> dict[str, float | None]:
        """Rates and latency percentiles; the percentiles None from fewer than MIN_REQUESTS."""
        latencies = sorted(self.latencies_s)
        if not latencies:
            return {"requests": 0, "shed_429": self.shed, "elapsed_s": round(self.elapsed_s, 2)}
        enough = len(latencies) >= MIN_REQUESTS
        return {
            "texts_per_s": round(self.texts / self.elapsed_s, 1),
            "tokens_per_s": round(self.tokens / self.elapsed_s),
            "p50_ms": round(1000 * statistics.median(latencies), 1) if enough else None,
            "p95_ms": round(1000 * percentile(latencies, 0.95), 1) if enough else None,
            "p99_ms": round(1000 * percentile(latencies, 0.99), 1) if enough else None,
            "requests": len(latencies),
            "shed_429": self.shed,
            "elapsed_s": round(self.elapsed_s, 2),
        }


async def load(
    url: str, model: str | None, batches: Sequence[Batch], concurrency: int, seconds: float,
    headers: dict[str, str] | None = None, *, min_requests: int = 0, limit_s: float | None = None,
    tick: Callable[[LoadRun], None] | None = None,
    request: Callable[[Batch], tuple[str, dict[str, Any]]] | None = None,
) -> LoadRun:
    """`concurrency` clients post `batches` (cycled, same order every run) back to back for
    `seconds`, and on until `min_requests` are answered, but never past `limit_s` (then the run
    is `cut_short`). `tick` is given the run so far (its `elapsed_s` so far) every TICK_S.
    `request`: the route and body a batch is posted as (default: `/embeddings` of its texts).

    Requests in flight at the deadline are waited for and counted, so the server ends idle. A
    429 (a server that sheds load) is counted, its Retry-After waited, and the client goes on.
    """
    cycle = itertools.cycle(batches)
    run = LoadRun()
    began = deadline = limit = 0.0  # set when the clients start
    sent = 0  # requests posted and not shed: answered or in flight

    def more() -> bool:
        now = time.perf_counter()
        if now < deadline or (sent < min_requests and now < limit):
            return True
        run.cut_short = run.cut_short or sent < min_requests
        return False

    async def ticking() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            run.elapsed_s = time.perf_counter() - began
            tick(run)  # type: ignore[misc]

    async with httpx.AsyncClient(
        base_url=url, timeout=300, headers=headers, limits=httpx.Limits(max_connections=concurrency)
    ) as c:

        async def client() -> None:
            nonlocal sent
            first = True
            while first or more():  # each client sends one request at least, however short the run
                first = False
                batch = next(cycle)
                started = time.perf_counter()
                sent += 1
                route, body = (request(batch) if request
                               else ("/embeddings", {"input": batch.texts, "model": model}))
                response = await c.post(route, json=body)
                if response.status_code == 429:
                    sent -= 1
                    run.shed += 1
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))
                    continue
                response.raise_for_status()
                run.latencies_s.append(time.perf_counter() - started)
                run.texts += len(batch.texts)
                run.tokens += (
                    batch.tokens if batch.tokens is not None else response.json()["usage"]["prompt_tokens"]
                )

        began = time.perf_counter()  # the client is made: its set-up is not the server's time
        deadline = began + seconds
        limit = began + max(seconds, limit_s) if limit_s is not None else float("inf")
        ticker = asyncio.ensure_future(ticking()) if tick is not None else None
        try:
            await asyncio.gather(*(client() for _ in range(concurrency)))
        finally:
            if ticker is not None:
                ticker.cancel()
        run.elapsed_s = time.perf_counter() - began
    return run
