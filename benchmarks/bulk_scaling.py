"""`infinity-cloud embed` at scale, on this machine (issue 37's measurements):

- **memory**: peak RSS of the local runner over generated corpora of growing size (by
  default 100,000 and 1,000,000 rows): the input is streamed and the output written shard by
  shard, so the peak must not grow with the row count;
- **ray**: the Ray runner with 1 and 2 actors on the same corpus (texts/s), and the cost of a
  resume: a run SIGKILLed part-way, then started again, against one that was not.

Each run is `infinity-cloud embed` as a user starts it, in its own process (its peak RSS
and that of its children from wait4, so Ray's actors count). Prints a table and writes JSON:

    python benchmarks/bulk_scaling.py --out benchmarks/results/minilm-bulk-scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORDS = ["index", "shard", "vector", "query", "passage", "model", "token", "batch", "cluster",
    "replica", "cache", "latency", "throughput", "corpus", "embedding", "retrieval", "ranking",
    "search", "memory", "disk", "network", "stream"]


def corpus(path: Path, rows: int, seed: int = 37) -> Path:
    """JSON Lines of `rows` generated passages of 4 to 24 words, written as a stream."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for i in range(rows):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))
            out.write(json.dumps({"id": f"r{i}", "text": f"{i} {words}"}) + "\n")
    return path


def run(args: list[str], kill_after_s: float | None = None) -> dict[str, Any]:
    """`infinity-cloud embed ARGS`: its wall time, exit status and peak RSS (the kernel's, for
    the runner's process: the local runner's engine runs in it)."""
    command = [sys.executable, "-m", "infinity_cloud", "embed", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    if kill_after_s is not None:
        try:
            process.wait(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the runner and every worker it started
    _, status, usage = os.wait4(process.pid, 0)
    output = process.stdout.read().decode("utf-8", "replace") if process.stdout else ""
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 2), "status": os.waitstatus_to_exitcode(status),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "tail": output[-600:]}


def rows_written(out: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in out.rglob("*.parquet"))


def memory(model: str, sizes: list[int], work: Path) -> list[dict[str, Any]]:
    # A first, small run builds the model's exports (torch loaded, a peak of its own): each
    # measured run then starts as a user's second run does.
    warm = run([str(corpus(work / "warm.jsonl", 1000)), "--out", str(work / "warm"), "--model-id", model])
    assert warm["status"] == 0, warm["tail"]
    results = []
    for rows in sizes:
        source = corpus(work / f"corpus-{rows}.jsonl", rows)
        out = work / f"out-{rows}"
        shutil.rmtree(out, ignore_errors=True)
        result = run([str(source), "--out", str(out), "--model-id", model])
        assert result["status"] == 0, result["tail"]
        written = rows_written(out)
        assert written == rows, (written, rows)
        results.append({"rows": rows, "texts_per_s": round(rows / result["seconds"], 1), **result,
                        "rows_written": written})
        print(f"memory  {rows:>9,} rows  {result['seconds']:8.1f} s  "
              f"peak RSS {result['peak_rss_mb']:7.1f} MB", flush=True)
        source.unlink()
        shutil.rmtree(out)
    return results


def ray(model: str, rows: int, work: Path, kill_at: float) -> dict[str, Any]:
    source = corpus(work / "ray-corpus.jsonl", rows)
    found: dict[str, Any] = {"rows": rows}
    for actors in (1, 2):
        out = work / f"ray-{actors}"
        result = run([str(source), "--out", str(out), "--model-id", model, "--runner", "ray",
                      "--actors", str(actors)])
        assert result["status"] == 0, result["tail"]
        assert rows_written(out) == rows
        found[f"actors_{actors}"] = {"texts_per_s": round(rows / result["seconds"], 1), **result}
        print(f"ray     {actors} actor(s)  {result['seconds']:8.1f} s  "
              f"{rows / result['seconds']:8.1f} texts/s", flush=True)
        if actors == 2:
            whole = result["seconds"]
    # A resume: SIGKILL part-way through a 2-actor run, then the same command again.
    out = work / "ray-resumed"
    args = [str(source), "--out", str(out), "--model-id", model, "--runner", "ray", "--actors", "2"]
    killed = run(args, kill_after_s=whole * kill_at)
    done_before = rows_written(out)
    resumed = run(args)
    assert resumed["status"] == 0, resumed["tail"]
    assert rows_written(out) == rows, "every row exactly once after the resume"
    found["resume"] = {"killed_after_s": killed["seconds"], "rows_before_resume": done_before,
                       "resume_s": resumed["seconds"], "killed_plus_resume_s": round(killed["seconds"]
                                                                                    + resumed["seconds"], 2),
                       "uninterrupted_s": whole}
    print(f"resume  killed at {killed['seconds']:.1f} s with {done_before:,} rows written; the rerun took "
          f"{resumed['seconds']:.1f} s (uninterrupted: {whole:.1f} s)", flush=True)
    return found


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-id", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--sizes", default="100000,1000000", help="rows of each memory run")
    parser.add_argument("--ray-rows", type=int, default=20000)
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of the 2-actor run's time")
    parser.add_argument("--skip", choices=["memory", "ray"], action="append", default=[])
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bulk-scaling-") as tmp:
        work = Path(tmp)
        report: dict[str, Any] = {
            "model": options.model_id, "cpu": cpu_name(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
        }
        if "memory" not in options.skip:
            report["memory"] = memory(options.model_id, [int(s) for s in options.sizes.split(",")], work)
        if "ray" not in options.skip:
            report["ray"] = ray(options.model_id, options.ray_rows, work, options.kill_at)
    if options.out:
        options.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
