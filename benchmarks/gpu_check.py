"""Helpers for benchmarks/gpu_check.sh (one short run on a lent GPU machine).

    python benchmarks/gpu_check.py fidelity --model M --device cuda \\
        --out fidelity.json --markdown fidelity.md
    python benchmarks/gpu_check.py summary --fidelity fidelity.json --http vs_infinity.json \\
        --pair ours-fp16=infinity-fp16 --pair ours-bf16=infinity-default --markdown summary.md

`fidelity`: our in-process Engine (torch backend on --device) in each --dtypes, one engine
after the other, on --texts corpus texts (half queries, half passages): cosine per text of each
reduced precision against our float32 on the same device, and of our float32 against
sentence-transformers float32 on the same folder and device (the sanity row); plus, per dtype,
in-process real tokens/s at 32 tasks x 32 passages (engine_throughput.run), the served dtype
and device as the engine reports them, load time and peak GPU memory. The JSON is rewritten
after every step, so a run stopped by its time limit still leaves what it measured.

`summary`: one markdown page from both JSON reports (either may be missing or partial):
the fidelity table, then the HTTP sides (vs_infinity.py's report) with throughput and latency
ratios for each --pair OURS=THEIRS, and each side's server share of the in-process rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from corpus import add_corpus_argument, describe, load_texts
from engine_throughput import run
from http_load import cosine_rows

from infinity_cloud import Engine, ModelSpec

THRESHOLD = 0.999  # what --dtype auto demands of a reduced precision (README)


# -- fidelity --------------------------------------------------------------------------------


def cuda_stats(device: str) -> dict[str, Any]:
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {}
    torch.cuda.synchronize()
    return {"peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}


def reset_cuda_peak(device: str) -> None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


async def ours(
    model: Path, device: str, dtype: str, texts: list[str], passages: list[str], throughput_texts: int
) -> tuple[dict[str, Any], np.ndarray]:
    spec = ModelSpec(model_id=str(model), backend="torch", device=device, dtype=dtype)
    reset_cuda_peak(device)
    started = time.perf_counter()
    async with Engine(spec) as engine:
        row: dict[str, Any] = {"load_s": round(time.perf_counter() - started, 2)}
        facts = engine.describe()[0]
        row.update(served_dtype=facts.get("dtype"), served_device=facts.get("device"),
                   backend=facts.get("backend"))
        vectors = np.asarray((await engine.embed(texts)).embeddings, dtype=np.float64)
        if throughput_texts:
            chosen = passages[:throughput_texts]
            await run(engine, chosen[:64], 8, 2)  # warm-up
            rates = []
            for _ in range(2):
                seconds, tokens = await run(engine, chosen, 32, 32)
                rates.append((len(chosen) / seconds, tokens / seconds))
            best = max(rates, key=lambda r: r[1])
            row.update(in_process_texts=len(chosen), in_process_texts_per_s=round(best[0], 1),
                       in_process_tokens_per_s=round(best[1]))
        row.update(cuda_stats(device))
    return row, vectors


def st_vectors(model: Path, device: str, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model), device=device)
    out = st.encode(list(texts), batch_size=32, convert_to_numpy=True)
    del st
    return np.asarray(out, dtype=np.float64)


def compare(a: np.ndarray, b: np.ndarray, kinds: list[str]) -> dict[str, Any]:
    cos = cosine_rows(a, b)
    out: dict[str, Any] = {"min": round(float(cos.min()), 6), "mean": round(float(cos.mean()), 6)}
    for kind in sorted(set(kinds)):
        picked = cos[[k == kind for k in kinds]]
        out[f"{kind}_min"] = round(float(picked.min()), 6)
        out[f"{kind}_mean"] = round(float(picked.mean()), 6)
    out["worst_index"] = int(cos.argmin())
    out[f"meets_{THRESHOLD}"] = bool(cos.min() >= THRESHOLD)
    return out


def environment(device: str) -> dict[str, Any]:
    import importlib.metadata as md
    import platform

    import torch

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    env: dict[str, Any] = {
        "python": platform.python_version(),
        **{d: version(d) for d in ("torch", "transformers", "sentence-transformers", "tokenizers", "numpy")},
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                   torch_cuda=torch.version.cuda,
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return env


def fidelity(args: argparse.Namespace) -> int:
    half = args.texts // 2
    queries, passages = load_texts(args.corpus, "query"), load_texts(args.corpus, "passage")
    texts = queries[:half] + passages[: args.texts - half]
    kinds = ["query"] * len(queries[:half]) + ["passage"] * len(passages[: args.texts - half])
    report: dict[str, Any] = {
        "model": str(args.model), "corpus": describe(args.corpus), "device": args.device, "texts": len(texts),
        "threshold": THRESHOLD, "environment": environment(args.device), "engines": {}, "comparisons": {},
        "errors": {},
    }
    vectors: dict[str, np.ndarray] = {}

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(report, indent=2) + "\n")

    def step(name: str, fn: Any) -> Any:
        print(f"[fidelity] {name} ...", flush=True)
        started = time.perf_counter()
        try:
            result = fn()
        except Exception as exc:  # one failure must not cost the other rows
            report["errors"][name] = f"{type(exc).__name__}: {exc}"
            print(f"[fidelity] {name} FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            save()
            return None
        print(f"[fidelity] {name} done in {time.perf_counter() - started:.1f} s", flush=True)
        return result

    st_devices = [args.device] + (["cpu"] if args.device != "cpu" else [])
    pairs = [(f"ours-{d}", "ours-float32") for d in args.dtypes if d != "float32"]
    pairs += [(f"ours-{d}", f"st-float32-{args.device}") for d in args.dtypes]
    if args.device != "cpu":
        pairs.append((f"st-float32-{args.device}", "st-float32-cpu"))

    def update() -> None:  # after every step, so a run cut short keeps its comparisons
        for a, b in pairs:
            if a in vectors and b in vectors:
                report["comparisons"][f"{a} vs {b}"] = compare(vectors[a], vectors[b], kinds)
        save()

    for dtype in args.dtypes:
        got = step(f"ours-{dtype}", lambda d=dtype: asyncio.run(
            ours(args.model, args.device, d, texts, passages, args.throughput_texts)))
        if got is not None:
            report["engines"][f"ours-{dtype}"], vectors[f"ours-{dtype}"] = got
            print(f"  {report['engines'][f'ours-{dtype}']}", flush=True)
        update()
    for dev in st_devices:
        got = step(f"st-float32-{dev}", lambda d=dev: st_vectors(args.model, d, texts))
        if got is not None:
            vectors[f"st-float32-{dev}"] = got
        update()
    text = fidelity_markdown(report)
    print(text, flush=True)
    if args.markdown:
        args.markdown.write_text(text)
    return 1 if report["errors"] else 0


def fidelity_markdown(report: dict[str, Any]) -> str:
    env = report.get("environment", {})
    lines = [
        f"## Fidelity: our torch backend on `{report['device']}`",
        "",
        f"Model `{report['model']}`, {report['texts']} corpus texts (half queries, half passages); "
        f"{env.get('gpu') or 'no GPU'}; torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"sentence-transformers {env.get('sentence-transformers')}.",
        "",
        "| comparison | cosine min | mean | query min | passage min | >= 0.999 |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in report.get("comparisons", {}).items():
        lines.append(
            f"| {name} | {c['min']:.6f} | {c['mean']:.6f} | {c.get('query_min', float('nan')):.6f} | "
            f"{c.get('passage_min', float('nan')):.6f} | {'yes' if c[f'meets_{THRESHOLD}'] else 'NO'} |"
        )
    lines += [
        "",
        "| engine | served dtype | device | load s | in-process tok/s (texts/s), 32 x 32 | peak GPU MB |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in report.get("engines", {}).items():
        rate = (f"{e['in_process_tokens_per_s']:,} ({e['in_process_texts_per_s']:,})"
                if "in_process_tokens_per_s" in e else "-")
        lines.append(
            f"| {name} | {e.get('served_dtype')} | {e.get('served_device')} | {e.get('load_s')} | {rate} | "
            f"{e.get('peak_gpu_mb', '-')} |"
        )
    for name, error in report.get("errors", {}).items():
        lines.append(f"\n**{name} failed**: `{error[:300]}`")
    return "\n".join(lines) + "\n"


# -- summary ---------------------------------------------------------------------------------


def read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if isinstance(a, int | float) and isinstance(b, int | float) and b else "-"


def num(value: Any, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "-"


def dtype_of(flags: str) -> str | None:
    parts = flags.split()
    return parts[parts.index("--dtype") + 1] if "--dtype" in parts[:-1] else None


def http_markdown(report: dict[str, Any], fid: dict[str, Any] | None, pairs: list[tuple[str, str]]) -> str:
    summary = report.get("summary", {})
    big = summary.get("largest_cell") or max(
        (c["label"] for c in report.get("cells", [])), key=lambda label: "passage" in label, default=None
    )
    single = summary.get("single_query_cell", "c1 x 1 query")
    args = report.get("args", {})
    engines = (fid or {}).get("engines", {})
    lines = [
        f"## HTTP: {args.get('rounds')} round(s) x {args.get('seconds')} s per cell and side, interleaved",
        "",
        f"| side | first answer s | RSS MB (after test) | tok/s {big} (texts/s) | p50 / p99 ms {big} "
        f"| p50 / p99 ms {single} | cosine vs ST fp32 min / mean | server / in-process | flags |",
        "|---" * 9 + "|",
    ]
    for name, side in report.get("sides", {}).items():
        cells = side.get("cells", {})
        b, s = cells.get(big, {}), cells.get(single, {})
        fid_row = side.get("fidelity") or {}
        in_proc = None
        if side.get("program") == "ours":
            dtype = dtype_of(side.get("command_flags", "")) or "auto"
            in_proc = engines.get(f"ours-{dtype}", {}).get("in_process_tokens_per_s")
        lines.append(
            f"| {name} | {num(side.get('first_answer_s'), 2)} | {num(side.get('rss_after_test_mb'))} | "
            f"{num(b.get('tokens_per_s'))} ({num(b.get('texts_per_s'), 1)})"
            f"{' ' + b['error'][:60] if 'error' in b else ''} | "
            f"{num(b.get('p50_ms'), 1)} / {num(b.get('p99_ms'), 1)} | "
            f"{num(s.get('p50_ms'), 1)} / {num(s.get('p99_ms'), 1)} | "
            f"{num(fid_row.get('min'), 5)} / {num(fid_row.get('mean'), 5)} | "
            f"{ratio(b.get('tokens_per_s'), in_proc) if in_proc else '-'} | `{side.get('command_flags')}` |"
        )
    sides = report.get("sides", {})
    for ours_name, their_name in pairs:
        if ours_name not in sides or their_name not in sides:
            continue
        o, t = sides[ours_name]["cells"], sides[their_name]["cells"]
        lines.append(
            f"\n- **{ours_name} vs {their_name}**: throughput at {big} "
            f"{ratio(o.get(big, {}).get('tokens_per_s'), t.get(big, {}).get('tokens_per_s'))} "
            f"(>1: ours faster); {single} p50 {num(o.get(single, {}).get('p50_ms'), 1)} ms vs "
            f"{num(t.get(single, {}).get('p50_ms'), 1)} ms "
            f"(speed-up {ratio(t.get(single, {}).get('p50_ms'), o.get(single, {}).get('p50_ms'))})."
        )
    machine = report.get("machine", {})
    lines.append(
        f"\nCPU {machine.get('cpu')} ({machine.get('nproc')} cores); ours: torch {machine.get('torch')}; "
        f"Infinity {machine.get('infinity_emb')} with torch {machine.get('infinity_torch')}, "
        f"transformers {machine.get('infinity_transformers')}. Load average at start "
        f"{machine.get('loadavg_at_start')}, at end {report.get('loadavg_at_end')}."
    )
    return "\n".join(lines) + "\n"


def summary(args: argparse.Namespace) -> int:
    fid, http = read_json(args.fidelity), read_json(args.http)
    pairs = [tuple(p.split("=", 1)) for p in args.pair]
    parts = ["# GPU check: infinity-cloud torch backend vs Infinity", ""]
    parts.append(fidelity_markdown(fid) if fid else f"## Fidelity\n\nno report at {args.fidelity}\n")
    parts.append("")
    parts.append(
        http_markdown(http, fid, pairs) if http and http.get("sides")
        else f"## HTTP\n\nno report at {args.http} (see the log for the per-cell lines printed so far)\n"
    )
    text = "\n".join(parts)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fidelity", help="dtype fidelity and in-process rate of our torch backend")
    f.add_argument("--model", type=Path, required=True)
    add_corpus_argument(f)
    f.add_argument("--device", default="cuda")
    f.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    f.add_argument("--texts", type=int, default=128, help="half queries, half passages")
    f.add_argument(
        "--throughput-texts", type=int, default=1024, help="passages per in-process round (0: skip)"
    )
    f.add_argument("--out", type=Path, default=None)
    f.add_argument("--markdown", type=Path, default=None)
    s = sub.add_parser("summary", help="one markdown page from the fidelity and vs_infinity reports")
    s.add_argument("--fidelity", type=Path, default=None)
    s.add_argument("--http", type=Path, default=None)
    s.add_argument("--pair", action="append", default=[], help="OURS=THEIRS side names to compare")
    s.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "fidelity" and "float32" not in args.dtypes:
        args.dtypes.insert(0, "float32")
    sys.exit(fidelity(args) if args.command == "fidelity" else summary(args))


if __name__ == "__main__":
    main()
