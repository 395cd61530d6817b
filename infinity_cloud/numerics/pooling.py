"""Token states to one vector per input: pooling, Dense heads, normalisation, Matryoshka.

Written once for both array libraries a head runs on: `xp` is the numpy module (the engine,
after any backend) or the torch module (the torch backend, on its device, so that only the
pooled rows are copied to the host). Only the functions and methods the two share, with the
same positional meaning, are used here: `asarray`, `sum`, `amax`, `cumsum`, `where`, `sqrt`,
`clip`, `exp`, `tanh`, `ones_like`, indexing and `@`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from infinity_cloud.core.family import DenseLayer

Array = Any  # a numpy array or a torch tensor, per `xp`


def positions(like: Array, axis: int, xp: Any) -> Array:
    """0, 1, 2, ... along `axis`, on `like`'s device (an arange there, without naming one)."""
    return xp.cumsum(xp.ones_like(like), axis) - 1


def pool(hidden: Array, mask: Array, mode: str, xp: Any = np) -> Array:
    """(batch, length, width) token states and a (batch, length) mask to (batch, width)."""
    hidden = xp.asarray(hidden, dtype=xp.float32)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        # The last real token of each row, wherever the padding sits.
        last = xp.amax(xp.where(mask > 0, positions(mask, 1, xp), -1), 1)
        return hidden[positions(last, 0, xp), last]
    weights = xp.asarray(mask, dtype=xp.float32)[:, :, None]
    if mode == "max":
        return xp.amax(xp.where(weights > 0, hidden, -1e9), 1)
    summed = xp.sum(hidden * weights, 1)
    counts = xp.clip(xp.sum(weights, 1), 1e-9, None)
    if mode == "mean":
        return summed / counts
    if mode == "mean_sqrt_len":
        return summed / xp.sqrt(counts)
    raise ValueError(f"unknown pooling mode {mode!r}")


_ACTIVATIONS: dict[str, Callable[[Array, Any], Array]] = {
    "Identity": lambda x, xp: x,
    "Tanh": lambda x, xp: xp.tanh(x),
    "ReLU": lambda x, xp: xp.where(x > 0, x, 0.0),
    "Sigmoid": lambda x, xp: 1.0 / (1.0 + xp.exp(-x)),
    "SiLU": lambda x, xp: x / (1.0 + xp.exp(-x)),
}


def supported_activation(name: str) -> bool:
    return name in _ACTIVATIONS


def apply_dense(vectors: Array, layers: Sequence[DenseLayer], xp: Any = np) -> Array:
    """The layers in order; their weights are arrays of `xp` (`Head.on_device` moves them)."""
    for layer in layers:
        vectors = vectors @ layer.weight.T
        if layer.bias is not None:
            vectors = vectors + layer.bias
        vectors = _ACTIVATIONS[layer.activation](vectors, xp)
    return vectors


def l2_normalize(vectors: Array, xp: Any = np) -> Array:
    norms = xp.sqrt(xp.sum(vectors * vectors, -1))[..., None]
    return vectors / xp.clip(norms, 1e-12, None)


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None, renormalize: bool) -> np.ndarray:
    """Matryoshka truncation; re-normalised when the model's output is normalised (per
    request, so on the host)."""
    if not dimensions or dimensions >= vectors.shape[-1]:
        return vectors
    cut = vectors[..., :dimensions]
    return l2_normalize(cut) if renormalize else np.ascontiguousarray(cut)
