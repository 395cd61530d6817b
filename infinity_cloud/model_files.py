"""What a model is, read from its own files (config.json, sentence-transformers modules).

Reads JSON and, for `Dense` modules, small weight files; imports no ML framework, so the
engine can decide what to load before paying for torch or transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from infinity_cloud.capability import Capability
from infinity_cloud.errors import ModelLoadError, UnsupportedError

# What a network's graph returns, which is all a backend needs to know (backends/graphs.py
# builds each from the transformers model):
# - token_states: an encoder's last hidden states (batch, length, width);
# - logits: a sequence classifier's (batch, labels);
# - splade_max / splade_sum: a masked-LM's vocabulary logits, log(1 + relu) and pooled over
#   the sequence (batch, vocabulary); `_log1p`: a second log1p (OpenSearch's `log1p_relu`).
#   Pooled inside the graph: the (batch, length, vocabulary) logits are 120 KB per token
#   and must not cross into the engine;
# - text_embeds / image_embeds: one tower of a two-tower model (CLIP, SigLIP), projected
#   (batch, width); audio_embeds: CLAP's audio tower, likewise;
# - colpali_text / colpali_image: ColPali's token vectors (batch, length, width), normalised
#   and zero where masked, for a query (tokens) or a page (an image behind its prompt tokens);
#   colqwen2_text / colqwen2_image: ColQwen2's, likewise (a page's patches and their grid).
GraphOutput = Literal[
    "token_states", "logits", "splade_max", "splade_sum", "splade_max_log1p", "splade_sum_log1p",
    "text_embeds", "image_embeds", "audio_embeds", "colpali_text", "colpali_image", "colqwen2_text",
    "colqwen2_image",
]
# A tower is the graph that takes one modality; text-only models have one, CLIP two.
Tower = Literal["text", "image", "audio"]


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers `Dense` module: activation(x @ weight.T + bias)."""

    weight: np.ndarray
    bias: np.ndarray | None
    activation: str


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
class ModelInfo:
    path: Path
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
    # The image tower's input side and patch (vision_config), for image models.
    image_size: int | None = None
    patch_size: int | None = None
    # SigLIP was trained on texts padded to its full length, without an attention mask: its
    # text tower pools the last position, so it must see what it was trained on.
    pad_to_max_length: bool = False
    # Text a model reads around its inputs, "{}" standing for the input (ColPali's query
    # "<bos>Question: {}<pad>...\n"; "image": the prompt its pages are read behind).
    templates: dict[str, str] = field(default_factory=dict)
    # The image processor's settings (preprocessor_config.json, or inside processor_config.json).
    image_processor: dict[str, Any] = field(default_factory=dict, repr=False)
    # The audio feature extractor's settings, likewise.
    audio_processor: dict[str, Any] = field(default_factory=dict, repr=False)
    late_interaction: LateInteraction | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

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


def _read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


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


def _pooling_mode(config: dict[str, Any]) -> str:
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


def _load_dense(folder: Path) -> DenseLayer:
    config = _read_json(folder / "config.json") or {}
    weights: dict[str, np.ndarray]
    if (folder / "model.safetensors").is_file():
        from safetensors.numpy import load_file

        weights = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        import torch  # only old checkpoints need it, and they come with the torch backend

        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        weights = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise ModelLoadError(f"Dense module {folder} holds no weights")
    weight = next((v for k, v in weights.items() if k.endswith("weight")), None)
    bias = next((v for k, v in weights.items() if k.endswith("bias")), None)
    if weight is None:
        raise ModelLoadError(f"Dense module {folder} holds no weight tensor")
    activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))
    return DenseLayer(
        weight=weight.astype(np.float32),
        bias=None if bias is None else bias.astype(np.float32),
        activation=activation.rsplit(".", 1)[-1],
    )


def _splade_graph(config: dict[str, Any]) -> GraphOutput:
    """A `SpladePooling` module's graph."""
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ModelLoadError(f"SPLADE pooling {strategy!r} with activation {activation!r} is not supported")
    return f"splade_{strategy}" + ("_log1p" if activation == "log1p_relu" else "")  # type: ignore[return-value]


# sentence-transformers modules the engine reproduces; any other changes the output, so a
# model that has one is refused rather than served with different vectors.
_KNOWN_MODULES = {
    "Transformer", "MLMTransformer", "Pooling", "Dense", "Normalize", "SpladePooling", "MultiVectorMask",
}


