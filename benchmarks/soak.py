"""A soak: resident memory while a model embeds distinct inputs for a long time, in process and
over HTTP, and after the load stops.

    HF_HUB_OFFLINE=1 python benchmarks/soak.py [--minutes 20] [--mode process|http|both] \\
        [--clients 4] [--bound-mb 64] [--json out.json] [-- SERVE FLAGS...]

Every text is new (words of the benchmarks' corpus drawn by a seeded generator, so no two
requests repeat), in mixed sizes: requests of 1 to 64 texts, queries of 4-20 words and
passages of 40-250, from --clients closed-loop clients. Memory is the serving process's
resident set (this process in `process` mode, the `infinity-cloud serve` child over HTTP),
sampled every few seconds. Held against --bound-mb: its growth from the end of the first
--settle-minutes (the shapes and pools a server meets in its first minutes) to the highest
point after, and its level 20 s after the load stops. Flags after `--` go to the served model
(`--cache-mb 64`, `--dtype float32`, ...), in both modes.

Each distinct input used to leave memory behind in OpenVINO's caches of compiled kernels per
input shape (CPU_RUNTIME_CACHE_CAPACITY, 5,000, and oneDNN's primitive cache, 1,024): the
figures of issue 34 were RSS 1,112 -> 2,793 MB in 10 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from corpus import add_corpus_argument, load_texts

from infinity_cloud.core.hardware import cpu_model
from infinity_cloud.engine.asks import EmbedAsk

SIZES = (1, 1, 4, 8, 16, 32, 64)  # texts per request


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Inputs:
    """Distinct texts, drawn from the corpus's words."""

    def __init__(self, corpus: Path | None, seed: int) -> None:
        self.words = sorted({w for text in load_texts(corpus, "passage") for w in text.split()})
        self.rng = random.Random(seed)
        self.made = 0

    def request(self) -> list[str]:
        count = self.rng.choice(SIZES)
        self.made += count
        return [
            " ".join(self.rng.choices(self.words, k=self.rng.randint(*((4, 20) if self.rng.random() < 0.3
                                                                      else (40, 250)))))
            for _ in range(count)
        ]


