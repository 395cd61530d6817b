"""A text encoder (BERT, MiniLM, bge, e5, a decoder read to one vector): token states pooled
into one vector, through the folder's Dense layers, normalised if it says so. The family of
any text folder no other family claims."""

from __future__ import annotations

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families import sentence_transformers
from infinity_cloud.families.base import TOKEN_STATES, Family, TextFacts, graphs_of
from infinity_cloud.families.folder import ModelFolder


class TextEncoder(Family):
    name = "text-encoder"
    graphs = graphs_of(TOKEN_STATES)

    def recognises(self, folder: ModelFolder) -> bool:
        return not folder.reads_media

    def read(self, folder: ModelFolder) -> ModelInfo:
        head = sentence_transformers.head(folder)
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.EMBED, pooling=head.pooling or "mean",
            normalize=head.normalize, dense=head.dense, prompts=head.prompts,
        )
