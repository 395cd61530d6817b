"""A cached row as bytes and back, with no pickle (a shared Redis must never be a way to run
code): a row is an array, or a sparse vector's two arrays, each in numpy's own format."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from infinity_cloud.core.results import SparseVector


def _array(value: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(value), allow_pickle=False)
    return out.getvalue()


def encode_row(row: Any) -> bytes | None:
    """The row as bytes; None for a kind of row that is not cached."""
    if isinstance(row, np.ndarray) and row.dtype != object:
        return b"a" + _array(row)
    if isinstance(row, SparseVector):
        indices = _array(row.indices)
        return b"s" + len(indices).to_bytes(8, "little") + indices + _array(row.values)
    return None


def _load(body: Any) -> np.ndarray:
    """One array in numpy's format; anything else (an archive, an object array) is refused."""
    array = np.load(io.BytesIO(body), allow_pickle=False)
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "fiub":
        raise ValueError("not a cached row's array")
    return array


def decode_row(data: bytes) -> Any:
    kind, body = data[:1], memoryview(data)[1:]
    if kind == b"a":
        return _load(body)
    if kind == b"s":
        size = int.from_bytes(body[:8], "little")
        return SparseVector(_load(body[8 : 8 + size]), _load(body[8 + size :]))
    raise ValueError(f"not a cached row (kind {bytes(kind)!r})")


def row_bytes(row: Any) -> int:
    """What a row holds in memory, for the LRU's bound."""
    if isinstance(row, np.ndarray):
        return int(row.nbytes) + 112  # numpy's own header, about
    if isinstance(row, SparseVector):
        return int(row.indices.nbytes + row.values.nbytes) + 280
    return 1024
