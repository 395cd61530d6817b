"""Is a reduced-precision model faithful to float32? Checked at load on a few fixed texts.

`dtype auto` may pick bfloat16 (AMX CPUs) or float16 (GPUs) for speed; the engine runs these
probes through both precisions and keeps the fast one only when every output agrees. A
precision asked for by name (int8 included) is measured the same way and reported.
"""

from __future__ import annotations

import numpy as np

# The worst cosine to float32 a precision may show on the probes: bfloat16/float16 keep a
# model's answers at 0.999. int8 is built to hold 0.99 on held-out texts (`onnx_int8` keeps
# the layers that lose most in float32); where a backend's int8 cannot (CTranslate2's, whose
# layers are all quantised, on CPUs without VNNI), it is only warned about, as int8 is only
# ever asked for by name.
MIN_AGREEMENT = {"bfloat16": 0.999, "float16": 0.999, "int8": 0.99}
# What int8 is built with: this many batches of standard-library docstrings, so many rows each.
CALIBRATION_BATCHES = 8
CALIBRATION_ROWS = 16
# Static int8 (OpenVINO's) also collects activation ranges, on this many more batches of other
# docstrings: on all-MiniLM-L6-v2, ranges from 32 texts held 0.989 on the held-out ones, from
# 96 texts 0.993.
STATISTICS_BATCHES = 6

# Fixed texts each task turns into its inputs (a reranker pairs the first with the rest).
PROBES = (
    "What is the capital of France?",
    "Paris is the capital and most populous city of France, on the Seine.",
    "how do i reset my router password",
    "The mitochondria is the powerhouse of the cell; it produces ATP through respiration.",
    "Quarterly revenue rose 12% year over year, driven by cloud services and advertising.",
    "Der schnelle braune Fuchs springt über den faulen Hund. 東京は日本の首都です。 🚀",
    "def add(a, b):\n    return a + b  # adds two numbers",
    " ".join(["Long inputs exercise positions far from the start of the sequence."] * 12),
)


def agreement(candidate: np.ndarray, reference: np.ndarray) -> float:
    """Worst row cosine for embeddings; for logits, the cosine of the centred score columns
    (a scalar reranker score has no direction of its own, its ranking across inputs does).
    Per-token outputs (batch, length, width) count each real token's vector (padding is zero)."""
    if reference.ndim == 3:
        real = np.linalg.norm(reference, axis=-1) > 0
        candidate, reference = candidate[real], reference[real]
    if reference.ndim == 2 and reference.shape[1] > 1 and candidate.shape == reference.shape:
        a, b = candidate, reference
    else:
        a = (candidate - candidate.mean(axis=0)).reshape(1, -1)
        b = (reference - reference.mean(axis=0)).reshape(1, -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosines = (a * b).sum(axis=1) / np.maximum(norms, 1e-12)
    return float(cosines.min())
