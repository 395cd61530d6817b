"""SigLIP: text and images into one space. Its text tower was trained on texts padded to its
full length without an attention mask and pools the last position, so it is given exactly
that: ids only, always padded to the maximum length."""

from __future__ import annotations

from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families.base import TEXT_INPUTS, graphs_of
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.two_tower import IMAGE_EMBEDS, TwoTower, text_embeds


class Siglip(TwoTower):
    name = "siglip"
    graphs = graphs_of(text_embeds(TEXT_INPUTS[:1]), IMAGE_EMBEDS)

    def read(self, folder: ModelFolder) -> ModelInfo:  # type: ignore[override]
        return super().read(folder, full_length=True)
