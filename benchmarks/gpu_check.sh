#!/usr/bin/env bash
# One short GPU check (issue 22), run from the repository root on the lent GPU machine, results in $OUT;
# the whole run keeps to GPU_CHECK_BUDGET seconds (default 450, i.e. 7.5 minutes, wheel installs and
# server start-ups included: every phase gets a timeout from what is left, and the summary always runs):
#   0. installs the carried wheels (.whl) and our package into /tmp, unpacks Infinity's site (.gpu);
#   1. builds two random-weight encoders on the machine (benchmarks/random_encoders.py, fixed seed, no hub):
#      bert-base (bge-base-en-v1.5's shapes, mean pooling) and xlmr-large (bge-m3's shapes, CLS pooling),
#      both capped at 512 tokens, with the carried MiniLM tokenizer (.gpu/model: BERT uncased WordPiece);
#   2. in-process, for both models (benchmarks/gpu_check.py fidelity): our torch backend in float32,
#      float16 and bfloat16, one engine after the other: cosine of each reduced precision to our float32
#      and of each to sentence-transformers float32 (worst, mean, centred), real tokens/s at 32 x 32
#      passages, GPU memory after load and at peak (torch.cuda.max_memory_allocated);
#   3. HTTP on xlmr-large only (benchmarks/vs_infinity.py, interleaved, one round): ours --dtype auto /
#      float16 / float32 beside Infinity's torch engine in float16 and in its default dtype, cells
#      c32 x 32 passages (throughput, p50/p99), c1 x 1 query and c1 x 1 passage (p50). Both models'
#      HTTP sides would need ten server start-ups and twice the cells: more than the budget holds, and the
#      issue's goals are for the large model;
#   4. summary.md: the goals, one line each ("goal met" / "goal missed" / "no data"), and the tables.
#   5. data parallel (benchmarks/gpu_check.py replicas) on the HTTP model, on a machine with several GPUs
#      (135 s kept for it): in process, one GPU against a replica on every GPU (one GPU: skipped, said so).
# $OUT gets 8 files (the device tool returns 8 at most): summary.md, fidelity.json, vs_infinity.json,
# vs_infinity.md, replicas.json, gpu_check.log, phases.txt (seconds since start at each phase),
# server_logs.tar.gz.
#
# Needs, carried beside the working tree (built by benchmarks/gpu_check_prepare.sh on a networked
# machine): .whl (cp312 wheels: fastapi, pydantic, uvicorn, orjson, ..., installed into /tmp/site) and
# .gpu (model/ = all-MiniLM-L6-v2's tokenizer files, corpus.jsonl, infsite.tar.xz = Infinity 0.0.78
# with transformers 4.57 and sentence-transformers 3.4 for its own PYTHONPATH, since Infinity 0.0.78
# fails on transformers 5). The large models are not carried: step 1 builds them (about 2.7 GB).
#
# Device:   bash benchmarks/gpu_check.sh
# CPU test (tiny models, a few minutes on 2 cores; our venv has our deps, so no wheels; Infinity
# from its own venv instead of the carried site):
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_TINY=1 GPU_CHECK_PY=.venv/bin/python GPU_CHECK_WHEELS=none \
#   GPU_CHECK_INFINITY_PY=/work/infinity-venv/bin/python GPU_CHECK_CONCURRENCY=4 GPU_CHECK_PER_REQUEST=8 \
#   GPU_CHECK_SECONDS=1 GPU_CHECK_WARMUP=1 GPU_CHECK_FID_TEXTS=32 GPU_CHECK_THROUGHPUT_TEXTS=128 \
#   OUT=/tmp/o bash benchmarks/gpu_check.sh
set -uo pipefail

