#!/usr/bin/env bash
# One short GPU check, run from the repository root on the lent GPU machine, results in $OUT:
#   1. fidelity: our torch backend in float16 and bfloat16 against float32 (in-process Engine,
#      ~128 corpus texts), our float32 against sentence-transformers float32 (benchmarks/gpu_check.py);
#   2. HTTP: our server (torch, float16 and bfloat16) beside Infinity's torch engine (float16 and
#      its default dtype), interleaved, at c32 x 32 passages and c1 x 1 query (benchmarks/vs_infinity.py);
#   3. a summary page.
#
# Needs, carried beside the working tree: .whl (cp312 wheels: fastapi, pydantic, uvicorn, orjson, ...,
# installed into /tmp/site) and .gpu (model/ = all-MiniLM-L6-v2 with float16-stored weights,
# corpus.jsonl, infsite.tar.xz = Infinity 0.0.78 with transformers 4.57 and sentence-transformers
# 3.4 for its own PYTHONPATH, since Infinity 0.0.78 fails on transformers 5).
#
# Device:   bash benchmarks/gpu_check.sh
# CPU test: GPU_CHECK_DEVICE=cpu GPU_CHECK_PY=/path/venv/bin/python GPU_CHECK_WHEELS=/path/wheels-cp311 \
#           GPU_CHECK_CONCURRENCY=4 GPU_CHECK_PER_REQUEST=8 GPU_CHECK_SECONDS=1 OUT=/tmp/o bash benchmarks/gpu_check.sh
set -uo pipefail

OUT=${OUT:-$PWD/gpu_check_out}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=$(command -v "${GPU_CHECK_PY:-python3}")
WHEELS=${GPU_CHECK_WHEELS:-.whl}
SITE=${GPU_CHECK_SITE:-/tmp/site}
INFSITE=${GPU_CHECK_INFSITE:-/tmp/infsite}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
SECONDS_PER_CELL=${GPU_CHECK_SECONDS:-6}
ROUNDS=${GPU_CHECK_ROUNDS:-1}
WARMUP=${GPU_CHECK_WARMUP:-2}
CONCURRENCY=${GPU_CHECK_CONCURRENCY:-32}
PER_REQUEST=${GPU_CHECK_PER_REQUEST:-32}
THROUGHPUT_TEXTS=${GPU_CHECK_THROUGHPUT_TEXTS:-1024}
FID_TEXTS=${GPU_CHECK_FID_TEXTS:-128}
FID_TIMEOUT=${GPU_CHECK_FID_TIMEOUT:-90}
HTTP_TIMEOUT=${GPU_CHECK_HTTP_TIMEOUT:-240}
STARTUP_TIMEOUT=${GPU_CHECK_STARTUP_TIMEOUT:-90}
MODEL=$PWD/.gpu/model
CORPUS=$PWD/.gpu/corpus.jsonl

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 \
    INFINITY_ANONYMOUS_USAGE_STATS=0 INFINITY_CLOUD_CACHE=$WORK/cache
mkdir -p "$OUT" "$WORK/bin" "$WORK/cache"
T0=$(date +%s)
stamp() { echo "=== [$(($(date +%s) - T0)) s] $*"; }

