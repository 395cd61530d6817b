"""Closed-loop load on a running server's /embeddings: texts/s, tokens/s, p50/p99 latency.

    infinity-cloud serve --port 7997 &
    python benchmarks/http_load.py --url http://127.0.0.1:7997 --concurrency 32 --per-request 32 \\
        --tokenizer /path/to/model

Each of --concurrency clients sends requests of --per-request passages back to back for
--seconds (texts: benchmarks/corpus.py, or --corpus). Tokens are real tokens counted here
with the model's own `tokenizer.json` (--tokenizer, the model folder), truncated to the
model's maximum length; without it the server's `usage.prompt_tokens` is trusted, which
Infinity fills with *characters* by default.
Works against Infinity too (same API). benchmarks/vs_infinity.py drives the same loop.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from corpus import add_corpus_argument, load_texts

from infinity_cloud.families import read_model_info


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def reference_embeddings(model: str | Path, texts: Sequence[str], device: str = "cpu") -> np.ndarray:
    """sentence-transformers float32 on the same model folder: the fidelity reference."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model), device=device)
    return np.asarray(st.encode(list(texts), convert_to_numpy=True), dtype=np.float64)


class TokenCounter:
    """Real tokens per text with the model's own tokenizer.json, truncated to its max length."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        # The cap the server truncates to, read by the same code.
        self.max_length = read_model_info(model_dir).max_length
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)

    def __call__(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts))]


@dataclass(frozen=True)
class Batch:
    """One request's inputs; `tokens` None means "take the server's usage.prompt_tokens"."""

    texts: list[str]
    tokens: int | None = None


def print_markdown(lines: Sequence[str], path: Path | None) -> None:
    """A benchmark's table: printed, and written to `path` (its --markdown) when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path is not None:
        path.write_text(text)


def make_batches(texts: Sequence[str], per_request: int, counter: TokenCounter | None = None) -> list[Batch]:
    """Consecutive full batches of `per_request` texts, with their real token counts if `counter`."""
    chunks = [list(texts[i : i + per_request]) for i in range(0, len(texts) - per_request + 1, per_request)]
    if not chunks:
        raise ValueError(f"need at least {per_request} texts for requests of {per_request}, got {len(texts)}")
    if counter is None:
        return [Batch(chunk) for chunk in chunks]
    return [Batch(chunk, sum(counter(chunk))) for chunk in chunks]


@dataclass
class LoadRun:
    """What one closed-loop run (or several pooled) observed."""

    elapsed_s: float = 0.0
    texts: int = 0
    tokens: int = 0
    latencies_s: list[float] = field(default_factory=list)
    shed: int = 0  # answered 429 (overloaded): the client waited Retry-After and went on

    def __add__(self, other: LoadRun) -> LoadRun:
        return LoadRun(
            self.elapsed_s + other.elapsed_s,
            self.texts + other.texts,
            self.tokens + other.tokens,
            self.latencies_s + other.latencies_s,
            self.shed + other.shed,
        )

    def summary(self) -> dict[str, float]:
        latencies = sorted(self.latencies_s)
        return {
            "texts_per_s": round(self.texts / self.elapsed_s, 1),
            "tokens_per_s": round(self.tokens / self.elapsed_s),
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
            "requests": len(latencies),
            "shed_429": self.shed,
            "elapsed_s": round(self.elapsed_s, 2),
        }


async def load(
    url: str, model: str | None, batches: Sequence[Batch], concurrency: int, seconds: float
) -> LoadRun:
    """`concurrency` clients post `batches` (cycled, same order every run) back to back for `seconds`.

    Requests in flight at the deadline are waited for and counted, so the server ends idle.
    """
    cycle = itertools.cycle(batches)
    run = LoadRun()
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(
        base_url=url, timeout=300, limits=httpx.Limits(max_connections=concurrency)
    ) as c:

        async def client() -> None:
            while time.perf_counter() < deadline:
                batch = next(cycle)
                started = time.perf_counter()
                response = await c.post("/embeddings", json={"input": batch.texts, "model": model})
                if response.status_code == 429:  # a server that sheds load (ours, past --deadline-s)
                    run.shed += 1
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))
                    continue
                response.raise_for_status()
                run.latencies_s.append(time.perf_counter() - started)
                run.texts += len(batch.texts)
                run.tokens += (
                    batch.tokens if batch.tokens is not None else response.json()["usage"]["prompt_tokens"]
                )

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        run.elapsed_s = time.perf_counter() - started
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:7997")
    parser.add_argument("--model", default=None)
    add_corpus_argument(parser)
    parser.add_argument("--kind", default="passage", choices=["passage", "query"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--tokenizer", type=Path, default=None, help="model folder with tokenizer.json")
    args = parser.parse_args()
    counter = TokenCounter(args.tokenizer) if args.tokenizer else None
    batches = make_batches(load_texts(args.corpus, args.kind), args.per_request, counter)
    run = asyncio.run(load(args.url, args.model, batches, args.concurrency, args.seconds))
    print(json.dumps({"concurrency": args.concurrency, "per_request": args.per_request, **run.summary()}))


if __name__ == "__main__":
    main()
