"""Per-batch heads: backend output to one row per input (each task picks its own).

A head is data (what it does) and one definition of how, for numpy or torch (`pooling.py`):
the engine runs it on the host after a backend; a backend that can run it inside its graph
(`Backend.fuse`: torch, on the GPU) does, and hands back only what the answer needs, B x H
rather than B x L x H.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from infinity_cloud.core.family import DenseLayer
from infinity_cloud.numerics.pooling import Array, apply_dense, l2_normalize, pool, positions

HeadKind = Literal["pool", "tokens", "vectors", "sparse", "final"]


@dataclass(frozen=True)
class Head:
    """What becomes of a batch's backend output:

    - `pool`: token states pooled (`pooling`), through the Dense layers, normalised if asked;
    - `tokens`: token states through the Dense layers token by token (ColBERT); padding comes
      out as it went in, rows are cut to their inputs afterwards;
    - `vectors`: a graph that pools inside (CLIP's towers), normalised if asked;
    - `sparse`: (batch, vocabulary) term weights (SPLADE) as their non-zero terms, packed
      (batch, 2, k): weights, then term ids (exact as float32 below 2**24), k the most any row
      holds; rows with fewer end in zero weights;
    - `final`: output that is final per batch (scoring models' logits, whose scores depend on
      the request), as float32.
    """

    kind: HeadKind
    pooling: str = "mean"
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = False

    def __call__(self, output: Array, mask: Array | None, xp: Any = np) -> Array:
        output = xp.asarray(output, dtype=xp.float32)
        if self.kind == "final":
            return output
        if self.kind == "sparse":
            return nonzero_terms(output, xp)
        if self.kind == "pool":
            assert mask is not None, "token states come with their mask"
            output = pool(output, mask, self.pooling, xp)
        vectors = apply_dense(output, self.dense, xp)
        return l2_normalize(vectors, xp) if self.normalize else vectors

    @property
    def reference(self) -> Head:
        """The head whose outputs two precisions are compared on (`fidelity.agreement`): this
        one, but SPLADE's weights dense, so that every row has the same columns."""
        return FINAL if self.kind == "sparse" else self

    def on_device(self, to_device: Callable[[np.ndarray], Array]) -> Head:
        """This head with its Dense weights as `to_device` makes them (tensors on a GPU)."""
        return replace(self, dense=tuple(
            replace(layer, weight=to_device(layer.weight),
                    bias=None if layer.bias is None else to_device(layer.bias))
            for layer in self.dense
        ))


FINAL = Head("final")


def nonzero_terms(weights: Array, xp: Any = np) -> Array:
    """(batch, vocabulary) weights >= 0 to (batch, 2, k): each row's non-zero weights, largest
    first, then their term ids; k the most non-zero terms of any row (nothing is cut)."""
    if weights.shape[-1] >= 2**24:
        raise ValueError(f"a vocabulary of {weights.shape[-1]} terms is too large for float32 term ids")
    k = max(int(xp.amax(xp.sum(weights > 0, 1))), 1)
    order = xp.argsort(-weights, 1)[:, :k]
    kept = weights[positions(order[:, :1], 0, xp), order]
    return xp.stack([kept, xp.asarray(order, dtype=xp.float32)], 1)
