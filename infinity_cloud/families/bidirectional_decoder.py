"""A decoder read both ways (EmbeddingGemma: Gemma3TextModel with `use_bidirectional_attention:
true`): a text encoder whose graph hands the model its attention masks, one per layer type,
made here with plain tensor operations. transformers makes them with `vmap` over mask
functions, which torch.onnx cannot trace (`RuntimeError: unordered_map::at`), so the ONNX
export, and the OpenVINO IR converted from it, failed and the model fell back to torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infinity_cloud.families.base import graphs_of, text_graph
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.text_encoder import TextEncoder

# The layer types whose masks are made here: every key attends every other one (full), or
# those closer than the sliding window on either side (sliding).
LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def reads_both_ways(config: Mapping[str, Any]) -> bool:
    """Whether a decoder's config makes every token attend to both sides, with layer types
    whose masks `layer_masks` makes (a model that takes them as a dict by layer type)."""
    layer_types = config.get("layer_types")
    if config.get("use_bidirectional_attention") is not True or not isinstance(layer_types, list):
        return False
    windowed = "sliding_attention" not in layer_types or isinstance(config.get("sliding_window"), int)
    return bool(layer_types) and set(layer_types) <= LAYER_TYPES and windowed


def layer_masks(model: Any, attention_mask: Any, dtype: Any) -> dict[str, Any]:
    """The additive masks (batch, 1, query, key) by layer type that transformers would make for
    a bidirectional model: padding keys masked; in sliding layers, keys a window or more away
    too. Additive, not boolean: a padding query whose window holds only padding gets an even
    softmax over it, not NaN (which a boolean SDPA mask gives and matmul spreads)."""
    import torch

    length = attention_mask.shape[1]
    keys = attention_mask[:, None, None, :].bool()
    positions = torch.arange(length, device=attention_mask.device)
    near = (positions[:, None] - positions[None, :]).abs() < model.config.sliding_window
    allowed = {"full_attention": keys.expand(-1, 1, length, length), "sliding_attention": keys & near}
    lowest = torch.finfo(dtype).min
    return {kind: torch.zeros(allowed[kind].shape, dtype=dtype, device=attention_mask.device)
            .masked_fill(~allowed[kind], lowest) for kind in set(model.config.layer_types)}


def _states(model: Any, feed: dict[str, Any]) -> Any:
    masks = layer_masks(model, feed["attention_mask"], model.dtype)
    return model(input_ids=feed["input_ids"], attention_mask=masks).last_hidden_state


TOKEN_STATES_BOTH_WAYS = text_graph("token_states", "token_states", _states, own_onnx=True)


class BidirectionalDecoder(TextEncoder):
    name = "bidirectional-decoder"
    graphs = graphs_of(TOKEN_STATES_BOTH_WAYS)

    def recognises(self, folder: ModelFolder) -> bool:
        return super().recognises(folder) and reads_both_ways(folder.config)
