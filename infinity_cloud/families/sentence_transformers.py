"""sentence-transformers' modules after the transformer (modules.json): pooling, Dense,
Normalize, SPLADE pooling and ColBERT's multi-vector mask, read into what the engine
reproduces. Shared by the families that are sentence-transformers folders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infinity_cloud.core.errors import ModelLoadError
from infinity_cloud.core.family import DenseLayer
from infinity_cloud.families.folder import ModelFolder, read_json

# sentence-transformers' names for the pooling modes the engine has, to the engine's names.
_POOLING_MODES = {
    "cls": "cls",
    "lasttoken": "lasttoken",
    "max": "max",
    "mean": "mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
}
# Older sentence-transformers versions write one boolean per mode instead.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
# Modules the engine reproduces; any other changes the output, so a model that has one is
# refused rather than served with different vectors.
_KNOWN_MODULES = {
    "Transformer", "MLMTransformer", "Pooling", "Dense", "Normalize", "SpladePooling", "MultiVectorMask",
}


@dataclass(frozen=True)
class LateInteraction:
    """How a ColBERT-style model (sentence-transformers' MultiVectorEncoder) reads queries and
    documents: token limits per role, query expansion (queries padded with a token whose
    vectors count in scoring; the encoder attends to them or not), and tokens (punctuation)
    dropped from documents' vectors."""

    query_length: int | None = None
    document_length: int | None = None
    expansion: str | None = None  # "fixed": every query exactly `expansion_length`; "min": at least
    expansion_length: int = 32
    expansion_token: str | None = None  # None: the tokenizer's mask token
    attend_expansion: bool = False
    skiplist: tuple[str, ...] = ()
    skiplist_roles: tuple[str, ...] = ("document",)


@dataclass(frozen=True)
class Head:
    """What a folder's modules do after the transformer. A multi-vector model's Dense and
    Normalize work on token vectors; its modules that read a sentence vector (there is none)
    do nothing."""

    pooling: str | None = None
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = False
    splade: str | None = None  # the graph of a SpladePooling module
    late_interaction: LateInteraction | None = None
    prompts: dict[str, str] = field(default_factory=dict)


def pooling_mode(config: dict[str, Any]) -> str:
    modes = config.get("pooling_mode")  # sentence-transformers 6 writes one key
    if modes is None:
        modes = [mode for key, mode in _LEGACY_POOLING_KEYS.items() if config.get(key)]
    if isinstance(modes, str):
        modes = [modes]
    if not modes:
        raise ModelLoadError(f"unsupported pooling configuration: {config}")
    if len(modes) > 1:
        raise ModelLoadError(f"combined pooling modes {list(modes)} are not supported")
    if modes[0] not in _POOLING_MODES:
        raise ModelLoadError(f"pooling mode {modes[0]!r} is not supported")
    return _POOLING_MODES[modes[0]]


def _load_dense(folder: ModelFolder, module: str) -> DenseLayer:
    path = folder.path / module
    config = read_json(path / "config.json") or {}
    weights: dict[str, np.ndarray]
    if (path / "model.safetensors").is_file():
        from safetensors.numpy import load_file

        weights = load_file(str(path / "model.safetensors"))
    elif (path / "pytorch_model.bin").is_file():
        import torch  # only old checkpoints need it, and they come with the torch backend

        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        weights = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise ModelLoadError(f"Dense module {path} holds no weights")
    weight = next((v for k, v in weights.items() if k.endswith("weight")), None)
    bias = next((v for k, v in weights.items() if k.endswith("bias")), None)
    if weight is None:
        raise ModelLoadError(f"Dense module {path} holds no weight tensor")
    activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))  # type: ignore[union-attr]
    return DenseLayer(
        weight=weight.astype(np.float32),
        bias=None if bias is None else bias.astype(np.float32),
        activation=activation.rsplit(".", 1)[-1],
    )


def splade_graph(config: dict[str, Any]) -> str:
    """A `SpladePooling` module's graph."""
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ModelLoadError(f"SPLADE pooling {strategy!r} with activation {activation!r} is not supported")
    return f"splade_{strategy}" + ("_log1p" if activation == "log1p_relu" else "")


def _late_interaction(folder: ModelFolder, mask: dict[str, Any]) -> LateInteraction:
    transformer = folder.sentence_bert_config
    expansion = transformer.get("query_expansion") or {}
    if expansion and expansion.get("strategy") not in ("fixed", "min"):
        raise ModelLoadError(f"query expansion {expansion.get('strategy')!r} is not supported")
    if mask.get("keep_only_token_ids"):
        raise ModelLoadError("a multi-vector mask that keeps only some token ids is not supported")
    roles = mask.get("skiplist_tasks", ["document"])
    return LateInteraction(
        query_length=transformer.get("query_length"),
        document_length=transformer.get("document_length"),
        expansion=expansion.get("strategy"),
        expansion_length=int(expansion.get("length") or 32),
        # sentence-transformers expands with the mask token unless told another
        expansion_token=expansion.get("token") or folder.token("mask_token", "[MASK]"),
        attend_expansion=bool(expansion.get("attend", False)),
        skiplist=tuple(mask.get("skiplist_words") or ()),
        skiplist_roles=(roles,) if isinstance(roles, str) else tuple(roles),
    )


def _read_head(folder: ModelFolder) -> Head:
    modules = folder.modules or []
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    multi_vector = "MultiVectorMask" in kinds
    facts: dict[str, Any] = {"dense": []}
    for kind, module in zip(kinds, modules, strict=True):
        where = str(module.get("path", ""))
        if kind not in _KNOWN_MODULES:
            raise ModelLoadError(
                f"{folder.path.name} uses the sentence-transformers module {kind!r}, which this version "
                "does not serve"
            )
        config = _config(read_json(folder.path / where / "config.json"))
        per_token = config.get("module_input_name", "sentence_embedding") == "token_embeddings"
        if kind in ("Dense", "Normalize") and per_token != multi_vector:
            if multi_vector:
                continue  # reads a sentence vector, which a multi-vector model never makes
            raise ModelLoadError(
                f"{folder.path.name}: a {kind} module on token vectors before pooling is not supported"
            )
        if kind == "Pooling":
            facts["pooling"] = pooling_mode(config)
        elif kind == "Dense":
            facts["dense"].append(_load_dense(folder, where))
        elif kind == "Normalize":
            facts["normalize"] = True
        elif kind == "SpladePooling":
            facts["splade"] = splade_graph(config)
        elif kind == "MultiVectorMask":
            facts["late_interaction"] = _late_interaction(folder, config)
    prompts = folder.sentence_transformers_config.get("prompts")
    if isinstance(prompts, dict):
        facts["prompts"] = {str(k): str(v) for k, v in prompts.items()}
    return Head(**{**facts, "dense": tuple(facts["dense"])})


def _config(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def head(folder: ModelFolder) -> Head:
    """The folder's sentence-transformers head, read once (an empty one for a bare folder)."""
    return folder.once("sentence_transformers_head", _read_head)
