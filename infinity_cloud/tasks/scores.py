"""Logits to scores: activations, label ranking, top-n ordering."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so large magnitudes never overflow exp().
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def rank(scores: Sequence[float] | np.ndarray, top_n: int | None) -> list[int]:
    """Indices by score, highest first; a stable sort keeps input order among equal scores."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    if top_n:
        order = order[:top_n]
    return [int(i) for i in order]


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray]) -> np.ndarray:
    """Late interaction (ColBERT, ColPali): for each document, the sum over the query's vectors
    of each one's best dot product with the document's vectors."""
    return np.array([float((query @ d.T).max(axis=1).sum()) for d in documents])


def label_scores(row: np.ndarray, labels: Sequence[str]) -> list[tuple[str, float]]:
    """One input's (label, score) pairs, highest score first."""
    return [(labels[i], float(row[i])) for i in rank(row, None)]
