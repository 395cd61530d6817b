"""What a cached row is keyed by: its model's identity (`model_identity`) and the exact model
input (token ids, or the preprocessed image or audio)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np


def _feed(digest: Any, value: Any) -> bool:
    """`value` into the digest, typed; False for a value that has no exact form here."""
    if isinstance(value, np.ndarray):
        digest.update(f"a{value.dtype.str}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, list | tuple):
        if all(type(v) is int for v in value):  # token ids: the common case, packed
            digest.update(f"i{len(value)}".encode())
            digest.update(np.asarray(value, dtype=np.int64).tobytes())
        else:
            digest.update(f"l{len(value)}".encode())
            return all(_feed(digest, v) for v in value)
    elif value is None or isinstance(value, bool | int | float | str | bytes):
        digest.update(f"s{type(value).__name__}{value!r}".encode())
    else:
        return False
    return True


def fingerprint(item: Any) -> bytes | None:
    """An exact digest of one model input (a dataclass: tokens, pixels, features, a page);
    None when it is not one, and so is never cached."""
    if not dataclasses.is_dataclass(item) or isinstance(item, type):
        return None
    digest = hashlib.blake2b(type(item).__name__.encode(), digest_size=16)
    for field in dataclasses.fields(item):
        digest.update(field.name.encode())
        if not _feed(digest, getattr(item, field.name)):
            return None
    return digest.digest()
