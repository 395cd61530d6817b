"""Dense vectors in fewer bits, as retrieval services return them.

Binary quantisation is a sign per dimension, eight packed into a byte (`ubinary`), or those
bytes shifted into int8 (`binary`): the layout Cohere's API and sentence-transformers'
`quantize_embeddings` use, so stored indexes agree. `int8`/`uint8` map each dimension's range
onto 256 steps; the range is calibrated per model, without network (Infinity downloads its
calibration texts at run time), on paragraphs of the Python standard library's own
docstrings: real English prose that every installation has.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np

from infinity_cloud.admission.validation import check_embedding_types

PACKED_TYPES = ("binary", "ubinary")
CALIBRATED_TYPES = ("int8", "uint8")
EMBEDDING_TYPES = ("float", *CALIBRATED_TYPES, *PACKED_TYPES)
CALIBRATION_SIZE = 512


def named(kind: str) -> str:
    """An embedding type by our name: "float" (Cohere's) is float32."""
    return "float32" if kind == "float" else kind

# Standard-library modules written in Python, whose source the calibration reads.
_MODULES = (
    "argparse", "asyncio.events", "calendar", "collections", "configparser", "contextlib", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions", "ftplib",
    "functools", "gettext", "heapq", "http.client", "imaplib", "inspect", "ipaddress", "json.decoder",
    "logging", "mailbox", "os", "pathlib", "pickle", "pprint", "queue", "random", "shutil", "smtplib",
    "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "traceback",
    "typing", "unittest.case", "urllib.parse", "uuid", "warnings", "weakref", "zipfile",
)


def docstring_paragraphs(source: Path) -> list[str]:
    """Every paragraph of every docstring (module, class, function) in the Python source file
    `source`, white space folded, in `ast.walk`'s order. Read from the file, not from imported
    objects, which other packages may patch or extend at run time."""
    paragraphs = []
    for node in ast.walk(ast.parse(source.read_bytes())):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for paragraph in (ast.get_docstring(node) or "").split("\n\n"):
                if text := " ".join(paragraph.split()):
                    paragraphs.append(text)
    return paragraphs


def calibration_texts(count: int = CALIBRATION_SIZE) -> list[str]:
    """`count` paragraphs of the standard library's docstrings, spread over all there are, in a
    fixed order (60 to 600 characters each), read from the modules' source files."""
    started = time.perf_counter()
    texts = list(_calibration_texts(count))
    global LAST_TEXTS_S
    LAST_TEXTS_S = time.perf_counter() - started
    return texts


# How long making the calibration texts last took here (a cold read parses ~60 modules): a
# calibration still making them is that far from its model work. Before any: twice what a cold
# read took on a quiet 2-core EPYC (1.5 s), for a busy machine.
LAST_TEXTS_S = 3.0


@functools.cache
def _calibration_texts(count: int) -> tuple[str, ...]:
    """Read once per process: parsing the modules takes about 1.5 s of a 2-core EPYC."""
    paragraphs: dict[str, None] = {}
    for name in _MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        for text in docstring_paragraphs(Path(spec.origin)):
            if 60 <= len(text) <= 600:
                paragraphs.setdefault(text)
    texts = list(paragraphs)
    picks = np.linspace(0, len(texts) - 1, num=min(count, len(texts))).astype(int)
    return tuple(texts[i] for i in picks)


def ranges(calibration: np.ndarray) -> np.ndarray:
    """(2, d): each dimension's lowest and highest value over the calibration vectors."""
    return np.stack([calibration.min(axis=0), calibration.max(axis=0)]).astype(np.float32)


def _steps(vectors: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Each value as its step in [0, 255] of its dimension's range, floored, values outside
    the range clipped to it (sentence-transformers' `quantize_embeddings`, so stored indexes
    agree); a dimension without range is step 0."""
    low, high = bounds
    steps = (high - low) / 255
    return np.clip(np.floor((vectors - low) / np.where(steps == 0, 1, steps)), 0, 255)


def uint8(vectors: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    return _steps(vectors, bounds).astype(np.uint8)


def int8(vectors: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """`uint8` shifted by -128, as sentence-transformers computes it."""
    return (_steps(vectors, bounds) - 128).astype(np.int8)


def ubinary(vectors: np.ndarray) -> np.ndarray:
    """(n, d) floats -> (n, ceil(d/8)) uint8: bit set where the value is positive."""
    return np.packbits(vectors > 0, axis=-1)


def binary(vectors: np.ndarray) -> np.ndarray:
    """`ubinary` shifted into int8 (byte - 128)."""
    return (ubinary(vectors).astype(np.int16) - 128).astype(np.int8)


def quantize(vectors: np.ndarray, kind: str, bounds: np.ndarray | None = None) -> np.ndarray:
    """`vectors` as `kind` (one of EMBEDDING_TYPES); int8/uint8 need the calibrated `bounds`."""
    if kind == "float":
        return vectors
    if kind in CALIBRATED_TYPES:
        if bounds is None:
            raise ValueError(f"{kind} quantisation needs calibrated ranges")
        calibrated: Callable[[np.ndarray, np.ndarray], np.ndarray] = int8 if kind == "int8" else uint8
        return calibrated(vectors, bounds)
    return binary(vectors) if kind == "binary" else ubinary(vectors)


# A model's int8/uint8 ranges for a truncation (`dimensions`), made or awaited; `wait` False:
# a 503 with Retry-After while they are calibrated (`Fleet.ranges`, for one served model).
RangesOf = Callable[..., Awaitable[np.ndarray]]


async def ready_before_work(
    types: Sequence[str], dimensions: int | None, wait: bool, ranges: RangesOf
) -> None:
    """The policy of a request for int8/uint8 that does not wait: the 503 while the ranges are
    calibrated comes before its own work (under load that work may be refused by the
    deadline, and done it would be thrown away)."""
    check_embedding_types(types, EMBEDDING_TYPES)  # before any work
    if not wait and any(kind in CALIBRATED_TYPES for kind in types):
        await ranges(dimensions, wait=False)


async def quantized(vectors: np.ndarray, kind: str, dimensions: int | None, wait: bool, ranges: RangesOf
                    ) -> np.ndarray:
    """`vectors` as `kind`; int8/uint8 with the model's calibrated ranges (`dimensions`: the
    truncation they were made with)."""
    check_embedding_types([kind], EMBEDDING_TYPES)
    bounds = await ranges(dimensions, wait=wait) if kind in CALIBRATED_TYPES else None
    return quantize(vectors, kind, bounds)
