"""What the engine returns: plain data, shared by the Python API and the HTTP layer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    model: str
    embeddings: np.ndarray  # (inputs, dimensions), in input order: float32, or `dtype`'s numbers
    prompt_tokens: int
    dtype: str = "float32"  # float32, int8, uint8, binary or ubinary (packed bits)


@dataclass(frozen=True, slots=True)
class ChunkedEmbeddingResult:
    """Documents cut into chunks, one vector a chunk: `spans[d]` holds document d's chunks as
    (start, end, tokens), character offsets into it and the chunk's own token count; their
    vectors are the rows of `embeddings` in the same order (all documents' chunks, in turn)."""

    model: str
    embeddings: np.ndarray  # (chunks, dimensions), float32
    spans: list[list[tuple[int, int, int]]]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class EmbeddingsByType:
    """One embedding of the inputs, in each of several types (Cohere's `embedding_types`)."""

    model: str
    # type -> (inputs, dimensions) as `EmbeddingResult.dtype` says; a model that makes several
    # outputs (bge-m3) also "sparse" (a SparseVector per input) and "multi_vector" (a matrix each)
    by_type: dict[str, np.ndarray | list[SparseVector] | list[np.ndarray]]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class HybridEmbeddingResult:
    """The outputs asked of a model that makes several in one pass (bge-m3), each in input
    order; None where not asked."""

    model: str
    dense: np.ndarray | None  # (inputs, dimensions) float32
    sparse: list[SparseVector] | None
    multi_vector: list[np.ndarray] | None  # (tokens, width) float32 each
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class SimilarityResult:
    """The cosine of a source text's embedding to each other text's."""

    model: str
    scores: np.ndarray  # (texts,) float32, in input order
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class SparseVector:
    """The non-zero terms of a vocabulary-sized vector: ids ascending, their weights."""

    indices: np.ndarray  # int64
    values: np.ndarray  # float32

    @classmethod
    def from_terms(cls, weights: np.ndarray, ids: np.ndarray) -> SparseVector:
        """Terms as a head keeps them (`heads.nonzero_terms`): zero weights dropped, ids sorted."""
        kept = weights > 0
        order = np.argsort(ids[kept], kind="stable")
        return cls(ids[kept][order].astype(np.int64), weights[kept][order].astype(np.float32))

    def to_dense(self, size: int) -> np.ndarray:
        dense = np.zeros(size, dtype=np.float32)
        dense[self.indices] = self.values
        return dense


@dataclass(frozen=True, slots=True)
class SparseEmbeddingResult:
    model: str
    embeddings: list[SparseVector]  # in input order
    prompt_tokens: int
    dimensions: int  # the vocabulary size: what the indices range over


@dataclass(frozen=True, slots=True)
class MultiVectorResult:
    model: str
    embeddings: list[np.ndarray]  # per input, in input order: (its tokens, dimensions) float32
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


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a loaded model is, for the routes that describe it (TEI's /info, /models): typed
    facts, so no route reads a model's internals or the keys of a dict."""

    name: str
    capability: str  # Capability's value: embed, rerank, classify, sparse, multi_vector
    modalities: tuple[str, ...]  # the towers it reads: text, image, audio
    backend: str
    device: str
    dtype: str  # the precision it runs in
    agreement_with_float32: float | None  # worst cosine to float32 on fixed probes
    # Why it runs in this precision where a reduced one fell short (`Backend.precision_note`)
    precision_note: str | None
    max_input_tokens: int
    dimensions: int | None
    labels: tuple[str, ...]  # a classifier's, in id order; else empty
    pooling: str | None  # an embedder's (mean, cls, lasttoken, ...)
    normalize: bool  # whether its embeddings are unit length

