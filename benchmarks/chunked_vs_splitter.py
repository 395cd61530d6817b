"""Long documents embedded two ways against one server, interleaved in one run:

- **ours**: each document posted whole to `POST /v1/embeddings/chunked` (the server cuts it
  by the model's own tokenizer, `chunk_tokens` a chunk);
- **splitter**: what a RAG indexer does today: langchain-text-splitters'
  `RecursiveCharacterTextSplitter.from_huggingface_tokenizer` (the model's tokenizer, the same
  `chunk_tokens`) cuts each document on the client, and the chunks are posted to
  `/v1/embeddings` in batches.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/chunked_vs_splitter.py \\
        --model-id sentence-transformers/all-MiniLM-L6-v2 --documents 100 --words 5000

Reported: documents/s of each and their ratio (median of the rounds, ABBA order), the chunks
each made, and how many of the splitter's chunks the server had to truncate (their tokens
with the model's special tokens over its window: the splitter counts without them). The
documents are the corpus's passages joined to `--words` words each (benchmarks/corpus.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from corpus import add_corpus_argument, describe, load_texts
from http_load import print_json

from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.core.hardware import cpu_model, kernel_flags
from infinity_cloud.models.model_source import packaged_default_model
from infinity_cloud.sizing.local_server import local_server


def documents(corpus: Path | None, count: int, words: int) -> list[str]:
    passages = load_texts(corpus, "passage")
    out, at = [], 0
    for _ in range(count):
        taken: list[str] = []
        while sum(len(p.split()) for p in taken) < words:
            taken.append(passages[at % len(passages)])
            at += 1
        out.append(" ".join(" ".join(taken).split()[:words]))
    return out


SHED: dict[str, int] = {"/v1/embeddings/chunked": 0, "/v1/embeddings": 0}  # 429/503s waited out


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    """`body` posted until it is answered: a 429 or 503 (shed for load, as a contended machine
    does) is waited out for its Retry-After and sent again, as a client does."""
    while True:
        response = await client.post(path, json=body)
        if response.status_code in (429, 503):
            SHED[path] += 1
            await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            continue
        response.raise_for_status()
        return response


async def ours(client: httpx.AsyncClient, docs: list[str], chunk_tokens: int, concurrency: int) -> list[int]:
    """Every document posted whole, `concurrency` at a time; each chunk's tokens as answered."""
    gate, sizes = asyncio.Semaphore(concurrency), []

    async def one(doc: str) -> None:
        async with gate:
            body = {"input": doc, "chunk_tokens": chunk_tokens}
            response = await post(client, "/v1/embeddings/chunked", body)
            sizes.extend(c["tokens"] for c in response.json()["data"][0]["chunks"])

    await asyncio.gather(*(one(doc) for doc in docs))
    return sizes


async def splitter(
    client: httpx.AsyncClient, docs: list[str], split: Any, batch: int, concurrency: int
) -> int:
    """Each document cut on the client, its chunks posted in batches, `concurrency` at a time."""
    chunks = [c for doc in docs for c in split(doc)]
    gate = asyncio.Semaphore(concurrency)

    async def one(texts: list[str]) -> None:
        async with gate:
            await post(client, "/v1/embeddings", {"input": texts})

    await asyncio.gather(*(one(chunks[i : i + batch]) for i in range(0, len(chunks), batch)))
    return len(chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_corpus_argument(parser)
    parser.add_argument("--model-id", default=None, help="default: the packaged all-MiniLM-L6-v2")
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--words", type=int, default=5000)
    parser.add_argument("--chunk-tokens", type=int, default=254, help="MiniLM: its 256 less [CLS] and [SEP]")
    parser.add_argument("--batch", type=int, default=32, help="the splitter client's chunks a request")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4, help="ABBA: a multiple of 2")
    parser.add_argument("--port", type=int, default=7331)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from langchain_text_splitters import RecursiveCharacterTextSplitter
    from transformers import AutoTokenizer

    model = args.model_id or str(packaged_default_model())
    tokenizer = AutoTokenizer.from_pretrained(model)
    split = RecursiveCharacterTextSplitter.from_huggingface_tokenizer(
        tokenizer, chunk_size=args.chunk_tokens, chunk_overlap=0
    ).split_text
    docs = documents(args.corpus, args.documents, args.words)
    window = tokenizer.model_max_length if tokenizer.model_max_length < 10**6 else 512
    specials = tokenizer.num_special_tokens_to_add()
    pieces = [c for doc in docs for c in split(doc)]
    truncated = sum(len(ids) > window for ids in tokenizer(pieces, add_special_tokens=True)["input_ids"])

    spec = DeploymentSpec(models=(ModelSpec(model_id=model),), server={"port": args.port})
    timings: dict[str, list[float]] = {"ours": [], "splitter": []}
    chunks: dict[str, int] = {}
    ours_sizes: list[int] = []
    with local_server(spec) as url:

        async def run() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                await ours(client, docs[:2], args.chunk_tokens, 1)  # warm both paths
                await splitter(client, docs[:2], split, args.batch, 1)
                order = ["ours", "splitter", "splitter", "ours"] * (args.rounds // 2)
                for name in order[: 2 * args.rounds]:
                    started = time.perf_counter()
                    if name == "ours":
                        ours_sizes[:] = await ours(client, docs, args.chunk_tokens, args.concurrency)
                        chunks[name] = len(ours_sizes)
                    else:
                        chunks[name] = await splitter(client, docs, split, args.batch, args.concurrency)
                    timings[name].append(time.perf_counter() - started)

        asyncio.run(run())

    rate = {name: args.documents / statistics.median(seconds) for name, seconds in timings.items()}
    print_json({
        "cpu": cpu_model(), "kernel_flags": sorted(kernel_flags()), "model": model,
        "corpus": describe(args.corpus),
        "documents": args.documents, "words_each": args.words, "chunk_tokens": args.chunk_tokens,
        "documents_per_s": {k: round(v, 2) for k, v in rate.items()},
        "ratio_ours_to_splitter": round(rate["ours"] / rate["splitter"], 3),
        "chunks": chunks,
        "truncated": {"ours": sum(size + specials > window for size in ours_sizes), "splitter": truncated},
        "seconds": timings,
        "shed_and_retried": SHED, "load_average": os.getloadavg(),
    }, args.out)


if __name__ == "__main__":
    main()
