"""bge-m3 (FlagEmbedding's M3): an XLM-R encoder whose one pass gives a dense vector (CLS,
normalised), sparse lexical weights (`sparse_linear.pt`) and ColBERT vectors
(`colbert_linear.pt`), the two heads saved beside the model. Its graph runs the encoder and
both heads and packs the three (`numerics.hybrid`); a request takes the ones it asks for.
Served as an embedder: a plain request gets the dense vectors."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import ModelLoadError
from infinity_cloud.core.family import Example, ModelInfo
from infinity_cloud.families import sentence_transformers
from infinity_cloud.families.base import Family, TextFacts, graphs_of, padded_text_example, text_graph
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.numerics import hybrid
from infinity_cloud.text.input_encoder import TextInputEncoder

if TYPE_CHECKING:
    from infinity_cloud.families.base import TowerEncoders
    from infinity_cloud.text.tokenization import TextTokenizer

# FlagEmbedding's tokens whose sparse weights are dropped.
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")

# Each loaded encoder's two heads, loaded on its first pass in its dtype and on its device.
_HEADS: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=4)
def _saved_heads(folder: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """FlagEmbedding's two saved Linears (state dicts, on the CPU), read once per folder."""
    import torch

    return tuple(torch.load(Path(folder) / file, map_location="cpu", weights_only=True)  # type: ignore[return-value]
                 for file in hybrid.HEAD_FILES)


def _heads(model: Any) -> tuple[Any, Any]:
    """The two heads as (weight, bias) tensors in the model's dtype, on its device: tensors, not
    modules, which an export keeps as constants."""
    heads = _HEADS.get(model)
    if heads is None:
        like, width = next(model.parameters()), model.config.hidden_size
        heads = tuple((state["weight"].to(like), None if "bias" not in state else state["bias"].to(like))
                      for state in _saved_heads(model.name_or_path))
        if heads[1][0].shape != (width, width):
            raise ModelLoadError(
                f"{Path(model.name_or_path).name}: {hybrid.COLBERT_HEAD} makes {heads[1][0].shape[0]}-wide "
                f"vectors; only ColBERT vectors as wide as the model's states ({width}) are served"
            )
        _HEADS[model] = heads
    return heads  # type: ignore[return-value]


def _example(info: ModelInfo, names: tuple[str, ...]) -> Example:
    """The padded example; the heads read first, as a trace would record reading them as ops."""
    _saved_heads(str(info.path))
    return padded_text_example(info, names)


def _three_outputs(model: Any, feed: dict[str, Any]) -> Any:
    states = model(**feed).last_hidden_state
    return hybrid.pack(states, feed["attention_mask"], *_heads(model))


THREE_OUTPUTS = text_graph("hybrid", "hybrid", _three_outputs, example=_example)


class HybridText(TextInputEncoder):
    """Texts as they are; `unused`: the token ids whose sparse weights are dropped."""

    def __init__(self, tokenizer: TextTokenizer, unused_tokens: Sequence[str]) -> None:
        super().__init__(tokenizer)
        found = (tokenizer.token_id(token) for token in unused_tokens)
        self.unused = frozenset(i for i in found if i is not None)


class BgeM3(Family):
    name = "bge-m3"
    graphs = graphs_of(THREE_OUTPUTS)

    def recognises(self, folder: ModelFolder) -> bool:
        return not folder.reads_media and all(
            (folder.path / name).is_file() for name in hybrid.HEAD_FILES
        )

    def read(self, folder: ModelFolder) -> ModelInfo:
        head = sentence_transformers.head(folder)
        named = (folder.token(name, "") for name in UNUSED_TOKENS)
        unused = tuple(dict.fromkeys(token for token in named if token))
        # FlagEmbedding pools CLS and normalises, whatever sentence-transformers' files say.
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.EMBED, pooling="cls", normalize=True,
            towers={"text": THREE_OUTPUTS.name}, prompts=head.prompts, own_facts=unused,
        )

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        return {"text": HybridText(tokenizer, info.facts(tuple))}
