"""A CPU calibration point that a busy machine does not spoil: tokens per CPU-second of the
server process (its /metrics `process_cpu_seconds_total`), not tokens per wall second. Under a
load average of several times the cores, `bench`'s tokens/s measure the share of the CPU the
server got; the CPU-seconds the server spent per token measure the kernels, whatever else runs.
A replica with the cores to itself does (tokens per CPU-second) x cores at best, so this is an
upper bound of what an idle machine measures, as close to it as the model's threads scale.

It also gives the per-request overhead: the server's CPU-ms per one-query request, less the
compute its tokens take at the passage rate.

    python benchmarks/cpu_seconds_calibration.py --model-id PATH [--seconds 20] --out point.json

Not a test: it reads timings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from pathlib import Path

import httpx
from http_load import print_json

from infinity_cloud.core.config import build_spec
from infinity_cloud.core.hardware import cpu_clock_ghz, cpu_model, kernel_flags, usable_cores
from infinity_cloud.sizing.corpus import load_texts
from infinity_cloud.sizing.load import load, make_batches
from infinity_cloud.sizing.local_server import local_server

_CPU = re.compile(r"^process_cpu_seconds_total\s+([0-9.eE+]+)", re.MULTILINE)


def _cpu_seconds(url: str) -> float:
    match = _CPU.search(httpx.get(f"{url}/metrics", timeout=30).text)
    if match is None:
        raise SystemExit("the server's /metrics has no process_cpu_seconds_total")
    return float(match.group(1))


def _conditions() -> dict[str, float]:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return {
        "load_avg_1m": os.getloadavg()[0],
        "steal_jiffies": float(fields[7]),
        "total_jiffies": sum(map(float, fields)),
    }


def _run(url: str, kind: str, per_request: int, clients: int, seconds: float) -> dict[str, float]:
    batches = make_batches(load_texts(None, kind)[: per_request * 32], per_request)
    asyncio.run(load(url, None, batches[:2], 1, 1.0))  # warm
    before, started = _cpu_seconds(url), time.perf_counter()
    run = asyncio.run(load(url, None, batches, clients, seconds))
    cpu = _cpu_seconds(url) - before
    return {
        "kind": kind,
        "per_request": per_request,
        "clients": clients,
        "requests": len(run.latencies_s),
        "tokens": run.tokens,
        "wall_s": round(time.perf_counter() - started, 2),
        "server_cpu_s": round(cpu, 2),
        "tokens_per_wall_s": round(run.tokens / run.elapsed_s),
        "tokens_per_cpu_s": round(run.tokens / cpu),
        "cpu_ms_per_request": round(1000 * cpu / max(1, len(run.latencies_s)), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    spec = build_spec({"models": [{"model_id": args.model_id}]})
    before = _conditions()
    with local_server(spec) as url:
        passages = _run(url, "passage", 32, 2, args.seconds)
        queries = _run(url, "query", 1, 4, args.seconds)
    after = _conditions()
    per_query_tokens = queries["tokens"] / max(1, queries["requests"])
    compute_ms = 1000 * per_query_tokens / passages["tokens_per_cpu_s"]
    steal = (after["steal_jiffies"] - before["steal_jiffies"]) / (
        after["total_jiffies"] - before["total_jiffies"]
    )
    result = {
        "cpu": cpu_model(),
        "kernel_flags": kernel_flags(),
        "cores": usable_cores(),
        "clock_ghz": cpu_clock_ghz(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "conditions": {
            "load_avg_before": before["load_avg_1m"],
            "load_avg_after": after["load_avg_1m"],
            "steal_share": round(steal, 4),
        },
        "passage": passages,
        "query": queries,
        "request_overhead_ms": round(queries["cpu_ms_per_request"] - compute_ms, 2),
    }
    print_json(result, args.out)


if __name__ == "__main__":
    main()
