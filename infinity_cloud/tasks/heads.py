"""Per-batch heads: backend output to one row per input (each task picks its own)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infinity_cloud.backends.base import Head
from infinity_cloud.model_files import DenseLayer
from infinity_cloud.tasks.pooling import apply_dense, l2_normalize, pool


def embedding_head(pooling: str, dense: Sequence[DenseLayer], normalize: bool) -> Head:
    def head(states: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        assert mask is not None, "token states come with their mask"
        vectors = apply_dense(pool(states, mask, pooling), dense)
        return l2_normalize(vectors) if normalize else vectors

    return head


def token_head(dense: Sequence[DenseLayer], normalize: bool) -> Head:
    """Token states through the Dense layers (and normalised) token by token: ColBERT's vectors.
    Padding comes out as it went in; rows are cut to their inputs afterwards."""

    def head(states: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        vectors = apply_dense(states.astype(np.float32, copy=False), dense)
        return l2_normalize(vectors) if normalize else vectors

    return head


def pooled_head(normalize: bool) -> Head:
    """Graphs that pool inside (CLIP's towers): their vectors, normalised if the model does."""

    def head(vectors: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        vectors = vectors.astype(np.float32, copy=False)
        return l2_normalize(vectors) if normalize else vectors

    return head


def passthrough_head(output: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Graphs whose output is final per batch: scoring models' (batch, labels) logits (scores
    depend on the request), SPLADE's (batch, vocabulary) term weights."""
    return output.astype(np.float32, copy=False)
