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
    key = (str(info.path), graph.auto_class, dtype, attention, spec.trust_remote_code)
    model = _LOADED.get(key)
    if model is None:
        model = _LOADED[key] = _load(info, spec, graph, dtype, attention)
    return model


def _load(info: ModelInfo, spec: ModelSpec, graph: Graph, dtype: torch.dtype, attention: str) -> Any:
    kwargs = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code}
    auto_class = getattr(transformers, graph.auto_class)
    try:
        try:
            model = auto_class.from_pretrained(str(info.path), attn_implementation=attention, **kwargs)
        except (ValueError, ImportError):  # architectures without that attention implementation
            model = auto_class.from_pretrained(str(info.path), **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"cannot load weights from {info.path}: {exc}") from exc
    return model.eval()


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
