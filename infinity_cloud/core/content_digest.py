"""A model folder known by its files' content: the digest that the export cache names a
model's exports by and the result cache keys its rows by (`model_fingerprint`), and the
checksum of one file's content it is made of (`file_record`), which an export's manifest
records too. Content, not paths or times: a folder copied or moved elsewhere keeps both."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

# What a model's own files are (an export's folder, `.infinity-cloud`, is not one of them).
_SOURCE_SUFFIXES = (".json", ".safetensors", ".bin", ".onnx", ".txt", ".model")
# A file up to this size is hashed whole; a larger one by slices spread evenly through it,
# its ends included (4 MB in all: fast even for GBs), so that new weights of the same size (a
# fine-tune changes every layer's bytes, not only the ends) are told apart.
_WHOLE_FILE = 8 << 20
_SLICES, _SLICE = 256, 16 << 10
PINNED_FINGERPRINT = "infinity-cloud-fingerprint.json"
# Each folder's fingerprint as first read inside `one_reading`, by path; None outside one.
_KEPT: ContextVar[dict[Path, str] | None] = ContextVar("fingerprints_kept", default=None)


@contextmanager
def one_reading() -> Iterator[None]:
    """Inside the block each folder's fingerprint is read once and kept: a model's load asks for
    it for each export's name, the fidelity verdict and the result cache's identity, and its
    folder does not change under it (exports go to `.infinity-cloud`, which it leaves out)."""
    kept = _KEPT.get()
    token = _KEPT.set({} if kept is None else kept)
    try:
        yield
    finally:
        _KEPT.reset(token)


def model_fingerprint(model_path: Path) -> str:
    """A digest of the model folder's own files: names, sizes and checksums of their content
    (`file_record`).

    Read once inside `one_reading`; elsewhere the folder is walked again, and its content read
    again only when a file's size or time has changed. A folder whose weights an image left
    out (`exports.serve_from_exports`) carries the digest they had (`pin_fingerprint`).
    """
    kept = _KEPT.get()
    if kept is None:
        return _read_fingerprint(model_path)
    if model_path not in kept:
        kept[model_path] = _read_fingerprint(model_path)
    return kept[model_path]


def _read_fingerprint(model_path: Path) -> str:
    pinned = model_path / PINNED_FINGERPRINT
    if pinned.is_file():
        return json.loads(pinned.read_text(encoding="utf-8"))["fingerprint"]
    files = []
    for file in sorted(model_path.rglob("*")):
        rel = file.relative_to(model_path)
        if rel.parts[0] == ".infinity-cloud" or file.suffix not in _SOURCE_SUFFIXES or not file.is_file():
            continue
        stat = file.stat()
        files.append((rel.as_posix(), stat.st_size, stat.st_mtime_ns))
    return _content_digest(str(model_path.resolve()), tuple(files))


def pin_fingerprint(model_path: Path) -> None:
    """Write the folder's fingerprint into it, so that it stays what it was when files go."""
    digest = model_fingerprint(model_path)
    (model_path / PINNED_FINGERPRINT).write_text(json.dumps({"fingerprint": digest}), encoding="utf-8")


@functools.lru_cache(maxsize=64)
def _content_digest(folder: str, files: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for rel, _, _ in files:
        record = file_record(Path(folder) / rel)
        digest.update(f"{rel}:{json.dumps(record, sort_keys=True)};".encode())
    return digest.hexdigest()


def file_record(file: Path) -> dict[str, Any]:
    """A file's size and a checksum of its content (sampled past `_WHOLE_FILE`)."""
    size = file.stat().st_size
    digest = hashlib.blake2b(digest_size=16)
    with file.open("rb") as handle:
        if size <= _WHOLE_FILE:
            digest.update(handle.read())
        else:
            for i in range(_SLICES + 1):
                handle.seek(i * (size - _SLICE) // _SLICES)
                digest.update(handle.read(_SLICE))
    return {"size": size, "sampled": digest.hexdigest()}
