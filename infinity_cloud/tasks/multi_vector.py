"""Multi-vector embedding: a query's or a document's tokens (ColBERT), or a page image's
(ColPali), each to a vector, for late-interaction scoring (`scores.maxsim`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from infinity_cloud.admission.validation import check_no_token_ids, check_texts
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import GraphOutput, ModelInfo, Tower
from infinity_cloud.core.results import MultiVectorResult
from infinity_cloud.numerics.heads import FINAL, Head
from infinity_cloud.tasks.base import (
    Cost,
    Task,
    check_inputs,
    fetched_inputs,
    inputs_cost,
    prompt_tokens,
    require_tower,
)

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served


Role = Literal["query", "document"]
# A text's use, in every dialect's words (tasks.embed.PROMPTS_FOR_USE's), as a multi-vector
# model reads it: ColBERT's [Q] and [D].
ROLE_FOR_USE: dict[str, Role] = {"query": "query", "search_query": "query", "document": "document",
                                 "search_document": "document"}


@dataclass(frozen=True)
class MultiVectorCall:
    inputs: Sequence[str]  # texts, or image URLs / data URIs (pages)
    modality: Tower = "text"
    truncate: bool = True
    # How a text is read: a ColBERT query is expanded, a document loses its punctuation. None:
    # ColPali's texts are queries (its documents are images), ColBERT's documents (as
    # sentence-transformers' `encode`).
    role: Role | None = None


def require_multi_vector(served: Served) -> None:
    """The model makes per-token embeddings (a 400 saying what it makes otherwise; a 503 while
    it loads)."""
    capability = served.loaded.info.capability
    if capability is not Capability.MULTI_VECTOR:
        raise UnsupportedError(
            f"per-token embeddings are made by multi-vector (ColBERT) models and ColPali; model "
            f"{served.name!r} is for {capability.noun}: ask it for one embedding per text", param="model",
        )


class MultiVectorTask(Task[MultiVectorCall, MultiVectorResult]):
    capability = Capability.MULTI_VECTOR

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        if info.family.graph(graph).returns == "token_states":  # ColBERT: states through Dense, Normalize
            return Head("tokens", dense=info.dense, normalize=normalize)
        return FINAL  # ColPali's graph normalises each token and zeroes the padding

    def rows(self, batch: np.ndarray, items: Sequence[Any]) -> list[np.ndarray]:
        """Each input's vectors, one per position it holds (padding dropped)."""
        return [np.ascontiguousarray(row[: len(item)]) for row, item in zip(batch, items, strict=True)]

    def check(self, call: MultiVectorCall, served: Served, limits: LimitsSpec) -> None:
        require_multi_vector(served)
        require_tower(served, self.capability, call.modality)
        if call.modality == "text":
            check_no_token_ids(call.inputs, "multi-vector embeddings")  # the [Q]/[D] prompts are text
            check_texts(call.inputs, limits)
        else:
            check_inputs(call.inputs, call.modality, served, limits)

    def cost(self, call: MultiVectorCall, served: Served) -> Cost:
        cost = inputs_cost(call.inputs, call.modality, served)  # answered: a vector per token or patch
        return cost.answering(cost.tokens * (served.loaded.info.dimensions or 0), items=len(call.inputs))

    def media(self, call: MultiVectorCall, served: Served) -> Sequence[str]:
        return fetched_inputs(call.inputs, call.modality, served)

    def tower(self, call: MultiVectorCall) -> Tower:
        return call.modality

    def encode(
        self, call: MultiVectorCall, served: Served, limits: LimitsSpec
    ) -> list[Any]:
        encoder = served.loaded.encoders[call.modality]
        if call.modality != "text":  # a tower's own kind of input
            return encoder.encode(call.inputs, call.truncate)
        # Read as its family reads a text in this role (ColBERT's roles and query expansion,
        # ColPali's query template).
        return encoder.encode(call.inputs, call.truncate, call.role)

    def finish(
        self, rows: list[np.ndarray], call: MultiVectorCall, served: Served, encodings: list[Any]
    ) -> MultiVectorResult:
        if call.modality == "text":  # less the vectors of tokens its model does not match on
            rows = served.loaded.encoders["text"].kept(rows, encodings, call.role or "document")
        return MultiVectorResult(served.name, rows, prompt_tokens(encodings))