OUT=${OUT:-$PWD/gpu_check_out}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=$(command -v "${GPU_CHECK_PY:-python3}")
WHEELS=${GPU_CHECK_WHEELS:-.whl}               # "none": the Python already has our server's deps
INFINITY_PY=${GPU_CHECK_INFINITY_PY:-}         # an Infinity venv's python instead of the carried site
SITE=${GPU_CHECK_SITE:-/tmp/site}
INFSITE=${GPU_CHECK_INFSITE:-/tmp/infsite}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
TINY=${GPU_CHECK_TINY:-}
BUDGET=${GPU_CHECK_BUDGET:-450}
SECONDS_PER_CELL=${GPU_CHECK_SECONDS:-4}
ROUNDS=${GPU_CHECK_ROUNDS:-1}
WARMUP=${GPU_CHECK_WARMUP:-2}
CONCURRENCY=${GPU_CHECK_CONCURRENCY:-32}
PER_REQUEST=${GPU_CHECK_PER_REQUEST:-32}
THROUGHPUT_TEXTS=${GPU_CHECK_THROUGHPUT_TEXTS:-1024}
FID_TEXTS=${GPU_CHECK_FID_TEXTS:-128}
FID_DTYPES=${GPU_CHECK_FID_DTYPES:-float32 float16 bfloat16}
FID_CAP=${GPU_CHECK_FID_TIMEOUT:-150}
HTTP_MIN=${GPU_CHECK_HTTP_MIN:-200}            # what the fidelity phase leaves to HTTP at least
HTTP_MODEL=${GPU_CHECK_HTTP_MODEL:-xlmr-large}
STARTUP_TIMEOUT=${GPU_CHECK_STARTUP_TIMEOUT:-120}
TOKENIZER=$PWD/.gpu/model
CORPUS=$PWD/.gpu/corpus.jsonl
MODELS=$WORK/models

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 \
    INFINITY_ANONYMOUS_USAGE_STATS=0 INFINITY_CLOUD_CACHE=$WORK/cache
