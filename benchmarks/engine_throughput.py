"""In-process engine throughput: real (unpadded) tokens per second, no HTTP.

    python benchmarks/engine_throughput.py --dtype bfloat16

--spec takes a deployment spec as `infinity-cloud config show --format json` prints it (so a
server's exact settings are measured without HTTP) and then --model-id/--dtype/--backend are
ignored. Sends the corpus's passages (benchmarks/corpus.py, or --corpus) in requests of
--per-request texts from --concurrency tasks and reports texts/s and tokens/s; the HTTP
comparison against Infinity is benchmarks/vs_infinity.py.

--fixed-shape ROWSxTOKENS also times the served backend alone on batches of that shape, every
row that long (no padding, tokenizing, pooling, queue or HTTP), kept in flight as the batch
worker keeps them: the backend's own ceiling, which `roofline.py` compares with the GEMM bound
at the same shape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import deque
from pathlib import Path

import numpy as np
from corpus import add_corpus_argument, load_texts

from infinity_cloud import DeploymentSpec, Engine, ModelSpec
from infinity_cloud.engine.asks import EmbedAsk


async def run(engine: Engine, texts: list[str], per_request: int, concurrency: int) -> tuple[float, int]:
    chunks = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        while not queue.empty():
            result = await engine.embeddings(EmbedAsk(queue.get_nowait()))
            tokens += result.prompt_tokens

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - started, tokens


def fixed_shape(engine: Engine, rows: int, tokens: int, seconds: float = 4.0) -> dict:
    """Tokens/s of the served backend alone on `rows` x `tokens` batches without padding."""
    from infinity_cloud.numerics.inputs import ModelInputs

    model = next(iter(engine.models.values()))
    model.settle()
    backend = model.loaded.backend
    rng = np.random.default_rng(0)
    arrays = {
        "input_ids": rng.integers(1000, 2000, (rows, tokens), dtype=np.int64),
        "attention_mask": np.ones((rows, tokens), dtype=np.int64),
        "token_type_ids": np.zeros((rows, tokens), dtype=np.int64),
    }
    batch = ModelInputs(arrays)
    in_flight = int(getattr(backend, "in_flight", 1))
    backend.submit(batch)()  # first-shape set-up
    pending: deque = deque()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        pending.append(backend.submit(batch))
        if len(pending) >= in_flight:
            pending.popleft()()
            done += 1
    while pending:
        pending.popleft()()
        done += 1
    elapsed = time.perf_counter() - started
    return {"rows": rows, "tokens": tokens, "backend": backend.name, "dtype": backend.dtype,
            "tokens_per_s": round(done * rows * tokens / elapsed)}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_corpus_argument(parser)
    parser.add_argument("--model-id", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spec", type=Path, default=None, help="JSON deployment spec (one model)")
    parser.add_argument("--fixed-shape", default=None, metavar="ROWSxTOKENS",
                        help="also time the backend alone on batches of this shape, e.g. 32x160")
    args = parser.parse_args()
    texts = load_texts(args.corpus, "passage")[: args.texts]
    if args.spec:
        spec = DeploymentSpec.model_validate_json(args.spec.read_text())
        model = spec.models[0]
        args.model_id, args.dtype, args.backend = model.model_id, model.dtype, model.backend
    else:
        # The whole load is queued at once to measure the model's rate: nothing is shed.
        model = ModelSpec(model_id=args.model_id, dtype=args.dtype, backend=args.backend, deadline_s=None)
        spec = DeploymentSpec(models=(model,))
    async with Engine(spec) as engine:
        await run(engine, texts[:64], 8, 2)  # warm-up
        rates = []
        for _ in range(args.rounds):
            seconds, tokens = await run(engine, texts, args.per_request, args.concurrency)
            rates.append((len(texts) / seconds, tokens / seconds))
        ceiling = None
        if args.fixed_shape:
            rows, tokens = (int(n) for n in args.fixed_shape.lower().split("x"))
            ceiling = fixed_shape(engine, rows, tokens)
    texts_s = statistics.median(r[0] for r in rates)
    tokens_s = statistics.median(r[1] for r in rates)
    print(
        json.dumps(
            {
                "model": args.model_id,
                "dtype": args.dtype,
                "backend": args.backend,
                "texts_per_s": round(texts_s, 1),
                "tokens_per_s": round(tokens_s),
                **({"fixed_shape": ceiling} if ceiling else {}),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
