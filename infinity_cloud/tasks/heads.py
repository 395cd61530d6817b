"""Per-batch heads: backend output to one row per input (each task picks its own)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from infinity_cloud.model_files import DenseLayer
from infinity_cloud.tasks.pooling import apply_dense, l2_normalize, pool

# (backend output, attention mask) -> (batch, ...) rows
Head = Callable[[np.ndarray, np.ndarray], np.ndarray]


def embedding_head(pooling: str, dense: Sequence[DenseLayer], normalize: bool) -> Head:
    def head(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
        vectors = apply_dense(pool(states, mask, pooling), dense)
        return l2_normalize(vectors) if normalize else vectors

    return head


def logits_head(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Scoring models already return (batch, labels) logits; scores depend on the request."""
    return states.astype(np.float32, copy=False)