mkdir -p "$OUT" "$WORK/bin" "$WORK/cache"
T0=$(date +%s)
stamp() { echo "=== [$(($(date +%s) - T0)) s] $*"; echo "$(($(date +%s) - T0)) $*" >>"$OUT/phases.txt"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
cap() {  # CAP RESERVE: CAP seconds, or what is left of the budget less RESERVE if that is less (>= 10)
    local t=$(($(left) - $2))
    ((t > $1)) && t=$1
    ((t < 10)) && t=10
    echo "$t"
}

setup() {
    if [[ $WHEELS != none ]]; then
        stamp "install wheels into $SITE"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            "$WHEELS"/*.whl || { echo "wheel install failed"; return 1; }
    fi
    # Our package as pip installs it (targets/ and templates/ map into infinity_cloud/), from this
    # tree, with the machine's own setuptools.
    stamp "install our package into $WORK/ours"
    rm -rf "$WORK/ours"
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --target "$WORK/ours" . >"$WORK/pip_ours.log" 2>&1 || {
        tail -20 "$WORK/pip_ours.log"
        echo "WARNING: pip could not install our package; laying it out by hand"
        rm -rf "$WORK/ours" && mkdir -p "$WORK/ours" && cp -r infinity_cloud "$WORK/ours/" &&
            cp -r targets templates "$WORK/ours/infinity_cloud/" || return 1
    }
    export PYTHONPATH=$SITE:$WORK/ours
    # Our CLI (vs_infinity.py looks for `infinity-cloud` next to sys.executable, then on PATH), and
    # Infinity's Python. -P: not the source tree in the working folder (its targets/ are not inside the
    # package).
    printf '#!/bin/sh\nexec "%s" -P -m infinity_cloud "$@"\n' "$PY" >"$WORK/bin/infinity-cloud"
    if [[ -n $INFINITY_PY ]]; then
        printf '#!/bin/sh\nunset PYTHONPATH\nexec "%s" "$@"\n' "$INFINITY_PY" >"$WORK/bin/infinity-python"
    else
        stamp "unpack Infinity's site into $INFSITE"
        rm -rf "$INFSITE" && mkdir -p "$INFSITE"
        tar -xJf .gpu/infsite.tar.xz -C "$INFSITE" 2>/dev/null || "$PY" -c "import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))" \
            .gpu/infsite.tar.xz "$INFSITE" || { echo "infsite unpack failed"; return 1; }
        # The same interpreter, its own transformers 4 / sentence-transformers 3 first.
        printf '#!/bin/sh\nPYTHONPATH="%s:%s" exec "%s" "$@"\n' "$INFSITE" "$SITE" "$PY" >"$WORK/bin/infinity-python"
    fi
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
}

main() {
    stamp "gpu_check on $(uname -n), device $DEVICE, python $PY, out $OUT, budget $BUDGET s${TINY:+, TINY models}"
    du -sh .gpu .whl 2>/dev/null
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm \
        --format=csv
    setup || return 1

    local t
    t=$(cap 120 60)
    stamp "build the random-weight models into $MODELS (timeout $t s)"
    timeout -k 10 "$t" "$PY" benchmarks/random_encoders.py --out "$MODELS" --tokenizer "$TOKENIZER" \
        ${TINY:+--tiny} | tee "$WORK/models.jsonl"
    local code=${PIPESTATUS[0]}
    echo "random_encoders exit code $code"
    ((code == 0)) || return 1
    du -sh "$MODELS"/*

    t=$(cap "$FID_CAP" $((HTTP_MIN + 15)))
    stamp "in-process: fidelity, throughput, GPU memory, both models (timeout $t s)"
    # shellcheck disable=SC2086  # FID_DTYPES is a list
    timeout -k 10 "$t" "$PY" benchmarks/gpu_check.py fidelity \
        --model "bert-base=$MODELS/bert-base" --model "xlmr-large=$MODELS/xlmr-large" \
        --corpus "$CORPUS" --device "$DEVICE" --dtypes $FID_DTYPES --texts "$FID_TEXTS" \
        --throughput-texts "$THROUGHPUT_TEXTS" --out "$OUT/fidelity.json" --markdown "$WORK/fidelity.md"
    echo "fidelity exit code $?"

    # Several GPUs: time is kept for the data-parallel phase after HTTP; one GPU has nothing to spread over.
    local gpus=1
    command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L | grep -c '^GPU')
    [[ $DEVICE == cpu ]] && gpus=2
    t=$(cap 600 $((gpus > 1 ? 135 : 15)))
    stamp "HTTP on $HTTP_MODEL: ours vs Infinity (timeout $t s)"
    mkdir -p "$WORK/tmp"
    local ours_flags="--backend torch --device $DEVICE --deadline-s 86400"  # nothing shed, as Infinity
    TMPDIR=$WORK/tmp timeout -k 30 "$t" "$PY" benchmarks/vs_infinity.py \
        --corpus "$CORPUS" --model "$MODELS/$HTTP_MODEL" --infinity-python "$WORK/bin/infinity-python" \
        --sides "ours-auto:$ours_flags --dtype auto" \
                "infinity-fp16:--engine torch --device $DEVICE --dtype float16" \
                "ours-fp16:$ours_flags --dtype float16" \
                "infinity-default:--engine torch --device $DEVICE" \
                "ours-fp32:$ours_flags --dtype float32" \
        --cells "${CONCURRENCY}x${PER_REQUEST}:passage" 1x1:query 1x1:passage \
        --seconds "$SECONDS_PER_CELL" --rounds "$ROUNDS" --warmup-seconds "$WARMUP" \
        --startup-timeout "$STARTUP_TIMEOUT" --time-budget $((t - 45)) --reference-device "$DEVICE" \
        --no-roofline --no-in-process --keep-logs --out "$OUT/vs_infinity.json" --markdown "$OUT/vs_infinity.md"
    echo "vs_infinity exit code $?"

    if ((gpus > 1)); then
        t=$(cap 240 0)
        stamp "data parallel on $HTTP_MODEL: one device against all $gpus (timeout $t s)"
        timeout -k 10 "$t" "$PY" benchmarks/gpu_check.py replicas --model "$MODELS/$HTTP_MODEL" \
            --corpus "$CORPUS" --device "$DEVICE" --throughput-texts "$THROUGHPUT_TEXTS" --out "$OUT/replicas.json"
        echo "replicas exit code $?"
    else
        echo "{\"note\": \"one GPU: no data-parallel side to measure\"}" >"$OUT/replicas.json"
    fi
    tar -czf "$OUT/server_logs.tar.gz" -C "$WORK" tmp 2>/dev/null
}

main 2>&1 | tee "$OUT/gpu_check.log"
# The summary whatever happened above (from what the reports hold).
{
    stamp "summary"
    PYTHONPATH=$SITE:$WORK/ours "$PY" benchmarks/gpu_check.py summary --fidelity "$OUT/fidelity.json" \
        --http "$OUT/vs_infinity.json" --http-model "$HTTP_MODEL" --large xlmr-large --goal-side ours-auto \
        --pair ours-auto=infinity-fp16 --pair ours-fp16=infinity-fp16 --pair ours-auto=infinity-default \
        --pair ours-fp32=infinity-default --markdown "$OUT/summary.md" >/dev/null &&
        sed -n '/^## Goals/,/^## In-process/p' "$OUT/summary.md"
    stamp "done"
} 2>&1 | tee -a "$OUT/gpu_check.log"
