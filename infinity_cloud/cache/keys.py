"""What a cached row is keyed by: the model's identity (its files' content, not its served
name, and everything that changes its numbers: backend, precision, device, pooling,
normalisation) and the exact model input (token ids, or the preprocessed image or audio)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

# A file larger than this is read in samples: its ends and `_SAMPLES` slices spread evenly
# through it (4 MB in all), so that gigabytes are not hashed at each start, while new weights
# of the same size (a fine-tune changes every layer's bytes) are told apart. A hub blob is
# named by its content's hash, which is used as is.
_WHOLE = 8 << 20
_SAMPLES, _SLICE = 256, 16 << 10


def _file_digest(path: Path) -> bytes:
    resolved = path.resolve()
    if resolved.parent.name == "blobs":  # the hub cache names a blob by its content's hash
        return resolved.name.encode()
    size = resolved.stat().st_size
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    with resolved.open("rb") as file:
        if size <= _WHOLE:
            digest.update(file.read())
            return digest.digest()
        for i in range(_SAMPLES + 1):
            file.seek(min(size - _SLICE, i * (size - _SLICE) // _SAMPLES))
            digest.update(file.read(_SLICE))
    return digest.digest()


def folder_identity(folder: Path) -> str:
    """A digest of a model folder's files: their names and content (weights by size and
    ends), so the same weights under another name or path share entries, and new weights
    under the same name never do."""
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not _derived(p, folder)):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(_file_digest(path))
    return digest.hexdigest()


def _derived(path: Path, folder: Path) -> bool:
    """Files that are not the model's own: exports and caches written beside it."""
    parts = path.relative_to(folder).parts
    return any(part.startswith(".") or part in ("compiled", "__pycache__") for part in parts)


def namespace(identity: str, facts: Iterable[Any]) -> str:
    """A model's key prefix: its folder's identity and what else changes its rows."""
    digest = hashlib.blake2b(identity.encode(), digest_size=12)
    for fact in facts:
        digest.update(b"\0" + repr(fact).encode())
    return digest.hexdigest()


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
