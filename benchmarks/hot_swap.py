"""A model loaded and unloaded while another serves steady traffic: every request's status
and latency, before, while the second model loads and serves, and after it is unloaded.

    HF_HUB_OFFLINE=1 python benchmarks/hot_swap.py [--model-id M] [--second-model-id M2] \\
        [--clients 4] [--markdown out.md]

A real server process (`infinity-cloud serve` with an admin key); --clients closed-loop
clients embed one passage each request on the first model throughout; once it is warm the
second model is loaded (`POST /admin/models`), serves rerank-free embedding traffic of its
own for a few seconds, and is unloaded (`DELETE /admin/models/NAME`). Failures are every
status but 200 on the first model, and on the second every status but 200 and the
documented 503 (loading, draining) and 404 (unloaded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from infinity_cloud.core.hardware import cpu_model
from infinity_cloud.models.model_source import packaged_default_model

KEY = "hot-swap-bench"


async def clients(
    url: str, model: str, count: int, stop: asyncio.Event, log: list[tuple[float, int, float]]
) -> None:
    async def one(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            response = await http.post(
                "/v1/embeddings", json={"model": model, "input": ["a passage to embed"]}
            )
            log.append((started, response.status_code, time.perf_counter() - started))

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await asyncio.gather(*(one(http) for _ in range(count)))


def summary(log: list[tuple[float, int, float]], since: float, until: float) -> dict:
    window = [(status, seconds) for started, status, seconds in log if since <= started < until]
    latencies = sorted(seconds for status, seconds in window if status == 200) or [0.0]
    statuses: dict[str, int] = {}
    for status, _ in window:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "requests": len(window),
        "statuses": statuses,
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
    }


async def measure(args: argparse.Namespace, url: str) -> dict:
    admin = {"Authorization": f"Bearer {KEY}"}
    stop, first, second = asyncio.Event(), [], []
    steady = asyncio.ensure_future(clients(url, "first", args.clients, stop, first))
    await asyncio.sleep(args.phase_s)
    marks = {"load": time.perf_counter()}
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=admin) as http:
        loaded = await http.post(
            "/admin/models", json={"model_id": args.second_model_id, "served_model_name": "second"}
        )
        assert loaded.status_code == 202, loaded.text
        other = asyncio.Event()
        side = asyncio.ensure_future(clients(url, "second", 1, other, second))
        while (await http.get("/admin/models")).json()["data"][-1]["state"] == "loading":
            await asyncio.sleep(0.1)
        marks["ready"] = time.perf_counter()
        await asyncio.sleep(args.phase_s)
        marks["unload"] = time.perf_counter()
        unloaded = (await http.delete("/admin/models/second")).json()
        marks["unloaded"] = time.perf_counter()
        await asyncio.sleep(1)
        other.set()
        await side
    await asyncio.sleep(args.phase_s)
    stop.set()
    await steady
    end = time.perf_counter()
    start = min(s for s, _, _ in first)
    phases = {
        "before": (start, marks["load"]),
        "loading": (marks["load"], marks["ready"]),
        "serving both": (marks["ready"], marks["unload"]),
        "unloading": (marks["unload"], marks["unloaded"]),
        "after": (marks["unloaded"], end),
    }
    failed_first = sum(1 for _, status, _ in first if status != 200)
    failed_second = sum(1 for _, status, _ in second if status not in (200, 503, 404))
    return {
        "first": {name: summary(first, *span) for name, span in phases.items()},
        "second": summary(second, marks["load"], end),
        "failed_first": failed_first,
        "failed_second": failed_second,
        "load_s": round(marks["ready"] - marks["load"], 2),
        "unload_s": round(marks["unloaded"] - marks["unload"], 2),
        "freed_mb": unloaded["freed_bytes"] // 2**20,
        "drained": unloaded["drained"],
    }


def markdown(result: dict, args: argparse.Namespace) -> str:
    lines = [
        f"Hot swap on {cpu_model()} ({os.cpu_count()} cores): {args.clients} clients on the first model "
        f"({args.label}); the second ({args.second_label}) loaded in {result['load_s']} s, unloaded in "
        f"{result['unload_s']} s ({result['drained']} calls drained, {result['freed_mb']} MB given back)",
        "",
        "| phase | requests to the first | statuses | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for phase, row in result["first"].items():
        lines.append(
            f"| {phase} | {row['requests']} | {row['statuses']} | {row['p50_ms']} | {row['p99_ms']} |"
        )
    second = result["second"]
    lines += [
        "",
        f"The second model's own requests: {second['statuses']}. Failed: {result['failed_first']} on the "
        f"first, {result['failed_second']} on the second (other than the documented 503 and 404).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-id", default=None, help="the model serving throughout (default: packaged MiniLM)"
    )
    parser.add_argument(
        "--second-model-id", default=None, help="the model loaded and unloaded (default: the same)"
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--phase-s", type=float, default=5.0)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    args.label = args.model_id or "all-MiniLM-L6-v2, the packaged copy"
    args.second_label = args.second_model_id or f"{args.label}, under another name"
    args.model_id = args.model_id or str(packaged_default_model())
    args.second_model_id = args.second_model_id or args.model_id
    with tempfile.TemporaryDirectory() as folder:
        keys = Path(folder) / "admin-keys"
        keys.write_text(KEY + "\n", encoding="utf-8")
        port = 7311
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "infinity_cloud",
                "serve",
                "--model-id",
                args.model_id,
                "--served-model-name",
                "first",
                "--port",
                str(port),
                "--admin-key-file",
                str(keys),
                "--admin-model-root",  # where the second model's folder lies, if it is one
                str(Path(args.second_model_id).expanduser().resolve().parent),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            result = asyncio.run(measure(args, url))
        finally:
            server.terminate()
            server.wait(30)
    print(json.dumps(result, indent=1))
    text = markdown(result, args)
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