def _late_interaction(transformer: dict[str, Any], mask: dict[str, Any]) -> LateInteraction:
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
        expansion_token=expansion.get("token"),
        attend_expansion=bool(expansion.get("attend", False)),
        skiplist=tuple(mask.get("skiplist_words") or ()),
        skiplist_roles=(roles,) if isinstance(roles, str) else tuple(roles),
    )


def _sentence_transformers_head(path: Path, modules: list[dict[str, Any]]) -> dict[str, Any]:
    """What the modules after the transformer do. A multi-vector model's Dense and Normalize
    work on token vectors; its modules that read a sentence vector (there is none) do nothing."""
    head: dict[str, Any] = {"dense": [], "normalize": False}
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    multi_vector = "MultiVectorMask" in kinds
    for kind, module in zip(kinds, modules, strict=True):
        folder = path / str(module.get("path", ""))
        if kind not in _KNOWN_MODULES:
            raise ModelLoadError(
                f"{path.name} uses the sentence-transformers module {kind!r}, which this version "
                "does not serve"
            )
        config = _read_json(folder / "config.json") or {}
        per_token = config.get("module_input_name", "sentence_embedding") == "token_embeddings"
        if kind in ("Dense", "Normalize") and per_token != multi_vector:
            if multi_vector:
                continue  # reads a sentence vector, which a multi-vector model never makes
            raise ModelLoadError(
                f"{path.name}: a {kind} module on token vectors before pooling is not supported"
            )
        if kind == "Pooling":
            head["pooling"] = _pooling_mode(config)
        elif kind == "Dense":
            head["dense"].append(_load_dense(folder))
        elif kind == "Normalize":
            head["normalize"] = True
        elif kind == "SpladePooling":
            head["splade"] = _splade_graph(config)
        elif kind == "MultiVectorMask":
            transformer = _read_json(path / "sentence_bert_config.json") or {}
            head["late_interaction"] = _late_interaction(transformer, config)
    return head


def _max_length(path: Path, config: dict[str, Any], tok_config: dict[str, Any]) -> int:
    st_config = _read_json(path / "sentence_bert_config.json") or {}
    positions = int(config.get("max_position_embeddings") or 0)
    if config.get("model_type") in {"roberta", "xlm-roberta", "camembert", "longformer"}:
        positions -= 2  # these offset positions by the padding index
    candidates = [positions] if positions > 0 else []
    if st_config.get("max_seq_length"):
        candidates.append(int(st_config["max_seq_length"]))
    elif isinstance(limit := tok_config.get("model_max_length"), int | float) and limit < 1e6:
        candidates.append(int(limit))  # transformers writes a huge sentinel for "no limit"
    if not candidates:
        return 512
    return min(candidates)


