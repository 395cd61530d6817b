"""ColBERT-style late interaction (sentence-transformers' MultiVectorEncoder): an encoder's
token states through Dense and Normalize token by token, queries expanded, punctuation
dropped from documents (`LateInteraction`)."""

from __future__ import annotations

from infinity_cloud.capability import Capability
from infinity_cloud.families import sentence_transformers
from infinity_cloud.families.base import TOKEN_STATES, Family, TextFacts, graphs_of
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.family import ModelInfo


class ColBert(Family):
    name = "colbert"
    graphs = graphs_of(TOKEN_STATES)

    def recognises(self, folder: ModelFolder) -> bool:
        return not folder.reads_media and sentence_transformers.head(folder).late_interaction is not None

    def read(self, folder: ModelFolder) -> ModelInfo:
        head = sentence_transformers.head(folder)
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.MULTI_VECTOR, normalize=head.normalize, dense=head.dense,
            prompts=head.prompts, late_interaction=head.late_interaction,
        )
