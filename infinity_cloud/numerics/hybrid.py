"""bge-m3's three outputs from one pass (FlagEmbedding's BGEM3FlagModel), as its graph packs
them and the engine reads them back: one (batch, length, 1 + width) array, so every backend
runs one graph and returns one tensor.

- column 0 of position t: its sparse weight, relu(sparse_linear(state_t)), zero where masked;
- columns 1: of position 0: the CLS state, the dense vector before it is normalised;
- columns 1: of position t >= 1: normalize(colbert_linear(state_t)), zero where masked.

`pack` is the graph's (torch); the rest reads one input's rows on the host (numpy).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from infinity_cloud.core.results import SparseVector

SPARSE_HEAD = "sparse_linear.pt"  # FlagEmbedding's Linear(hidden, 1)
COLBERT_HEAD = "colbert_linear.pt"  # FlagEmbedding's Linear(hidden, colbert width)
HEAD_FILES = (SPARSE_HEAD, COLBERT_HEAD)


def pack(states: Any, mask: Any, sparse: tuple[Any, Any], colbert: tuple[Any, Any]) -> Any:
    """Token states (batch, length, hidden) and their mask through the two heads (each a
    Linear's weight and bias, torch tensors), packed as above."""
    import torch
    from torch.nn.functional import linear, normalize

    keep = mask.unsqueeze(-1).to(states.dtype)
    weights = torch.relu(linear(states, *sparse)) * keep
    vectors = normalize(linear(states[:, 1:], *colbert) * keep[:, 1:], dim=-1)
    return torch.cat([weights, torch.cat([states[:, :1], vectors], dim=1)], dim=-1)


def dense(row: np.ndarray) -> np.ndarray:
    """One input's dense vector (its CLS state, before normalising)."""
    return row[0, 1:]


def multi_vector(row: np.ndarray) -> np.ndarray:
    """One input's ColBERT vectors: a vector per token after CLS (its last special token
    included, as FlagEmbedding keeps it)."""
    return np.ascontiguousarray(row[1:, 1:])


def sparse(row: np.ndarray, ids: Sequence[int], unused: Collection[int]) -> SparseVector:
    """One input's lexical weights: each token id's largest weight, the model's CLS, EOS, pad
    and unknown tokens left out (FlagEmbedding's `_process_token_weights`)."""
    ids_array = np.asarray(ids, dtype=np.int64)
    weights = row[: len(ids_array), 0].astype(np.float32)
    keep = (weights > 0) & ~np.isin(ids_array, list(unused))
    ids_array, weights = ids_array[keep], weights[keep]
    terms = np.unique(ids_array)
    best = np.zeros(len(terms), dtype=np.float32)
    np.maximum.at(best, np.searchsorted(terms, ids_array), weights)
    return SparseVector(terms, best)
