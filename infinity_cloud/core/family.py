"""What a model family is, as every layer sees it: the `ModelFamily` protocol, the `Graph`s it
declares, and the `ModelInfo` it reads from a folder (the families themselves live in
`infinity_cloud.families`). Here, below the backends, because they run a family's graphs; it
imports no ML framework, so the engine can decide what to load before paying for torch or
transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.input_kind import InputKind

# A family's own facts (`ModelInfo.facts`).
F = TypeVar("F")

# A graph's name: which of its family's graphs (`ModelFamily.graph`) a backend runs.
GraphOutput = str
# A tower is the graph that takes one kind of input (`input_kind.InputKind`), named by its
# kind: text-only models have one, CLIP two. A family declares the kinds it brings
# (`Family.kinds`); only the tower's input encoder reads what goes in.
Tower = str
# What a graph returns, which is what the tasks' heads read (`numerics/heads.py`):
# - token_states: (batch, length, width) states, to pool or to keep per token;
# - vectors: (batch, width), pooled inside the graph (CLIP's towers);
# - scores: (batch, labels) logits;
# - terms: (batch, vocabulary) term weights (SPLADE), pooled inside the graph;
# - token_vectors: (batch, length, width) final per-token vectors, normalised, zero where masked;
# - hybrid: (batch, length, 1 + width) a dense, a sparse and a multi-vector output packed
#   (bge-m3's, `numerics/hybrid.py`).
Returns = Literal["token_states", "vectors", "scores", "terms", "token_vectors", "hybrid"]
# An export example: the traced inputs (torch tensors, in the graph's input order) and each
# input's dynamic axes.
Example = tuple[tuple[Any, ...], dict[str, dict[int, str]]]


@dataclass(frozen=True)
class Graph:
    """One graph a backend runs, declared by its family and built from the transformers model
    that `auto_class` loads: `forward(model, feed)` maps the named input tensors (`inputs(model)`
    names them, in order) to one tensor; `example(info, names)` is what an export traces it
    with. Plain data here; only what runs torch calls `forward` and `example`."""

    name: GraphOutput
    returns: Returns
    forward: Callable[[Any, dict[str, Any]], Any]
    inputs: Callable[[Any], tuple[str, ...]]
    example: Callable[[ModelInfo, tuple[str, ...]], Example]
    auto_class: str = "AutoModel"
    # torch.onnx traces it (the ONNX Runtime and OpenVINO backends start from that file).
    traceable: bool = True
    # A folder's own model.onnx (optimum-cli's) holds this graph, and is used as is.
    own_onnx: bool = False
    # Bytes one token holds in the graph's intermediates when they are far larger than its
    # states (SPLADE's vocabulary logits): a batch's tokens are capped to fit.
    token_bytes: Callable[[ModelInfo], int] | None = None

    @property
    def per_token(self) -> bool:
        """Whether its output has a row per position (its sequence axis varies)."""
        return self.returns in ("token_states", "token_vectors", "hybrid")


class ModelFamily(Protocol):
    """What the engine asks of the family that read a model (`infinity_cloud.families`):
    its graphs, and each tower's input encoder (how its inputs become model inputs: a
    `text.input_encoder.TextInputEncoder` for text, a `numerics.inputs.InputEncoder` for
    anything else), made with the model's tokenizer."""

    name: str
    kinds: tuple[InputKind, ...]

    def graph(self, name: GraphOutput) -> Graph: ...

    def encoders(self, info: ModelInfo, tokenizer: Any) -> dict[Tower, Any]: ...


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers `Dense` module: activation(x @ weight.T + bias)."""

    weight: np.ndarray
    bias: np.ndarray | None
    activation: str


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    family: ModelFamily  # the family that read it, which every later step asks
    capability: Capability
    model_type: str
    architectures: tuple[str, ...]
    max_length: int
    hidden_size: int
    vocab_size: int | None
    pad_token: str | None = None  # the tokenizer config's, when it names one
    pooling: str = "mean"
    normalize: bool = False
    dense: tuple[DenseLayer, ...] = ()
    labels: tuple[str, ...] = ()
    towers: dict[Tower, GraphOutput] = field(default_factory=lambda: {"text": "token_states"})
    # Named instructions prepended to inputs (sentence-transformers' `prompts`: "query", ...).
    prompts: dict[str, str] = field(default_factory=dict)
    # The family's own facts, a dataclass it defines and reads from the folder (CLIP's image
    # processor settings, ColPali's templates, ColBERT's late interaction): only the family
    # reads them, in its graphs' examples and its towers' input encoders.
    own_facts: Any = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def facts(self, kind: type[F]) -> F:
        """Its family's own facts, as the family's type `kind` (a family reads only its own)."""
        if not isinstance(self.own_facts, kind):
            read = type(self.own_facts).__name__
            raise TypeError(f"{self.path}: {kind.__name__} asked, its family read {read}")
        return self.own_facts

    @property
    def dimensions(self) -> int | None:
        """Width of an embedding (of each vector, for multi-vector models); None for scoring models."""
        if self.capability is Capability.SPARSE:
            return self.vocab_size
        if self.capability is Capability.MULTI_VECTOR:
            return int(self.dense[-1].weight.shape[0]) if self.dense else self.hidden_size
        if self.capability is not Capability.EMBED:
            return None
        return int(self.dense[-1].weight.shape[0]) if self.dense else self.hidden_size