def read_model_info(path: Path, pooling: str | None = None) -> ModelInfo:
    """Detect a model's capability, pooling, head and limits from its folder. `pooling`
    "splade" serves a bare masked-LM folder (no sentence-transformers modules) as SPLADE,
    as TEI's `--pooling splade` does."""
    config = _read_json(path / "config.json")
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} holds no readable config.json")
    architectures = tuple(config.get("architectures") or ())
    model_type = str(config.get("model_type", ""))
    if "vision_config" in config or "audio_config" in config or "vlm_config" in config:
        return _two_tower_info(path, config, model_type, architectures)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    tok_config = _read_json(path / "tokenizer_config.json") or {}
    pad = tok_config.get("pad_token")
    common = {
        "path": path,
        "model_type": model_type,
        "architectures": architectures,
        "max_length": _max_length(path, config, tok_config),
        "hidden_size": int(text.get("hidden_size") or text.get("d_model") or text.get("dim") or 0),
        "vocab_size": text.get("vocab_size"),
        "pad_token": pad.get("content") if isinstance(pad, dict) else pad,
        "raw": config,
    }
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        id2label = config.get("id2label") or {}
        labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
        n_labels = int(config.get("num_labels") or len(labels) or 1)
        if n_labels == 1:
            return ModelInfo(capability=Capability.RERANK, labels=labels, towers={"text": "logits"}, **common)
        labels = labels or tuple(f"LABEL_{i}" for i in range(n_labels))
        return ModelInfo(capability=Capability.CLASSIFY, labels=labels, towers={"text": "logits"}, **common)
    modules = _read_json(path / "modules.json")
    head = _sentence_transformers_head(path, modules) if isinstance(modules, list) else {}
    st_config = _read_json(path / "config_sentence_transformers.json")
    prompts = st_config.get("prompts") if isinstance(st_config, dict) else None
    common["prompts"] = {str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {}
    if pooling == "splade" and "splade" not in head:
        if not any(a.endswith("ForMaskedLM") for a in architectures):
            raise ModelLoadError(
                f"--pooling splade needs a masked-language model (a *ForMaskedLM architecture); "
                f"{path.name} is {', '.join(architectures) or model_type or 'another kind'}"
            )
        head["splade"] = "splade_max"  # sentence-transformers' default for such a folder
    if "splade" in head:
        splade = {"text": head["splade"]}
        return ModelInfo(capability=Capability.SPARSE, towers=splade, pooling="splade", **common)
    if "late_interaction" in head:
        rules = head["late_interaction"]
        if rules.expansion_token is None:  # sentence-transformers expands with the mask token
            rules = replace(rules, expansion_token=_tokens(tok_config, "mask_token", "[MASK]"))
        return ModelInfo(
            capability=Capability.MULTI_VECTOR, normalize=head["normalize"], dense=tuple(head["dense"]),
            late_interaction=rules, **common,
        )
    return ModelInfo(
        capability=Capability.EMBED,
        pooling=head.get("pooling", "mean"),
        normalize=head.get("normalize", False),
        dense=tuple(head.get("dense", ())),
        **common,
    )


# Two-tower models whose towers transformers exposes as get_text_features/get_image_features.
_TWO_TOWERS = {"clip", "siglip"}
_SERVED_MULTIMODAL = (*sorted(_TWO_TOWERS), "clap", "colpali", "colqwen2")


def _image_processor(path: Path, kind: str = "image_processor") -> dict[str, Any]:
    """Hub folders keep it in preprocessor_config.json; transformers 5 saves it inside
    processor_config.json (`kind`: image_processor or feature_extractor)."""
    own = _read_json(path / "preprocessor_config.json")
    if isinstance(own, dict):
        return own
    processor = _read_json(path / "processor_config.json")
    nested = processor.get(kind) if isinstance(processor, dict) else None
    return nested if isinstance(nested, dict) else {}


def _clap_info(path: Path, config: dict[str, Any], architectures: tuple[str, ...]) -> ModelInfo:
    """CLAP: a RoBERTa text tower and an HTSAT audio tower into one space, normalised."""
    text, audio = config.get("text_config") or {}, config.get("audio_config") or {}
    if audio.get("enable_fusion"):
        raise UnsupportedError(
            f"{path.name} is a fused CLAP model (random crops of long audio); unfused CLAP models are served"
        )
    tok_config = _read_json(path / "tokenizer_config.json") or {}
    pad = tok_config.get("pad_token")
    positions = int(text.get("max_position_embeddings") or 514) - 2  # RoBERTa offsets by padding
    limit = tok_config.get("model_max_length")
    if isinstance(limit, int | float) and limit < 1e6:  # transformers' sentinel for "no limit" is huge
        positions = min(positions, int(limit))
    return ModelInfo(
        path=path,
        capability=Capability.EMBED,
        model_type="clap",
        architectures=architectures,
        max_length=positions,
        hidden_size=int(config.get("projection_dim") or 512),
        vocab_size=text.get("vocab_size"),
        pad_token=pad.get("content") if isinstance(pad, dict) else pad,
        normalize=True,
        towers={"text": "text_embeds", "audio": "audio_embeds"},
        audio_processor=_image_processor(path, "feature_extractor"),
        raw=config,
    )


def _tokens(tok_config: dict[str, Any], name: str, default: str) -> str:
    value = tok_config.get(name) or default
    return str(value.get("content", default)) if isinstance(value, dict) else str(value)


def _page_reader_info(
    path: Path, config: dict[str, Any], architectures: tuple[str, ...], model_type: str,
    templates: dict[str, str], **facts: Any,
) -> ModelInfo:
    """A vision-language model read to one normalised vector per token (ColPali, ColQwen2):
    queries as text, pages as images behind a prompt (`templates`)."""
    vlm = config.get("vlm_config") or {}
    text = vlm.get("text_config") or vlm
    return ModelInfo(
        path=path,
        capability=Capability.MULTI_VECTOR,
        model_type=model_type,
        architectures=architectures,
        max_length=int(text.get("max_position_embeddings") or 512),
        hidden_size=int(config.get("embedding_dim") or 128),
        vocab_size=vlm.get("vocab_size") or text.get("vocab_size"),
        towers={"text": f"{model_type}_text", "image": f"{model_type}_image"},  # type: ignore[dict-item]
        templates=templates,
        image_processor=_image_processor(path),
        raw=config,
        **facts,
    )


def _processor_config(path: Path) -> dict[str, Any]:
    processor = _read_json(path / "processor_config.json")
    return processor if isinstance(processor, dict) else {}


def _colpali_info(path: Path, config: dict[str, Any], architectures: tuple[str, ...]) -> ModelInfo:
    """ColPali (PaliGemma): a page is its image tokens, then "<bos>Describe the image.\n"; a
    query "<bos>Question: ...", padded with ten <pad> ("query augmentation"), which count."""
    vision = (config.get("vlm_config") or {}).get("vision_config") or {}
    tok_config = _read_json(path / "tokenizer_config.json") or {}
    processor = _processor_config(path)
    bos, pad = _tokens(tok_config, "bos_token", "<bos>"), _tokens(tok_config, "pad_token", "<pad>")
    image_size, patch_size = int(vision.get("image_size") or 448), int(vision.get("patch_size") or 14)
    image_tokens = int(_image_processor(path).get("image_seq_length") or (image_size // patch_size) ** 2)
    query_prefix = processor.get("query_prefix", "Question: ")
    visual_prefix = processor.get("visual_prompt_prefix", "Describe the image.")
    templates = {
        "query": f"{bos}{query_prefix}{{}}{pad * 10}\n",
        "image": "<image>" * image_tokens + f"{bos}{visual_prefix}\n",
    }
    return _page_reader_info(
        path, config, architectures, "colpali", templates, pad_token=pad, image_size=image_size,
        patch_size=patch_size,
    )


def _colqwen2_info(path: Path, config: dict[str, Any], architectures: tuple[str, ...]) -> ModelInfo:
    """ColQwen2 (Qwen2-VL): a page is a chat turn holding as many image tokens as its merged
    patches; a query "Query: ...", padded with ten pad tokens."""
    tok_config = _read_json(path / "tokenizer_config.json") or {}
    processor = _processor_config(path)
    pad = _tokens(tok_config, "pad_token", "<|endoftext|>")  # also the query augmentation token
    visual = processor.get("visual_prompt_prefix") or (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image."
        "<|im_end|><|endoftext|>"
    )
    templates = {"query": f"{processor.get('query_prefix') or 'Query: '}{{}}{pad * 10}\n", "image": visual}
    return _page_reader_info(path, config, architectures, "colqwen2", templates, pad_token=pad)


def _two_tower_info(
    path: Path, config: dict[str, Any], model_type: str, architectures: tuple[str, ...]
) -> ModelInfo:
    """CLIP and SigLIP: a text tower and an image tower into one space, normalised."""
    if model_type == "colpali":
        return _colpali_info(path, config, architectures)
    if model_type == "colqwen2":
        return _colqwen2_info(path, config, architectures)
    if model_type == "clap":
        return _clap_info(path, config, architectures)
    if model_type not in _TWO_TOWERS:
        raise UnsupportedError(
            f"{path.name} is a {model_type or 'multimodal'} model; image and audio models served are "
            f"{', '.join(_SERVED_MULTIMODAL)}"
        )
    text = config.get("text_config") or {}
    vision = config.get("vision_config") or {}
    tok_config = _read_json(path / "tokenizer_config.json") or {}
    pad = tok_config.get("pad_token")
    # CLIP projects both towers to projection_dim; SigLIP's text head keeps the text width.
    width = config.get("projection_dim") or text.get("projection_size") or text.get("hidden_size")
    return ModelInfo(
        path=path,
        capability=Capability.EMBED,
        model_type=model_type,
        architectures=architectures,
        max_length=_max_length(path, text, tok_config),
        hidden_size=int(width or 0),
        vocab_size=text.get("vocab_size"),
        pad_token=pad.get("content") if isinstance(pad, dict) else pad,
        normalize=True,
        towers={"text": "text_embeds", "image": "image_embeds"},
        image_size=int(vision.get("image_size") or 224),
        patch_size=int(vision.get("patch_size") or 32),
        pad_to_max_length=model_type == "siglip",
        image_processor=_image_processor(path),
        raw=config,
    )