class Sampler:
    """The process's resident memory every `every_s` seconds, in a thread."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, float]] = []
        self.started = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self.started, resident_mb(self.pid)))
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def drive(
    embed: Callable[[list[str]], Awaitable[int]], inputs: Inputs, clients: int, seconds: float
) -> dict:
    """Closed-loop clients for `seconds`; what they sent."""
    until = time.perf_counter() + seconds
    done = {"requests": 0, "texts": 0, "failed": 0}

    async def client() -> None:
        while time.perf_counter() < until:
            texts = inputs.request()
            try:
                await embed(texts)
            except Exception as exc:  # counted: a soak reports failures, it does not stop on one
                done["failed"] += 1
                print(f"  failed: {type(exc).__name__}: {exc}"[:200], file=sys.stderr)
            else:
                done["requests"] += 1
                done["texts"] += len(texts)

    await asyncio.gather(*(client() for _ in range(clients)))
    return done


def summarize(samples: list[tuple[float, float]], load_s: float, settle_s: float, bound_mb: float) -> dict:
    under_load = [(t, mb) for t, mb in samples if t <= load_s]
    settled = next((mb for t, mb in under_load if t >= settle_s), under_load[-1][1])
    later = [mb for t, mb in under_load if t >= settle_s] or [settled]
    half = [(t, mb) for t, mb in under_load if t >= load_s / 2]
    slope = 0.0
    if len(half) > 2:
        slope = statistics.linear_regression([t for t, _ in half], [mb for _, mb in half]).slope
    after = [mb for t, mb in samples if t > load_s]
    growth = max(later) - settled
    return {
        "start_mb": round(samples[0][1]), "settled_mb": round(settled), "max_mb": round(max(later)),
        "end_mb": round(under_load[-1][1]), "after_stop_mb": round(after[-1]) if after else None,
        "growth_after_settle_mb": round(growth), "slope_second_half_mb_per_hour": round(slope * 3600, 1),
        "bound_mb": bound_mb, "flat": growth <= bound_mb and (not after or after[-1] - settled <= bound_mb),
    }


async def in_process(args: argparse.Namespace, inputs: Inputs) -> dict:
    from infinity_cloud import Engine, ModelSpec

    spec = model_spec(args, ModelSpec)
    async with Engine(spec) as engine:
        sampler = Sampler(os.getpid(), args.every_s)

        async def embed(texts: list[str]) -> int:
            return (await engine.embeddings(EmbedAsk(texts))).prompt_tokens

        done = await drive(embed, inputs, args.clients, args.minutes * 60)
        load_s = time.perf_counter() - sampler.started
        await asyncio.sleep(args.after_s)
        sampler.stop()
    return {**done, **summarize(sampler.samples, load_s, args.settle_minutes * 60, args.bound_mb),
            "samples": sampler.samples}


def model_spec(args: argparse.Namespace, spec_class: type) -> object:
    """The served model from `--model-id` and the flags after `--` (--name value pairs)."""
    fields: dict[str, object] = {"model_id": args.model_id}
    extra = list(args.serve)
    while extra:
        flag = extra.pop(0).removeprefix("--").replace("-", "_")
        fields[flag] = extra.pop(0) if extra and not extra[0].startswith("--") else True
    return spec_class(**fields)


async def over_http(args: argparse.Namespace, inputs: Inputs) -> dict:
    import httpx

    port = args.port
    server = subprocess.Popen(
        [sys.executable, "-m", "infinity_cloud", "serve", "--model-id", args.model_id, "--port", str(port),
         *args.serve],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            for _ in range(1200):
                try:
                    if (await http.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
            sampler = Sampler(server.pid, args.every_s)

            async def embed(texts: list[str]) -> int:
                response = await http.post("/v1/embeddings", json={"input": texts})
                response.raise_for_status()
                return response.json()["usage"]["prompt_tokens"]

            done = await drive(embed, inputs, args.clients, args.minutes * 60)
            load_s = time.perf_counter() - sampler.started
            await asyncio.sleep(args.after_s)
            sampler.stop()
    finally:
        server.terminate()
        server.wait(30)
    return {**done, **summarize(sampler.samples, load_s, args.settle_minutes * 60, args.bound_mb),
            "samples": sampler.samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_corpus_argument(parser)
    parser.add_argument("--model-id", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--mode", choices=("process", "http", "both"), default="both")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--settle-minutes", type=float, default=2.0)
    parser.add_argument("--after-s", type=float, default=20.0, help="sampled after the load stops")
    parser.add_argument("--every-s", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--bound-mb", type=float, default=64.0)
    parser.add_argument("--port", type=int, default=7319)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("serve", nargs=argparse.REMAINDER, help="-- then flags for the served model")
    args = parser.parse_args()
    args.serve = [a for a in args.serve if a != "--"]
    inputs = Inputs(args.corpus, args.seed)
    modes = ("process", "http") if args.mode == "both" else (args.mode,)
    results = {"cpu": cpu_model(), "cores": os.cpu_count(), "model": args.model_id, "serve": args.serve,
               "minutes": args.minutes, "clients": args.clients}
    for mode in modes:
        run = in_process if mode == "process" else over_http
        result = asyncio.run(run(args, inputs))
        results[mode] = result
        shown = {k: v for k, v in result.items() if k != "samples"}
        print(f"{mode}: {json.dumps(shown)}", flush=True)
    print(f"\n{results['cpu']} ({results['cores']} cores), {args.model_id} {' '.join(args.serve)}, "
          f"{args.clients} clients, {args.minutes:g} min of distinct inputs, bound {args.bound_mb:g} MB")
    print("| mode | requests | texts | failed | start | settled | max | end | 20 s after | growth | flat |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        r = results[mode]
        cells = (mode, r["requests"], r["texts"], r["failed"], r["start_mb"], r["settled_mb"], r["max_mb"],
                 r["end_mb"], r["after_stop_mb"], r["growth_after_settle_mb"], r["flat"])
        print("| " + " | ".join(str(cell) for cell in cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
