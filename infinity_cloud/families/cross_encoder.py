"""A cross-encoder (a reranker): a sequence classifier with one logit, the relevance of a
(query, document) pair."""

from __future__ import annotations

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families.base import LOGITS, Family, TextFacts, graphs_of
from infinity_cloud.families.classifier import labels_of, reads_sequences
from infinity_cloud.families.folder import ModelFolder


class CrossEncoder(Family):
    name = "cross-encoder"
    graphs = graphs_of(LOGITS)

    def recognises(self, folder: ModelFolder) -> bool:
        return reads_sequences(folder) and labels_of(folder)[1] == 1

    def read(self, folder: ModelFolder) -> ModelInfo:
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.RERANK, towers={"text": "logits"},
            labels=labels_of(folder)[0],
        )
