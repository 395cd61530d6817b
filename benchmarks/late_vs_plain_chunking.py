"""Late chunking's cost against plain chunking, in process, one engine, interleaved rounds.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/late_vs_plain_chunking.py \\
        --corpus /work/shared/data/corpus.jsonl --documents 20 --words 2000 --chunk-tokens 128 \\
        --overlap-tokens 16 --rounds 2 --out benchmarks/results/avx2-epyc-minilm-late-vs-plain-chunking.json

The same documents (the corpus's passages joined to `--words` words each, as
benchmarks/chunked_vs_splitter.py makes them), the same `chunk_tokens` and `overlap_tokens`, go
through `Engine.chunked_embeddings(ChunkedEmbedAsk(...))` with `late=False` (each chunk embedded
on its own) and `late=True` (each document read once, in windows of the model's room with
overlap, each chunk pooled from its token span), `--concurrency` documents at a time, in ABBA
order over `--rounds` rounds. In process, so neither side pays HTTP; both sides' first call
(late chunking's token-states tower is built on it) is made before the clock starts.

Reported per side: seconds per document (median of the rounds), tokens computed (the engine's
`prompt_tokens`, the usage the routes answer), chunks, and the ratio late/plain of seconds per
document; with the CPU's name, its kernel flags and the load average at each round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

from chunked_vs_splitter import documents
from corpus import add_corpus_argument, describe
from http_load import print_json

from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.core.hardware import cpu_model, kernel_flags
from infinity_cloud.engine.asks import ChunkedEmbedAsk
from infinity_cloud.engine.front_door import Engine
from infinity_cloud.models.model_source import packaged_default_model

SIDES = {"plain": False, "late": True}


async def one_pass(engine: Engine, docs: list[str], late: bool, args: argparse.Namespace) -> tuple[int, int]:
    """Every document once, `args.concurrency` at a time: (tokens computed, chunks)."""
    gate = asyncio.Semaphore(args.concurrency)

    async def one(doc: str) -> tuple[int, int]:
        async with gate:
            ask = ChunkedEmbedAsk([doc], chunk_tokens=args.chunk_tokens, overlap_tokens=args.overlap_tokens,
                                  late=late)
            result = await engine.chunked_embeddings(ask)
            return result.prompt_tokens, len(result.spans[0])

    done = await asyncio.gather(*(one(doc) for doc in docs))
    return sum(t for t, _ in done), sum(c for _, c in done)


async def measure(args: argparse.Namespace, model: str, docs: list[str]) -> dict:
    # Every document queued, none shed: the sides are timed on their work, not on the admission deadline.
    spec = DeploymentSpec(models=(ModelSpec(model_id=model, deadline_s=86400),))
    seconds: dict[str, list[float]] = {name: [] for name in SIDES}
    loadavg: dict[str, list[float]] = {name: [] for name in SIDES}
    tokens: dict[str, int] = {}
    chunks: dict[str, int] = {}
    async with Engine(spec) as engine:
        for late in SIDES.values():  # warm both paths; the late tower is built here
            await one_pass(engine, docs[:2], late, args)
        # Which backend ran each side's batches (the late tower is built on the first late call).
        towers = {name: t for m in engine.models.values()
                  for name, t in {**m.loaded.towers, **m.loaded.lazy}.items()}
        backend = {name: f"{t.backend.name} {t.backend.dtype}" for name, t in towers.items()}
        order = ["plain", "late", "late", "plain"] * (args.rounds // 2)
        for round_no, name in enumerate(order[: 2 * args.rounds]):
            loadavg[name].append(round(os.getloadavg()[0], 2))
            started = time.perf_counter()
            tokens[name], chunks[name] = await one_pass(engine, docs, SIDES[name], args)
            seconds[name].append(round(time.perf_counter() - started, 3))
            print(f"run {round_no + 1}: {name:<5} {seconds[name][-1]:8.2f} s  {tokens[name]} tokens  "
                  f"load {loadavg[name][-1]}", flush=True)
    per_doc = {name: statistics.median(s) / len(docs) for name, s in seconds.items()}
    return {
        "backend": backend,
        "seconds_per_document": {k: round(v, 4) for k, v in per_doc.items()},
        "ratio_late_to_plain_seconds": round(per_doc["late"] / per_doc["plain"], 3),
        "tokens_computed": tokens,
        "ratio_late_to_plain_tokens": round(tokens["late"] / tokens["plain"], 3),
        "chunks": chunks,
        "seconds": seconds,
        "loadavg_1m_at_each_run": loadavg,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_corpus_argument(parser)
    parser.add_argument("--model-id", default=None, help="default: the packaged all-MiniLM-L6-v2")
    parser.add_argument("--documents", type=int, default=50)
    parser.add_argument("--words", type=int, default=2000)
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--overlap-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4, help="documents in flight")
    parser.add_argument("--rounds", type=int, default=4, help="ABBA: a multiple of 2")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = args.model_id or str(packaged_default_model())
    docs = documents(args.corpus, args.documents, args.words)
    loadavg_at_start = [round(x, 2) for x in os.getloadavg()]
    measured = asyncio.run(measure(args, model, docs))
    print_json({
        "cpu": cpu_model(), "kernel_flags": sorted(kernel_flags()), "nproc": len(os.sched_getaffinity(0)),
        "loadavg_at_start": loadavg_at_start, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "model": model, "corpus": describe(args.corpus), "documents": args.documents,
        "words_each": args.words, "chunk_tokens": args.chunk_tokens, "overlap_tokens": args.overlap_tokens,
        "concurrency": args.concurrency, "rounds": args.rounds, **measured,
    }, args.out)


if __name__ == "__main__":
    main()
