"""What ColPali and ColQwen2 share: a vision-language model read to one normalised vector
per token, queries as text inside a template and pages as images behind a prompt
(`PageFacts`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.family import Graph, ModelInfo
from infinity_cloud.families.base import Family, TowerEncoders, padded_text_example
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.two_tower import IMAGE
from infinity_cloud.text.input_encoder import TextInputEncoder

if TYPE_CHECKING:
    from infinity_cloud.numerics.inputs import Encoded, InputEncoder
    from infinity_cloud.text.tokenization import TextTokenizer


@dataclass(frozen=True)
class PageFacts:
    """How a page reader reads its inputs: `templates`, text it reads around them, "{}"
    standing for the input (ColPali's query "<bos>Question: {}<pad>...\n"; "image": the prompt
    its pages are read behind); its image processor's settings; its image tower's side and
    patch where they are fixed (ColPali's; ColQwen2 reads pages of any shape)."""

    templates: dict[str, str]
    image_processor: dict[str, Any] = field(repr=False)
    image_size: int | None = None
    patch_size: int | None = None


class QueryTemplate(TextInputEncoder):
    """Texts read as queries inside the model's template, which writes the special tokens
    itself."""

    def __init__(self, tokenizer: TextTokenizer, template: str) -> None:
        super().__init__(tokenizer)
        self.template = template

    def encode(self, texts: Sequence[str], truncate: bool = True, role: str | None = None) -> list[Encoded]:
        templated = [self.template.replace("{}", text) for text in texts]
        return self.tokenizer.encode(templated, truncate, special_tokens=False)


def token_vectors(name: str, inputs: tuple[str, ...], **options: Any) -> Graph:
    """A Col*ForRetrieval graph: its embeddings, normalised per token and zero where masked
    (AutoModel does not map these models; AutoModelForPreTraining does)."""
    return Graph(name, "token_vectors", lambda model, feed: model(**feed).embeddings,
                 **{"inputs": lambda model: inputs, "example": padded_text_example,
                    "auto_class": "AutoModelForPreTraining", **options})


class PageReader(Family):
    kinds = (IMAGE,)  # pages, as images
    ranks = True

    def recognises(self, folder: ModelFolder) -> bool:
        return folder.model_type == self.name

    def page_info(self, folder: ModelFolder, facts: PageFacts, **common: Any) -> ModelInfo:
        vlm = folder.config.get("vlm_config") or {}
        text = vlm.get("text_config") or vlm
        return ModelInfo(
            path=folder.path, family=self, capability=Capability.MULTI_VECTOR, model_type=self.name,
            architectures=folder.architectures, max_length=int(text.get("max_position_embeddings") or 512),
            hidden_size=int(folder.config.get("embedding_dim") or 128),
            vocab_size=vlm.get("vocab_size") or text.get("vocab_size"),
            towers={"text": f"{self.name}_text", "image": f"{self.name}_image"},
            own_facts=facts, raw=folder.config, **common,
        )

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        return {"text": QueryTemplate(tokenizer, info.facts(PageFacts).templates["query"]),
                "image": self.page_encoder(info.facts(PageFacts), tokenizer)}

    def page_encoder(self, facts: PageFacts, tokenizer: TextTokenizer) -> InputEncoder:
        """How its pages become model inputs."""
        raise NotImplementedError
