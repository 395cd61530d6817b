"""Image embedding throughput (images/s), our server against Infinity's, same machine, same
CLIP model, same images, one run, side by side.

    HF_HUB_OFFLINE=1 DO_NOT_TRACK=1 .venv/bin/python benchmarks/images_vs_infinity.py \\
        --out benchmarks/results/clip-b32-images-vs-infinity.json \\
        --markdown benchmarks/results/clip-b32-images-vs-infinity.md

No weights are downloaded: the model is a CLIP ViT-B/32 (88M-parameter image tower, 224
pixels, patch 32; the text tower of the same shape) with random weights, built here (the
speed of a network does not depend on its weights), with a CLIP-style BPE vocabulary learnt
from the Python standard library's docstrings. The images are JPEGs made here (gradients
and noise, 256-640 pixels a side, so resizing and cropping cost what they cost on photos),
sent as data URIs to `/embeddings_image`, which both servers serve.

Sides are started one after the other (timed to their first answer), then loaded one at a
time in ABBA order over --rounds rounds of --seconds each, at --concurrency clients each
sending --per-request images; throughput is pooled over rounds. Fidelity: every side's
vectors for a few images against transformers' CLIPModel (float32) on the same folder.
Infinity runs from --infinity-python (its venv needs `aiohttp` for images).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import builtins
import inspect
import io
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from vs_infinity import (
    PRESETS,
    Server,
    machine_info,
    parse_side,
    servers_running,
    start_server,
    tree_rss_mb,
)
from vs_infinity import free_port as free_port_

MODEL_NAME = "clip-b32"


def build_clip_b32(out: Path) -> Path:
    """A ViT-B/32 CLIP folder with random weights and a CLIP-style tokenizer (no download)."""
    import collections
    import os
    import re
    import string

    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    docs = [inspect.getdoc(o) or "" for o in vars(builtins).values()]
    docs += [inspect.getdoc(m) or "" for m in (os, json, re, string, collections)]
    bpe = Tokenizer(models.BPE(unk_token="<|endoftext|>", end_of_word_suffix="</w>"))
    bpe.normalizer = normalizers.Lowercase()
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<|startoftext|>", "<|endoftext|>"], end_of_word_suffix="</w>",
        show_progress=False,
    )
    bpe.train_from_iterator(docs, trainer)
    with tempfile.TemporaryDirectory() as tmp:
        bpe.model.save(tmp)
        vocab = json.loads((Path(tmp) / "vocab.json").read_text())
        lines = (Path(tmp) / "merges.txt").read_text().splitlines()[1:]  # after the version line
        merges = [tuple(line.split()) for line in lines if line]
    tokenizer = CLIPTokenizerFast(vocab=vocab, merges=merges)
    text = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id}
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config=text, vision_config={}, projection_dim=512)).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    CLIPImageProcessorPil().save_pretrained(str(out))
    return out


def make_images(count: int) -> list[str]:
    """JPEG data URIs of assorted sizes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    uris = []
    for index in range(count):
        width, height = (int(v) for v in rng.integers(256, 640, size=2))
        y, x = np.mgrid[0:height, 0:width] / max(width, height)
        noise = rng.random((height, width))
        pixels = np.stack([x, y * (index % 3) / 2, noise], axis=-1) * 255
        buffer = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="JPEG", quality=90)
        uris.append("data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode())
    return uris


async def image_load(
    url: str, batches: Sequence[list[str]], concurrency: int, seconds: float
) -> dict[str, Any]:
    cycle = itertools.cycle(batches)
    latencies: list[float] = []
    images = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:

        async def client() -> None:
            nonlocal images
            while time.perf_counter() < deadline:
                batch = next(cycle)
                started = time.perf_counter()
                response = await c.post("/embeddings_image", json={"input": batch, "model": MODEL_NAME})
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)
                images += len(batch)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"images": images, "elapsed_s": elapsed, "latencies_s": latencies}


