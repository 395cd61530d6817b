"""Closed-loop load on a running server's /embeddings: texts/s, tokens/s, p50/p99 latency.

    infinity-cloud serve --port 7997 &
    python benchmarks/http_load.py --url http://127.0.0.1:7997 --concurrency 32 --per-request 32 \\
        --tokenizer /path/to/model

Each of --concurrency clients sends requests of --per-request passages back to back for
--seconds (texts: benchmarks/corpus.py, or --corpus). Tokens are real tokens counted here
with the model's own `tokenizer.json` (--tokenizer, the model folder), truncated to the
model's maximum length; without it the server's `usage.prompt_tokens` is trusted, which
Infinity fills with *characters* by default.
Works against Infinity too (same API). The loop is infinity_cloud.sizing.load's, which
`infinity-cloud bench` and benchmarks/vs_infinity.py drive too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from corpus import add_corpus_argument, load_texts

from infinity_cloud.families import read_model_info
from infinity_cloud.sizing.load import Batch, LoadRun, load, make_batches

__all__ = [
    "Batch", "LoadRun", "TokenCounter", "cosine_rows", "load", "make_batches", "print_markdown",
    "reference_embeddings",
]


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


def print_markdown(lines: Sequence[str], path: Path | None) -> None:
    """A benchmark's table: printed, and written to `path` (its --markdown) when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path is not None:
        path.write_text(text)


def print_json(result: object, path: Path | None) -> None:
    """A benchmark's result as JSON: printed, and written to `path` (its --out) when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if path is not None:
        path.write_text(text + "\n", encoding="utf-8")


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
