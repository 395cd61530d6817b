"""Is a reduced-precision model faithful to float32? Checked at load on a few fixed texts.

`dtype auto` may pick bfloat16 (AMX CPUs) or float16 (GPUs) for speed; the engine runs these
probes through both precisions and keeps the fast one only when every output agrees. A
precision asked for by name (int8 included) is measured the same way and reported.

What "agrees" means is the task's (`Check`): an embedder's vectors keep their directions (the
worst cosine, `agreement`); a scorer's (reranker, classifier) answer is an order and its
scores, so the probes' order must stay the same and no score may move by more than
MAX_SCORE_DIFFERENCE (a cosine let a BERT cross-encoder through at 0.99978 whose worst logit
moved by 0.93 and whose order of 10 documents changed).
"""

from __future__ import annotations

from typing import Literal

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

# How a task's outputs are compared: "cosine" (embeddings, token vectors, sparse weights) or
# "scores" (rerank and classify logits: order and worst difference).
Check = Literal["cosine", "scores"]
# The most a scorer's logit may move from float32's (on a logit of about 1, bfloat16's own
# rounding is 0.004; a sigmoid moves by at most a quarter of it).
MAX_SCORE_DIFFERENCE = {"bfloat16": 0.1, "float16": 0.1, "int8": 0.25}
# The scorer's probe that is cut at the model's limit is at most this many tokens long (a
# model of 8192 would pad every probe to it, and eager attention on 8 x 8192 does not fit).
TRUNCATED_PROBE_TOKENS = 1024

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


def truncated_probe(tokens: int) -> str:
    """A text of more than `tokens` tokens in any tokenizer (no probe word is over 13
    characters), so what a scorer is checked on includes an input cut at its limit."""
    sentence = " ".join(PROBES[1:5])
    return " ".join([sentence] * (14 * tokens // len(sentence) + 1))


def measure(check: Check, candidate: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """What a reduced precision's outputs on the probes (`candidate`) keep of float32's: the
    agreement (a cosine), and for scores the worst absolute difference and how many pairs of
    probes (or, for several labels, of a row's labels) are in another order."""
    measured = {"agreement": agreement(candidate, reference)}
    if check == "scores":
        measured["worst_score_difference"] = float(np.abs(candidate - reference).max())
        measured["order_changes"] = float(order_changes(candidate, reference))
    return measured


def order_changes(candidate: np.ndarray, reference: np.ndarray) -> int:
    """Pairs that float32 orders and `candidate` does not (swapped or tied): each score
    column's order of the inputs (a reranker's ranking), and with several columns each row's
    order of its labels (a classifier's answer)."""
    reference, candidate = reference.reshape(len(reference), -1), candidate.reshape(len(reference), -1)

    def discordant(ref: np.ndarray, cand: np.ndarray) -> int:  # over axis 0, per column
        ahead = ref[:, None, :] - ref[None, :, :]
        # float32's own near-ties (the same text twice) order nothing
        tie = 1e-6 * max(1.0, float(np.abs(ref).max(initial=0.0)))
        return int(((ahead > tie) & (cand[:, None, :] - cand[None, :, :] <= 0)).sum())

    labels = discordant(reference.T, candidate.T) if reference.shape[1] > 1 else 0
    return discordant(reference, candidate) + labels


def shortfall(measured: dict[str, float], dtype: str, floor: float) -> str | None:
    """Why `measured` (`measure`) falls short of what `dtype` must keep, in words; None where
    it holds. `floor`: the worst cosine an embedder's precision may show."""
    if "order_changes" in measured:
        worst, bound = measured["worst_score_difference"], MAX_SCORE_DIFFERENCE.get(dtype, 0.0)
        if swapped := measured["order_changes"]:
            return (f"it changes the order of the scores on the check's pairs ({swapped:.0f} pairs "
                    f"swapped; worst score difference {worst:.4f})")
        if worst > bound:
            return f"its worst score difference on the check's pairs is {worst:.4f} (> {bound})"
        return None
    if measured["agreement"] < floor:
        return f"its worst cosine on the probes is {measured['agreement']:.5f} (< {floor})"
    return None