def embed_images(server: Server, uris: list[str]) -> np.ndarray:
    with httpx.Client(base_url=server.url, timeout=600) as client:
        response = client.post("/embeddings_image", json={"input": uris, "model": MODEL_NAME})
        response.raise_for_status()
        rows = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def reference(model: Path, uris: list[str]) -> np.ndarray:
    import torch
    from PIL import Image
    from transformers import CLIPImageProcessorPil, CLIPModel

    clip = CLIPModel.from_pretrained(str(model)).eval()
    pictures = [Image.open(io.BytesIO(base64.b64decode(u.partition(",")[2]))) for u in uris]
    with torch.no_grad():
        pixels = CLIPImageProcessorPil.from_pretrained(str(model))(pictures, return_tensors="pt")
        out = clip.get_image_features(**pixels)
    rows = (out if isinstance(out, torch.Tensor) else out.pooler_output).numpy()
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", type=Path, help="a CLIP folder (default: build the ViT-B/32 one)")
    parser.add_argument("--sides", nargs="+", type=parse_side,
                        default=[parse_side(s) for s in ("ours", "infinity-fp32", "infinity-bf16")])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--per-request", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--infinity-python", type=Path, default=Path("/work/infinity-venv/bin/python"))
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="images-vs-infinity-"))
    model = args.model or build_clip_b32(work / "clip-b32")
    uris = make_images(args.images)
    batches = [uris[i : i + args.per_request] for i in range(0, len(uris), args.per_request)]
    servers = []
    for side in args.sides:
        port = free_port_()
        command = side.command(model, port, args.infinity_python)
        command += ["--served-model-name", MODEL_NAME]
        servers.append(Server(side, command, port, work / f"{side.name}.log"))
    results: dict[str, dict[str, Any]] = {s.side.name: {"images": 0, "elapsed_s": 0.0, "latencies_s": []}
                                          for s in servers}
    fidelity: dict[str, float] = {}
    with servers_running(servers):
        for server in servers:
            start_server(server, MODEL_NAME, args.start_timeout)
            embed_images(server, uris[:8])  # warm-up
            facts = f"first answer {server.first_answer_s}s, RSS {server.rss_after_load_mb} MB"
            print(f"{server.side.name}: {facts}", flush=True)
        for round_ in range(args.rounds):
            order = servers if round_ % 2 == 0 else servers[::-1]
            for server in order:
                run = asyncio.run(image_load(server.url, batches, args.concurrency, args.seconds))
                pooled = results[server.side.name]
                pooled["images"] += run["images"]
                pooled["elapsed_s"] += run["elapsed_s"]
                pooled["latencies_s"] += run["latencies_s"]
                rate = run["images"] / run["elapsed_s"]
                print(f"round {round_} {server.side.name}: {rate:.1f} images/s", flush=True)
        for server in servers:
            server.rss_after_test_mb = tree_rss_mb(server.proc.pid) if server.proc else None
        got = {server.side.name: embed_images(server, uris[:16]) for server in servers}
    want = reference(model, uris[:16])
    for name, rows in got.items():
        fidelity[name] = float((rows * want).sum(axis=1).min())

    report: dict[str, Any] = {
        "model": str(model), "concurrency": args.concurrency, "per_request": args.per_request,
        "seconds": args.seconds, "rounds": args.rounds, "machine": machine_info(args.infinity_python),
        "sides": {},
    }
    for server in servers:
        pooled = results[server.side.name]
        latencies = sorted(pooled["latencies_s"])
        report["sides"][server.side.name] = {
            "command": server.command,
            "images_per_s": round(pooled["images"] / pooled["elapsed_s"], 2),
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
            "first_answer_s": server.first_answer_s,
            "rss_after_load_mb": server.rss_after_load_mb,
            "rss_after_test_mb": server.rss_after_test_mb,
            "worst_cosine_to_transformers_fp32": round(fidelity[server.side.name], 5),
            "models": server.models_info,
        }
    ours = next((n for n in report["sides"] if n.startswith("ours")), None)
    lines = [
        f"# Image embedding, CLIP ViT-B/32 shape: {args.concurrency} clients x {args.per_request} images, "
        f"{args.rounds} x {args.seconds:g} s per side (ABBA)",
        "",
        "| side | images/s | vs ours | p50 ms | p99 ms | first answer s | RSS MB | worst cosine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, side in report["sides"].items():
        versus = side["images_per_s"] / report["sides"][ours]["images_per_s"] if ours else float("nan")
        lines.append(
            f"| {name} | {side['images_per_s']} | {versus:.2f}x | {side['p50_ms']} | {side['p99_ms']} | "
            f"{side['first_answer_s']} | {side['rss_after_test_mb']} | "
            f"{side['worst_cosine_to_transformers_fp32']} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, default=str))
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    assert PRESETS  # the side presets come from vs_infinity
    main()
