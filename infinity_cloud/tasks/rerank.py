"""Reranking: a query against documents, scored as pairs, best first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from infinity_cloud.admission.validation import check_max_tokens_per_doc, check_texts, check_top_n
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.results import RankedDocument, RerankResult
from infinity_cloud.numerics.heads import FINAL, Head
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.tasks.base import Cost, Task, length_cost, prompt_tokens
from infinity_cloud.tasks.scores import rank, sigmoid
from infinity_cloud.text.tokenization import TextTokenizer

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served


@dataclass(frozen=True)
class RerankCall:
    query: str
    documents: Sequence[str]
    top_n: int | None = None
    raw_scores: bool = False
    truncate: bool = True
    max_tokens_per_doc: int | None = None  # each document cut to that many tokens first (Cohere's)
    instruction: str | None = None  # what to rank for (an LLM reranker's); None: the model's own


class RerankTask(Task[RerankCall, RerankResult]):
    capability = Capability.RERANK
    fidelity = "scores"  # an order and its scores

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        return FINAL

    def encode_probes(self, tokenizer: TextTokenizer, texts: Sequence[str]) -> list[Encoded]:
        return tokenizer.encode_pairs(texts[0], texts[1:])

    def check(self, call: RerankCall, served: Served, limits: LimitsSpec) -> None:
        super().check(call, served, limits)
        check_texts([call.query], limits, param="query")
        check_texts(call.documents, limits, param="documents")
        if call.instruction is not None:
            check_texts([call.instruction], limits, param="instruction")
        check_top_n(call.top_n)
        check_max_tokens_per_doc(call.max_tokens_per_doc)

    def cost(self, call: RerankCall, served: Served) -> Cost:
        # Each pair is tokenized with its own copy of the query (and instruction).
        asked = len(call.query) + len(call.instruction or "")
        pairs = [asked + len(document) for document in call.documents]
        return length_cost(pairs, served.loaded.tokenizer.max_length).answering(len(pairs), items=len(pairs))

    def encode(
        self, call: RerankCall, served: Served, limits: LimitsSpec
    ) -> list[Encoded]:
        tokenizer = served.loaded.tokenizer
        documents = list(call.documents)
        if call.max_tokens_per_doc is not None:
            documents = tokenizer.cut(documents, call.max_tokens_per_doc)
        encoder = served.loaded.encoders["text"]
        return encoder.encode_pairs(call.query, documents, call.truncate, call.instruction)

    def finish(
        self, rows: list[np.ndarray], call: RerankCall, served: Served, encodings: list[Encoded]
    ) -> RerankResult:
        logits = np.stack(rows)[:, 0]
        scores = logits if call.raw_scores else sigmoid(logits)
        ranked = [RankedDocument(i, float(scores[i])) for i in rank(scores, call.top_n)]
        return RerankResult(served.name, ranked, prompt_tokens(encodings))
