"""What CLIP and SigLIP share: a text tower and an image tower into one space, normalised,
read as transformers' get_text_features / get_image_features of the whole model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.family import Example, Graph, ModelInfo
from infinity_cloud.core.input_kind import InputKind
from infinity_cloud.families.base import (
    IMAGE_INPUTS,
    Family,
    TowerEncoders,
    max_length,
    padded_text_example,
    pooled,
)
from infinity_cloud.families.folder import ModelFolder

if TYPE_CHECKING:
    from infinity_cloud.text.tokenization import TextTokenizer


@dataclass(frozen=True)
class TwoTowerFacts:
    """What a two-tower model's folder says of its inputs: its image tower's side and patch
    (vision_config) and image processor's settings; `full_length`: its text tower was trained
    on texts padded to its full length (SigLIP's)."""

    image_size: int
    patch_size: int
    image_processor: dict[str, Any] = field(repr=False)
    full_length: bool = False


def _image_example(info: ModelInfo, names: tuple[str, ...]) -> Example:
    import torch

    side = info.facts(TwoTowerFacts).image_size
    return (torch.rand(2, 3, side, side),), {"pixel_values": {0: "batch"}}


IMAGE_EMBEDS = Graph(
    "image_embeds", "vectors", lambda model, feed: pooled(model.get_image_features(**feed)),
    inputs=lambda model: IMAGE_INPUTS, example=_image_example,
)


def text_embeds(inputs: tuple[str, ...]) -> Graph:
    """The text tower, reading `inputs`."""
    return Graph("text_embeds", "vectors", lambda model, feed: pooled(model.get_text_features(**feed)),
                 inputs=lambda model: inputs, example=padded_text_example)


# Images, as URLs or data URIs, decoded with Pillow (`media/images.py`); ColPali's pages too.
IMAGE = InputKind("image", fetched=True, extra="vision", modules=("PIL",), needs="Pillow")


class TwoTower(Family):
    kinds = (IMAGE,)
    # Whether the image tower reads a class token besides its patches (what an image costs).
    class_token = False

    def recognises(self, folder: ModelFolder) -> bool:
        return folder.model_type == self.name

    def read(self, folder: ModelFolder, full_length: bool = False) -> ModelInfo:
        config = folder.config
        text, vision = config.get("text_config") or {}, config.get("vision_config") or {}
        # CLIP projects both towers to projection_dim; SigLIP's text head keeps the text width.
        width = config.get("projection_dim") or text.get("projection_size") or text.get("hidden_size")
        return ModelInfo(
            path=folder.path, family=self, capability=Capability.EMBED, model_type=folder.model_type,
            architectures=folder.architectures, max_length=max_length(folder, text),
            hidden_size=int(width or 0), vocab_size=text.get("vocab_size"), pad_token=folder.pad_token,
            normalize=True, towers={"text": "text_embeds", "image": "image_embeds"}, raw=config,
            own_facts=TwoTowerFacts(
                int(vision.get("image_size") or 224), int(vision.get("patch_size") or 32),
                folder.preprocessor(), full_length,
            ),
        )

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        from infinity_cloud.media.images import ImageEncoder
        from infinity_cloud.text.input_encoder import TextInputEncoder

        facts = info.facts(TwoTowerFacts)
        return {
            "text": TextInputEncoder(tokenizer, full_length=facts.full_length),
            "image": ImageEncoder(
                facts.image_processor, facts.image_size, facts.patch_size, self.class_token
            ),
        }
