"""Each graph a backend runs (`model_files.GraphOutput`), built in torch from the
transformers model: one definition shared by the torch backend and the ONNX export, so every
backend computes the same thing. Imports torch: only backends that run or export it load this.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForSequenceClassification,
)

from infinity_cloud.config import ModelSpec
from infinity_cloud.errors import ModelLoadError
from infinity_cloud.model_files import GraphOutput, ModelInfo

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
IMAGE_INPUTS = ("pixel_values",)
AUDIO_INPUTS = ("input_features",)


def _auto_class(graph: GraphOutput) -> Any:
    if graph == "logits":
        return AutoModelForSequenceClassification
    if graph.startswith("splade"):
        return AutoModelForMaskedLM
    if graph.startswith(("colpali", "colqwen2")):
        return AutoModelForPreTraining  # Col*ForRetrieval: AutoModel does not map them
    return AutoModel  # encoders, and CLIP/SigLIP whose towers are methods of the whole model


# Two towers of one model (CLIP's text and image graphs) share its weights in memory.
_LOADED: weakref.WeakValueDictionary[tuple[Any, ...], torch.nn.Module] = weakref.WeakValueDictionary()


def load_model(
    info: ModelInfo, spec: ModelSpec, graph: GraphOutput, dtype: torch.dtype, attention: str
) -> torch.nn.Module:
    """The transformers model that `graph` runs, in eval mode; loaded once per process while
    some graph holds it."""
    key = (str(info.path), _auto_class(graph).__name__, dtype, attention, spec.trust_remote_code)
    model = _LOADED.get(key)
    if model is None:
        model = _LOADED[key] = _load(info, spec, graph, dtype, attention)
    return model


def _load(info: ModelInfo, spec: ModelSpec, graph: GraphOutput, dtype: torch.dtype, attention: str) -> Any:
    kwargs = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code}
    auto_class = _auto_class(graph)
    try:
        try:
            model = auto_class.from_pretrained(str(info.path), attn_implementation=attention, **kwargs)
        except (ValueError, ImportError):  # architectures without that attention implementation
            model = auto_class.from_pretrained(str(info.path), **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"cannot load weights from {info.path}: {exc}") from exc
    return model.eval()


def takes_token_types(model: torch.nn.Module) -> bool:
    import inspect

    params = inspect.signature(model.forward).parameters
    return "token_type_ids" in params and bool(getattr(model.config, "type_vocab_size", 0))


def _pooled(out: Any) -> torch.Tensor:
    """transformers 5 returns the tower's output object (projected `pooler_output`); older
    versions the tensor itself."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class Graph(torch.nn.Module):
    """`model` as the graph `kind`: positional tensors named `input_names` in, one tensor out
    (positional, so torch.onnx traces it as is)."""

    def __init__(self, model: torch.nn.Module, kind: GraphOutput) -> None:
        super().__init__()
        self.model = model
        self.kind = kind
        self.eval()  # a new module trains by default; exporting would put the model back so
        if kind == "image_embeds":
            self.input_names: tuple[str, ...] = IMAGE_INPUTS
        elif kind == "audio_embeds":
            self.input_names = AUDIO_INPUTS
        elif kind == "colqwen2_text":
            self.input_names = TEXT_INPUTS[:2]
        elif kind == "colqwen2_image":
            self.input_names = (*TEXT_INPUTS[:2], *IMAGE_INPUTS, "image_grid_thw")
        elif kind.startswith("colpali"):
            # Token types (all zero) make PaliGemma attend both ways over the real tokens;
            # without them a padded batch is read causally.
            self.input_names = TEXT_INPUTS + (IMAGE_INPUTS if kind == "colpali_image" else ())
        elif kind == "text_embeds" and model.config.model_type == "siglip":
            self.input_names = TEXT_INPUTS[:1]  # trained without a mask (`ModelInfo.pad_to_max_length`)
        elif kind == "text_embeds" or not takes_token_types(model):
            self.input_names = TEXT_INPUTS[:2]
        else:
            self.input_names = TEXT_INPUTS

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        feed = dict(zip(self.input_names, tensors, strict=True))
        kind = self.kind
        if kind == "token_states":
            return self.model(**feed).last_hidden_state
        if kind == "logits":
            return self.model(**feed).logits
        if kind == "text_embeds":
            return _pooled(self.model.get_text_features(**feed))
        if kind == "image_embeds":
            return _pooled(self.model.get_image_features(**feed))
        if kind == "audio_embeds":  # unfused CLAP: `is_longer` is not read
            return _pooled(self.model.get_audio_features(**feed))
        if kind.startswith(("colpali", "colqwen2")):
            return self.model(**feed).embeddings  # normalised per token, zero where masked
        return _splade(self.model(**feed).logits, feed["attention_mask"], kind)


def _splade(logits: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """log(1 + relu(logit)) per vocabulary term, masked, pooled over the sequence (SPLADE;
    sentence-transformers' SpladePooling)."""
    weights = torch.log1p(torch.relu(logits * mask.unsqueeze(-1).to(logits.dtype)))
    if kind.endswith("_log1p"):
        weights = torch.log1p(weights)
    return weights.amax(dim=1) if kind.startswith("splade_max") else weights.sum(dim=1)


def build_graph(
    info: ModelInfo, spec: ModelSpec, kind: GraphOutput, dtype: torch.dtype, attention: str
) -> Graph:
    return Graph(load_model(info, spec, kind, dtype, attention), kind)
