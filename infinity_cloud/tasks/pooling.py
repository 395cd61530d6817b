"""Token states to one vector per input: pooling, Dense heads, normalisation, Matryoshka."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from infinity_cloud.model_files import DenseLayer


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """(batch, length, width) token states and a (batch, length) mask to (batch, width)."""
    hidden = hidden.astype(np.float32, copy=False)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        # The last real token of each row, wherever the padding sits.
        positions = np.arange(mask.shape[1])[None, :]
        last = np.where(mask > 0, positions, -1).max(axis=1)
        return hidden[np.arange(hidden.shape[0]), last]
    weights = mask[:, :, None].astype(np.float32)
    if mode == "max":
        return np.where(weights > 0, hidden, -1e9).max(axis=1)
    summed = (hidden * weights).sum(axis=1)
    counts = np.clip(weights.sum(axis=1), 1e-9, None)
    if mode == "mean":
        return summed / counts
    if mode == "mean_sqrt_len":
        return summed / np.sqrt(counts)
    raise ValueError(f"unknown pooling mode {mode!r}")


_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Identity": lambda x: x,
    "Tanh": np.tanh,
    "ReLU": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "SiLU": lambda x: x / (1.0 + np.exp(-x)),
}


def supported_activation(name: str) -> bool:
    return name in _ACTIVATIONS


def apply_dense(vectors: np.ndarray, layers: Sequence[DenseLayer]) -> np.ndarray:
    for layer in layers:
        vectors = vectors @ layer.weight.T
        if layer.bias is not None:
            vectors = vectors + layer.bias
        vectors = _ACTIVATIONS[layer.activation](vectors)
    return vectors


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.clip(norms, 1e-12, None)


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None, renormalize: bool) -> np.ndarray:
    """Matryoshka truncation; re-normalised when the model's output is normalised."""
    if not dimensions or dimensions >= vectors.shape[-1]:
        return vectors
    cut = vectors[..., :dimensions]
    return l2_normalize(cut) if renormalize else np.ascontiguousarray(cut)