main() {
    stamp "gpu_check on $(uname -n), device $DEVICE, python $PY, out $OUT"
    du -sh .gpu .whl "$WHEELS" 2>/dev/null | sort -u
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm \
        --format=csv

    stamp "install wheels into $SITE, Infinity's site into $INFSITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || { echo "wheel install failed"; return 1; }
    # Our package as pip installs it (targets/ and templates/ map into infinity_cloud/), from
    # this tree, with the machine's own setuptools.
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --target "$WORK/ours" . || {
        echo "WARNING: pip could not install our package; laying it out by hand"
        rm -rf "$WORK/ours" && mkdir -p "$WORK/ours" && cp -r infinity_cloud "$WORK/ours/" &&
            cp -r targets templates "$WORK/ours/infinity_cloud/" || return 1
    }
    export PYTHONPATH=$SITE:$WORK/ours
    rm -rf "$INFSITE" && mkdir -p "$INFSITE"
    tar -xJf .gpu/infsite.tar.xz -C "$INFSITE" 2>/dev/null || "$PY" -c "import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))" \
        .gpu/infsite.tar.xz "$INFSITE" || { echo "infsite unpack failed"; return 1; }
    # Our CLI (vs_infinity.py looks for `infinity-cloud` next to sys.executable, then on PATH),
    # and Infinity's Python: the same interpreter, its own transformers 4 / sentence-transformers 3 first.
    # -P: not the source tree in the working folder (its targets/ are not inside the package).
    printf '#!/bin/sh\nexec "%s" -P -m infinity_cloud "$@"\n' "$PY" >"$WORK/bin/infinity-cloud"
    printf '#!/bin/sh\nPYTHONPATH="%s:%s" exec "%s" "$@"\n' "$INFSITE" "$SITE" "$PY" >"$WORK/bin/infinity-python"
    chmod +x "$WORK/bin/infinity-cloud" "$WORK/bin/infinity-python"
    export PATH=$WORK/bin:$PATH

    stamp "versions"
    "$PY" -c "import torch, transformers, sentence_transformers, fastapi, pydantic, uvicorn, infinity_cloud
print('ours: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__,
      'st', sentence_transformers.__version__, 'fastapi', fastapi.__version__, 'pydantic', pydantic.__version__,
      'uvicorn', uvicorn.__version__)" || { echo "our side does not import"; return 1; }
    "$WORK/bin/infinity-python" -c "import torch, transformers, sentence_transformers, numpy, infinity_emb
print('infinity: torch', torch.__version__, 'transformers', transformers.__version__, 'st',
      sentence_transformers.__version__, 'numpy', numpy.__version__, 'infinity_emb', infinity_emb.__version__)" \
        || echo "WARNING: Infinity's side does not import"
    "$WORK/bin/infinity-cloud" serve --help >/dev/null || echo "WARNING: our CLI does not start"

    stamp "fidelity (timeout ${FID_TIMEOUT} s)"
    timeout -k 10 "$FID_TIMEOUT" "$PY" benchmarks/gpu_check.py fidelity --model "$MODEL" --corpus "$CORPUS" \
        --device "$DEVICE" --dtypes float16 bfloat16 float32 --texts "$FID_TEXTS" --throughput-texts "$THROUGHPUT_TEXTS" \
        --out "$OUT/fidelity.json" --markdown "$OUT/fidelity.md"
    echo "fidelity exit code $?"

    stamp "HTTP: ours vs Infinity (timeout ${HTTP_TIMEOUT} s)"
    mkdir -p "$WORK/tmp"
    TMPDIR=$WORK/tmp timeout -k 20 "$HTTP_TIMEOUT" "$PY" benchmarks/vs_infinity.py \
        --corpus "$CORPUS" --model "$MODEL" --infinity-python "$WORK/bin/infinity-python" \
        --sides "ours-fp16:--backend torch --device $DEVICE --dtype float16" \
                "infinity-fp16:--engine torch --device $DEVICE --dtype float16" \
                "ours-bf16:--backend torch --device $DEVICE --dtype bfloat16" \
                "infinity-default:--engine torch --device $DEVICE" \
                "ours-fp32:--backend torch --device $DEVICE --dtype float32" \
        --concurrency "$CONCURRENCY" --per-request "$PER_REQUEST" --seconds "$SECONDS_PER_CELL" \
        --rounds "$ROUNDS" --warmup-seconds "$WARMUP" --startup-timeout "$STARTUP_TIMEOUT" \
        --no-in-process --keep-logs --out "$OUT/vs_infinity.json" --markdown "$OUT/vs_infinity.md"
    echo "vs_infinity exit code $?"
    tar -czf "$OUT/server_logs.tar.gz" -C "$WORK" tmp 2>/dev/null

    stamp "summary"
    "$PY" benchmarks/gpu_check.py summary --fidelity "$OUT/fidelity.json" --http "$OUT/vs_infinity.json" \
        --pair ours-fp16=infinity-fp16 --pair ours-bf16=infinity-default --pair ours-fp16=infinity-default --pair ours-fp32=infinity-default \
        --markdown "$OUT/summary.md"
    stamp "done"
}

main 2>&1 | tee "$OUT/gpu_check.log"
