"""Sparse embedding (SPLADE): texts to one weight per vocabulary term, kept as the terms
that are not zero."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from infinity_cloud.admission.validation import check_no_token_ids, check_texts
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.results import SparseEmbeddingResult, SparseVector
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.tasks.base import Cost, Task, prompt_tokens, text_cost
from infinity_cloud.tasks.embed import prompted

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served

SPARSE_TERMS = 512  # generous: SPLADE vectors of passages hold 100-300 non-zero terms


@dataclass(frozen=True)
class SparseCall:
    inputs: Sequence[str]
    truncate: bool = True
    prompt_name: str | None = None


class SparseEmbedTask(Task[SparseCall, SparseEmbeddingResult]):
    capability = Capability.SPARSE

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        # The graph pools (`graphs.py`) to (batch, vocabulary) weights; the head keeps their
        # non-zero terms, on the device where the backend runs it: a dense row is 120 KB (1 MB
        # for bge-m3's vocabulary), its terms a few hundred.
        return Head("sparse")

    def rows(self, batch: np.ndarray, items: Sequence[Encoded]) -> list[SparseVector]:
        return [SparseVector.from_terms(weights, ids) for weights, ids in batch]

    def check(self, call: SparseCall, served: Served, limits: LimitsSpec) -> None:
        capability = served.loaded.info.capability  # not ready: a 503 here
        if capability is not Capability.SPARSE:
            raise UnsupportedError(
                f"model {served.name!r} is for {capability.noun}; sparse embeddings need a SPLADE model",
                param="model",
            )
        super().check(call, served, limits)
        check_no_token_ids(call.inputs, "sparse embeddings")
        check_texts(call.inputs, limits)

    def cost(self, call: SparseCall, served: Served) -> Cost:
        cost = text_cost(call.inputs, served.loaded.tokenizer.max_length)
        return cost.answering(len(call.inputs) * 2 * SPARSE_TERMS, items=len(call.inputs))

    def encode(
        self, call: SparseCall, served: Served, limits: LimitsSpec
    ) -> list[Encoded]:
        texts = prompted(served, call.inputs, call.prompt_name)
        return served.loaded.tokenizer.encode(texts, call.truncate)

    def finish(
        self, rows: list[SparseVector], call: SparseCall, served: Served, encodings: list[Encoded]
    ) -> SparseEmbeddingResult:
        vocabulary = served.loaded.info.vocab_size or 0
        return SparseEmbeddingResult(served.name, rows, prompt_tokens(encodings), vocabulary)
