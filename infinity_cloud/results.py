"""What the engine returns: plain data, shared by the Python API and the HTTP layer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    model: str
    embeddings: np.ndarray  # (inputs, dimensions) float32, in input order
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class RankedDocument:
    index: int
    score: float


@dataclass(frozen=True, slots=True)
class RerankResult:
    model: str
    results: list[RankedDocument]  # highest score first
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class ClassifyResult:
    model: str
    labels: list[list[tuple[str, float]]]  # per input, highest score first
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Token:
    """One token of a tokenized text; `start`/`stop` are character offsets, None for the
    special tokens the model adds."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None
