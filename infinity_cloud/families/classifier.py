"""A text classifier (`*ForSequenceClassification` with several labels): a score per label."""

from __future__ import annotations

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families.base import LOGITS, Family, TextFacts, graphs_of
from infinity_cloud.families.folder import ModelFolder


def labels_of(folder: ModelFolder) -> tuple[tuple[str, ...], int]:
    """The labels a sequence classifier's config names, in id order, and how many logits its
    head has (a cross-encoder's one)."""
    id2label = folder.config.get("id2label") or {}
    labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
    return labels, int(folder.config.get("num_labels") or len(labels) or 1)


def reads_sequences(folder: ModelFolder) -> bool:
    return not folder.reads_media and folder.has_architecture("ForSequenceClassification")


class Classifier(Family):
    name = "classifier"
    graphs = graphs_of(LOGITS)

    def recognises(self, folder: ModelFolder) -> bool:
        return reads_sequences(folder) and labels_of(folder)[1] > 1

    def read(self, folder: ModelFolder) -> ModelInfo:
        labels, count = labels_of(folder)
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.CLASSIFY, towers={"text": "logits"},
            labels=labels or tuple(f"LABEL_{i}" for i in range(count)),
        )
