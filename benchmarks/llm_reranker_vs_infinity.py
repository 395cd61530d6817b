"""An LLM reranker's throughput on this CPU: our server against Infinity serving the same
folder, interleaved in one run, as a ratio of (query, document) pairs per second.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/llm_reranker_vs_infinity.py --out llm_rr.json

Without --model, a tiny Qwen3-Reranker is built (tests/model_factory.py's, written as
sentence-transformers 6 writes an LLM reranker: Transformer in text-generation, then
LogitScore). Infinity (--infinity-python, default /work/infinity-venv/bin/python, a venv with
`infinity-emb[server,torch]`) is given that folder, and the same model as the Hub lays out
mxbai-rerank-v2 or Qwen3-Reranker without sentence-transformers' files (a causal LM, its
tokenizer and chat template; `tokenizer_class` named as transformers 4 reads it).

Each side is started in turn and is ready when it answers POST /rerank; one that exits first,
or answers /rerank with an error, cannot serve the model, and the report says so with its
error. Then, for --rounds, every side that serves runs the closed-loop load of
`infinity_cloud.sizing.load` (--concurrency clients, each request one query and
--per-request documents from benchmarks/corpus.py) for --seconds, in ABBA order, one side
under load at a time (servers and their machinery from benchmarks/vs_infinity.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from corpus import add_corpus_argument, load_texts
from vs_infinity import (
    DEFAULT_INFINITY_PYTHON,
    NO_SHEDDING,
    SERVER_ENV,
    Server,
    Side,
    free_port,
    log_tail,
    machine_info,
    ours_script,
    ratio,
    servers_running,
)

from infinity_cloud.sizing.load import Batch, LoadRun, load, make_batches

NAME = "rr"
TESTS = Path(__file__).resolve().parent.parent / "tests"
# sentence-transformers' files, which a Hub LLM reranker folder does not have.
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_LogitScore")


def build_tiny(root: Path) -> Path:
    sys.path.insert(0, str(TESTS))
    import model_factory

    return model_factory.build_qwen3_reranker(root / "qwen3-reranker")


def hub_layout(folder: Path, root: Path) -> Path:
    """The folder without sentence-transformers' files, its tokenizer class one transformers 4
    knows (transformers 5 writes `TokenizersBackend`)."""
    bare = root / "qwen3-reranker-hub"
    shutil.copytree(folder, bare)
    for name in ST_FILES:
        path = bare / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    config_path = bare / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config))
    return bare


def command(side: Side, model: Path, port: int, infinity_python: Path) -> list[str]:
    if side.program == "ours":
        return [str(ours_script()), "serve", "--model-id", str(model), "--served-model-name", NAME,
                "--port", str(port), *side.flags]
    return [str(infinity_python), "-m", "infinity_emb.cli", "v2", "--model-id", str(model),
            "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port), *side.flags]


def rerank(batch: Batch) -> tuple[str, dict[str, Any]]:
    """A batch's texts as the documents, ranked for the first words of the first one."""
    query = " ".join(batch.texts[0].split()[:12])
    return "/rerank", {"model": NAME, "query": query, "documents": batch.texts}


def last_error(log: Path) -> str:
    """The last exception line of a server's log."""
    lines = [line.strip() for line in log_tail(log, 400).splitlines()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]
    return errors[-1] if errors else lines[-1] if lines else "(no log)"


def start(server: Server, timeout_s: float) -> None:
    """Started and ready (a 200 to POST /rerank), or `dead` with why."""
    env = {**os.environ, **SERVER_ENV}
    with server.log_path.open("wb") as log:
        began = time.perf_counter()
        server.proc = subprocess.Popen(server.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
    probe = {"model": NAME, "query": "What is the capital of France?", "documents": ["Paris.", "A dog."]}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        while True:
            if server.proc.poll() is not None:
                server.dead = f"exited at start: {last_error(server.log_path)}"
                return
            if time.perf_counter() - began > timeout_s:
                server.dead = f"not ready after {timeout_s:.0f} s"
                return
            with contextlib.suppress(httpx.HTTPError):
                response = client.post("/rerank", json=probe)
                if response.status_code == 200:
                    server.first_answer_s = round(time.perf_counter() - began, 1)
                    return
                if 400 <= response.status_code < 500 and response.status_code != 429:
                    server.dead = f"/rerank answered {response.status_code}: {response.text[:400]}"
                    return
            time.sleep(0.2)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="an LLM reranker folder (default: a tiny Qwen3-Reranker)")
    parser.add_argument("--infinity-python", type=Path, default=DEFAULT_INFINITY_PYTHON)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--per-request", type=int, default=16, help="documents per request")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    add_corpus_argument(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="llm-rr-bench-"))
    model = args.model or build_tiny(work)
    sides = [
        (Side("ours", "ours", NO_SHEDDING), model),
        (Side("infinity", "infinity", ("--engine", "torch", "--device", "cpu")), model),
        (Side("infinity-hub-layout", "infinity", ("--engine", "torch", "--device", "cpu")),
         hub_layout(model, work)),
    ]
    servers = []
    for side, folder in sides:
        port = free_port()
        servers.append(Server(side, command(side, folder, port, args.infinity_python), port,
                              work / f"{side.name}.log"))
    texts = load_texts(args.corpus, "passage")
    batches = make_batches(texts, args.per_request)
    pooled: dict[str, LoadRun] = {}
    with servers_running(servers):
        for server in servers:  # one after the other: start-ups never compete for the CPUs
            start(server, args.start_timeout)
            state = server.dead or f"ready in {server.first_answer_s} s"
            print(f"{server.side.name}: {state}", flush=True)
        serving = [s for s in servers if not s.dead]
        for server in serving:  # a short warm-up each
            asyncio.run(load(server.url, NAME, batches, args.concurrency, 2.0, request=rerank))
        for round_ in range(args.rounds):
            for server in serving if round_ % 2 == 0 else serving[::-1]:
                run = asyncio.run(load(server.url, NAME, batches, args.concurrency, args.seconds,
                                       request=rerank))
                pooled[server.side.name] = pooled.get(server.side.name, LoadRun()) + run
                rate = run.texts / run.elapsed_s
                print(f"round {round_} {server.side.name}: {rate:.1f} pairs/s", flush=True)
    results: dict[str, Any] = {}
    for server in servers:
        run = pooled.get(server.side.name)
        results[server.side.name] = {
            "command": server.command, "ready_s": server.first_answer_s, "cannot_serve": server.dead,
            **({"pairs_per_s": round(run.texts / run.elapsed_s, 1), **run.summary()} if run else {}),
        }
    ours = results["ours"].get("pairs_per_s")
    rivals = {name: r.get("pairs_per_s") for name, r in results.items() if name != "ours"}
    report = {
        "machine": machine_info(args.infinity_python),
        "model": str(args.model or "tiny Qwen3-Reranker (tests/model_factory.py build_qwen3_reranker)"),
        "settings": {"concurrency": args.concurrency, "documents_per_request": args.per_request,
                     "seconds": args.seconds, "rounds": args.rounds},
        "sides": results,
        "ratio_ours_over": {name: ratio(ours, rate) if rate else
                            f"not comparable: {name} cannot serve the model ({results[name]['cannot_serve']})"
                            for name, rate in rivals.items()},
    }
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
