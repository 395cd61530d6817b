"""A family's graph (`families.base.Graph`) as a torch module over the transformers model:
one definition shared by the torch backend and the ONNX export, so every backend computes the
same thing. Imports torch: only backends that run or export it load this.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import transformers

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import ModelLoadError
from infinity_cloud.core.family import Graph, GraphOutput, ModelInfo

# Two towers of one model (CLIP's text and image graphs) share its weights in memory.
_LOADED: weakref.WeakValueDictionary[tuple[Any, ...], torch.nn.Module] = weakref.WeakValueDictionary()


def load_model(
    info: ModelInfo, spec: ModelSpec, graph: Graph, dtype: torch.dtype, attention: str
) -> torch.nn.Module:
    """The transformers model that `graph` runs, in eval mode; loaded once per process while
    some graph holds it."""
    model_class = _model_class(info, graph)
    key = (str(info.path), model_class.__name__, dtype, attention, spec.trust_remote_code)
    model = _LOADED.get(key)
    if model is None:
        model = _LOADED[key] = _load(info, spec, model_class, dtype, attention)
    return model


def _model_class(info: ModelInfo, graph: Graph) -> Any:
    """The class `graph` is built from: its family's auto class, except that where that is the
    bare AutoModel, a bare model class the folder's `architectures` names (no head: no "For" in
    its name) is loaded as named. AutoModel picks by model_type, which for T5 gives the
    encoder-decoder where the folder holds `T5EncoderModel`, the encoder alone. Remote code
    (`auto_map`), names transformers lacks and classes of another model_type keep AutoModel."""
    auto = getattr(transformers, graph.auto_class)
    if graph.auto_class != "AutoModel" or "AutoModel" in (info.raw.get("auto_map") or {}):
        return auto
    for name in info.architectures:
        if "For" in name or name.endswith("PreTrainedModel"):
            continue
        named = getattr(transformers, name, None)
        if (isinstance(named, type) and issubclass(named, transformers.PreTrainedModel)
                and getattr(named.config_class, "model_type", None) == info.model_type):
            return named
    return auto


def _load(info: ModelInfo, spec: ModelSpec, auto_class: Any, dtype: torch.dtype, attention: str) -> Any:
    kwargs = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code}
    try:
        try:
            model = auto_class.from_pretrained(str(info.path), attn_implementation=attention, **kwargs)
        except (ValueError, ImportError):  # architectures without that attention implementation
            model = auto_class.from_pretrained(str(info.path), **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"cannot load weights from {info.path}: {exc}") from exc
    if auto_class is transformers.AutoModel and _is_encoder_decoder(model):
        # An encoder-decoder (a T5ForConditionalGeneration folder) embeds with its encoder, as
        # sentence-transformers does; its decoder would get no input.
        model = model.get_encoder()
    return model.eval()


def _is_encoder_decoder(model: torch.nn.Module) -> bool:
    return isinstance(getattr(model, "encoder", None), torch.nn.Module) and isinstance(
        getattr(model, "decoder", None), torch.nn.Module)


class GraphModule(torch.nn.Module):
    """`model` as the graph `graph`: positional tensors named `input_names` in, one tensor out
    (positional, so torch.onnx traces it as is)."""

    def __init__(self, model: torch.nn.Module, graph: Graph) -> None:
        super().__init__()
        self.model = model
        self.graph = graph
        self.input_names: tuple[str, ...] = graph.inputs(model)
        self.eval()  # a new module trains by default; exporting would put the model back so

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.graph.forward(self.model, dict(zip(self.input_names, tensors, strict=True)))


def build_graph(
    info: ModelInfo, spec: ModelSpec, name: GraphOutput, dtype: torch.dtype, attention: str
) -> GraphModule:
    graph = info.family.graph(name)
    return GraphModule(load_model(info, spec, graph, dtype, attention), graph)
