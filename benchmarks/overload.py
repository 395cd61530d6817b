"""The server on its worst day: memory under 16 MB requests (one, then four at once),
fairness (a one-text probe during a 2,000-text request) and overload (twice the measured
capacity, open loop, for a while): how many answers, 429s and client time-outs, how long the
admitted ones took, and the process's resident memory.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/overload.py --model path/to/all-MiniLM-L6-v2 \\
        --out overload.json

Texts are made here, from the Python standard library's docstrings (no corpus needed). The
server is started with `infinity-cloud serve` and any --flags given after `--`; run it once
on an older checkout (PYTHONPATH=that/checkout) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from vs_infinity import PRESETS, Server, Side, free_port, servers_running, start_server, tree_rss_mb

from infinity_cloud.tasks.quantization import calibration_texts

MODEL = "m"


def texts(count: int) -> list[str]:
    pool = calibration_texts(4096)
    return [pool[i % len(pool)] for i in range(count)]


class RssSampler:
    """The server's resident memory every 0.2 s, from a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.samples, self._stop = pid, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(tree_rss_mb(self.pid))
            time.sleep(0.2)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def fairness(url: str, big: int) -> dict[str, Any]:
    """A one-text probe every 0.25 s while one request of `big` texts is served."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        large = asyncio.ensure_future(client.post("/embeddings", json={"model": MODEL, "input": texts(big)}))
        probes: list[float] = []
        while not large.done():
            started = time.perf_counter()
            response = await client.post("/embeddings", json={"model": MODEL, "input": ["a short probe"]})
            response.raise_for_status()
            probes.append(time.perf_counter() - started)
            await asyncio.sleep(0.25)
        (await large).raise_for_status()
    return {
        "large_texts": big, "probes": len(probes), "probe_p50_ms": round(1000 * statistics.median(probes), 1),
        "probe_max_ms": round(1000 * max(probes), 1),
    }


def long_texts(count: int, chars: int) -> list[str]:
    """`count` texts of `chars` characters each: the issue's 16 MB request is 2,000 x 8,000."""
    prose = " ".join(texts(512))
    return [(prose[i * 37 % 10_000 :] + prose)[:chars] for i in range(count)]


async def heavy(url: str, count: int, chars: int, at_once: int, pid: int) -> dict[str, Any]:
    """`at_once` requests of `count` x `chars` characters sent together; the answers' statuses
    and the server's peak memory while they ran."""
    body = {"model": MODEL, "input": long_texts(count, chars)}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        with RssSampler(pid) as rss:
            started = time.perf_counter()
            answers = await asyncio.gather(*(client.post("/embeddings", json=body) for _ in range(at_once)))
            seconds = time.perf_counter() - started
    statuses: dict[str, int] = {}
    for answer in answers:
        statuses[str(answer.status_code)] = statuses.get(str(answer.status_code), 0) + 1
    return {
        "requests": at_once, "mb_each": round(len(json.dumps(body)) / 2**20, 1), "statuses": statuses,
        "seconds": round(seconds, 1), "rss_peak_mb": max(rss.samples),
    }


async def capacity(url: str, per_request: int, seconds: float) -> float:
    """Texts per second with 8 closed-loop clients."""
    done = 0
    deadline = time.perf_counter() + seconds
    batch = texts(per_request)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                (await client.post("/embeddings", json={"model": MODEL, "input": batch})).raise_for_status()
                done += per_request

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(8)))
        return done / (time.perf_counter() - started)


async def overload(url: str, rate: float, per_request: int, seconds: float, timeout: float) -> dict[str, Any]:
    """Requests arriving at `rate` texts/s (open loop) for `seconds`, each given `timeout`."""
    batch = texts(per_request)
    statuses: dict[str, int] = {}
    admitted: list[float] = []
    limits = httpx.Limits(max_connections=2000)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:

        async def one() -> None:
            started = time.perf_counter()
            try:
                response = await client.post("/embeddings", json={"model": MODEL, "input": batch})
                key = str(response.status_code)
                if response.status_code == 200:
                    admitted.append(time.perf_counter() - started)
            except httpx.TimeoutException:
                key = "client time-out"
            statuses[key] = statuses.get(key, 0) + 1

        tasks = []
        interval = per_request / rate
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            tasks.append(asyncio.ensure_future(one()))
            await asyncio.sleep(interval)
        await asyncio.gather(*tasks)
    admitted.sort()
    return {
        "offered_texts_per_s": round(rate, 1), "requests": len(tasks), "statuses": statuses,
        "admitted_p50_ms": round(1000 * admitted[len(admitted) // 2], 1) if admitted else None,
        "admitted_p99_ms": round(1000 * admitted[int(0.99 * (len(admitted) - 1))], 1) if admitted else None,
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--large", type=int, default=2000)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--client-timeout", type=float, default=30.0)
    parser.add_argument("--phases", nargs="+", default=["heavy", "fairness", "overload"])
    parser.add_argument("--heavy-texts", type=int, default=2000)
    parser.add_argument("--heavy-chars", type=int, default=8000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("flags", nargs="*", help="after --: more `serve` flags")
    args = parser.parse_args()
    port = free_port()
    side = Side("ours", "ours", tuple(args.flags))
    server = Server(side, [*side.command(args.model, port, Path("-")), "--served-model-name", MODEL], port,
                    Path(f"/tmp/overload-{port}.log"))
    report: dict[str, Any] = {"flags": args.flags}
    with servers_running([server]):
        start_server(server, MODEL, 600)
        assert server.proc is not None
        report["rss_fresh_mb"] = tree_rss_mb(server.proc.pid)
        for at_once in (1, 4) if "heavy" in args.phases else ():
            report[f"heavy_x{at_once}"] = asyncio.run(
                heavy(server.url, args.heavy_texts, args.heavy_chars, at_once, server.proc.pid)
            )
            time.sleep(5)
            report[f"rss_idle_after_heavy_x{at_once}_mb"] = tree_rss_mb(server.proc.pid)
        with RssSampler(server.proc.pid) as rss:
            if "fairness" in args.phases:
                report["fairness"] = asyncio.run(fairness(server.url, args.large))
            if "overload" in args.phases:
                rate = asyncio.run(capacity(server.url, args.per_request, 10))
                report["capacity_texts_per_s"] = round(rate, 1)
                report["overload_2x"] = asyncio.run(
                    overload(server.url, 2 * rate, args.per_request, args.seconds, args.client_timeout)
                )
        if rss.samples:
            report["rss_peak_mb"] = max(rss.samples)
            time.sleep(10)
            report["rss_idle_after_mb"] = tree_rss_mb(server.proc.pid)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    assert PRESETS
    main()
