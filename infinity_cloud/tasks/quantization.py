"""Dense vectors in fewer bits, as retrieval services return them.

Binary quantisation is a sign per dimension, eight packed into a byte (`ubinary`), or those
bytes shifted into int8 (`binary`): the layout Cohere's API and sentence-transformers'
`quantize_embeddings` use, so stored indexes agree. It needs no calibration; int8/uint8 do
(a range per dimension) and are not served yet.
"""

from __future__ import annotations

import numpy as np

PACKED_TYPES = ("binary", "ubinary")


def ubinary(vectors: np.ndarray) -> np.ndarray:
    """(n, d) floats -> (n, ceil(d/8)) uint8: bit set where the value is positive."""
    return np.packbits(vectors > 0, axis=-1)


def binary(vectors: np.ndarray) -> np.ndarray:
    """`ubinary` shifted into int8 (byte - 128)."""
    return (ubinary(vectors).astype(np.int16) - 128).astype(np.int8)
