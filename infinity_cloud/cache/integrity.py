"""What a row read back from the shared store must be before it is served.

A Redis that others can write to (or another program's keys, or a row of another version)
must not become an answer: a row read back must have the form of the rows the model itself
produces (`RowForm`: type, dtype, shape or sparse layout, finite numbers), else it is a miss,
recomputed and counted. With a secret the replicas share (`--cache-secret-file`), every row
is stored behind a tag keyed by it and by the row's own key (`RowSeal`), so only a replica
holding the secret can write a row that is served, and a row cannot be moved to another key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity_cloud.core.results import SparseVector

TAG_BYTES = 16


@dataclass(frozen=True, slots=True)
class RowForm:
    """The form of a model's rows: an array's dtype and shape (-1 where the input's own
    positions go: a vector per token or patch), or a sparse vector's dtypes and the bound of
    its indices (the vocabulary)."""

    sparse: bool
    dtype: str
    shape: tuple[int, ...] = ()
    index_dtype: str = ""
    bound: int | None = None

    @classmethod
    def of(cls, row: Any, item: Any, bound: int | None = None) -> RowForm | None:
        """The form `row` (the model's answer for `item`) has; None for a row never cached."""
        if isinstance(row, SparseVector):
            return cls(True, row.values.dtype.str, (), row.indices.dtype.str, bound)
        if not isinstance(row, np.ndarray):
            return None
        shape = list(row.shape)
        if row.ndim >= 2 and shape[0] == _positions(item):
            shape[0] = -1
        return cls(False, row.dtype.str, tuple(shape))

    def admits(self, row: Any, item: Any) -> bool:
        """Whether `row` could be the model's answer for `item`."""
        if self.sparse:
            return isinstance(row, SparseVector) and self._sparse_fits(row)
        if not isinstance(row, np.ndarray) or row.dtype.str != self.dtype:
            return False
        wanted = tuple(_positions(item) if size == -1 else size for size in self.shape)
        return row.shape == wanted and (row.dtype.kind != "f" or bool(np.isfinite(row).all()))

    def _sparse_fits(self, row: SparseVector) -> bool:
        indices, values = row.indices, row.values
        if not (isinstance(indices, np.ndarray) and isinstance(values, np.ndarray)):
            return False
        if indices.dtype.str != self.index_dtype or values.dtype.str != self.dtype:
            return False
        if indices.ndim != 1 or values.shape != indices.shape or not np.isfinite(values).all():
            return False
        if not len(indices):
            return True
        ascending = bool((np.diff(indices) > 0).all())
        return ascending and indices[0] >= 0 and (self.bound is None or indices[-1] < self.bound)


def _positions(item: Any) -> int | None:
    try:
        return len(item)
    except TypeError:
        return None


class RowSeal:
    """Tags rows with a secret the replicas share; without one, rows go as they are."""

    def __init__(self, secret: bytes | None) -> None:
        self._key = hashlib.sha256(secret).digest() if secret else None

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def _tag(self, key: bytes, data: bytes) -> bytes:
        assert self._key is not None
        digest = hashlib.blake2b(key=self._key, digest_size=TAG_BYTES)
        digest.update(len(key).to_bytes(4, "little") + key)
        digest.update(data)
        return digest.digest()

    def seal(self, key: bytes, data: bytes) -> bytes:
        return data if self._key is None else self._tag(key, data) + data

    def open(self, key: bytes, stored: bytes) -> bytes | None:
        """The row's bytes, or None where its tag is not this secret's for this key."""
        if self._key is None:
            return stored
        tag, data = stored[:TAG_BYTES], stored[TAG_BYTES:]
        return data if len(tag) == TAG_BYTES and hmac.compare_digest(tag, self._tag(key, data)) else None
