"""What ColPali and ColQwen2 share: a vision-language model read to one normalised vector
per token, queries as text and pages as images behind a prompt (`ModelInfo.templates`)."""

from __future__ import annotations

from typing import Any

from infinity_cloud.capability import Capability
from infinity_cloud.families.base import Family, padded_text_example
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.family import Graph, ModelInfo


def token_vectors(name: str, inputs: tuple[str, ...], **options: Any) -> Graph:
    """A Col*ForRetrieval graph: its embeddings, normalised per token and zero where masked
    (AutoModel does not map these models; AutoModelForPreTraining does)."""
    return Graph(name, "token_vectors", lambda model, feed: model(**feed).embeddings,
                 **{"inputs": lambda model: inputs, "example": padded_text_example,
                    "auto_class": "AutoModelForPreTraining", **options})


class PageReader(Family):
    media = ("image",)

    def recognises(self, folder: ModelFolder) -> bool:
        return folder.model_type == self.name

    def page_info(self, folder: ModelFolder, templates: dict[str, str], **facts: Any) -> ModelInfo:
        vlm = folder.config.get("vlm_config") or {}
        text = vlm.get("text_config") or vlm
        return ModelInfo(
            path=folder.path, family=self, capability=Capability.MULTI_VECTOR, model_type=self.name,
            architectures=folder.architectures, max_length=int(text.get("max_position_embeddings") or 512),
            hidden_size=int(folder.config.get("embedding_dim") or 128),
            vocab_size=vlm.get("vocab_size") or text.get("vocab_size"),
            towers={"text": f"{self.name}_text", "image": f"{self.name}_image"},
            templates=templates, image_processor=folder.preprocessor(), raw=folder.config, **facts,
        )
