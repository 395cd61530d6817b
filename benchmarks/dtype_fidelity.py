"""Every backend x dtype of ours on one model: cosine to sentence-transformers float32 and
in-process throughput, one combination after another in one process tree.

    HF_HUB_OFFLINE=1 python benchmarks/dtype_fidelity.py --model-id <model folder> \\
        --markdown dtype_fidelity.md

Each combination runs in a fresh engine (exports are built first if missing, not timed);
fidelity is measured on --fidelity-texts queries and passages (benchmarks/corpus.py, or
--corpus), throughput as in engine_throughput.py (requests of 32 passages from 32 tasks, median
of --rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

import numpy as np
from corpus import add_corpus_argument, load_texts
from engine_throughput import run
from http_load import cosine_rows, reference_embeddings

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.core.errors import InfinityCloudError
from infinity_cloud.engine.asks import EmbedAsk

COMBINATIONS = (
    "openvino:auto", "openvino:float32", "openvino:int8", "onnx:float32", "onnx:int8", "torch:float32",
    "torch:bfloat16",
    "ctranslate2:float32", "ctranslate2:int8",
)


async def measure(model: str, combination: str, probe: list[str], passages: list[str], rounds: int) -> dict:
    backend, dtype = combination.split(":")
    try:
        # No deadline: 32 x 32 passages queue past the default 10 s on a slow CPU, and this
        # measures throughput at saturation, not shedding.
        spec = ModelSpec(model_id=model, backend=backend, dtype=dtype, deadline_s=None)
        async with Engine(spec) as engine:
            facts = engine.describe()[0]
            vectors = (await engine.embeddings(EmbedAsk(probe))).embeddings
            await run(engine, passages[:64], 8, 2)  # warm-up
            rates = []
            for _ in range(rounds):
                seconds, tokens = await run(engine, passages, 32, 32)
                rates.append(tokens / seconds)
    except InfinityCloudError as exc:
        return {"combination": combination, "error": exc.message}
    return {
        "combination": combination, "served_dtype": facts["dtype"], "vectors": vectors,
        "tokens_per_s": round(statistics.median(rates)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_corpus_argument(parser)
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--combinations", nargs="+", default=list(COMBINATIONS))
    parser.add_argument("--fidelity-texts", type=int, default=128)
    parser.add_argument("--texts", type=int, default=512, help="passages per throughput round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    half = args.fidelity_texts // 2
    probe = load_texts(args.corpus, "query")[:half] + load_texts(args.corpus, "passage")[:half]
    passages = load_texts(args.corpus, "passage")[: args.texts]
    rows = [asyncio.run(measure(args.model_id, c, probe, passages, args.rounds)) for c in args.combinations]
    reference = reference_embeddings(args.model_id, probe)
    lines = [
        f"Model `{args.model_id}`: cosine to sentence-transformers float32 on {len(probe)} texts; "
        "in-process real tokens/s (32 tasks x 32 passages).", "",
        "| backend:dtype | served as | cosine min | cosine mean | tokens/s |", "|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['combination']} | refused: {row['error'][:80]} | | | |")
            continue
        cosines = cosine_rows(np.asarray(row.pop("vectors")), reference)
        row.update(cosine_min=round(float(cosines.min()), 5), cosine_mean=round(float(cosines.mean()), 5))
        lines.append(
            f"| {row['combination']} | {row['served_dtype']} | {row['cosine_min']:.5f} | "
            f"{row['cosine_mean']:.5f} | {row['tokens_per_s']:,} |"
        )
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        args.markdown.write_text(report + "\n")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
