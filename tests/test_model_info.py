"""read_model_info: capability, pooling, head and limits detected from a model's own files,
on the tiny built folders, the real MiniLM, and configs written by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import ModelLoadError, UnsupportedError
from infinity_cloud.families import read_model_info

BERT_CONFIG = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "hidden_size": 32,
    "vocab_size": 100,
    "max_position_embeddings": 512,
}
ST_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]
LEGACY_POOLING_KEYS = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def module(idx: int, kind: str) -> dict[str, Any]:
    kind_path = f"sentence_transformers.models.{kind}"
    return {"idx": idx, "name": str(idx), "path": f"{idx}_{kind}", "type": kind_path}


def write_folder(root: Path, config: dict[str, Any] | None, files: dict[str, Any] | None = None) -> Path:
    """A model folder: config.json (unless None) plus JSON files by relative path."""
    root.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    for name, content in (files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
    return root


def st_folder(root: Path, pooling: dict[str, Any], *extra: dict[str, Any], **files: Any) -> Path:
    """A sentence-transformers folder: Transformer, Pooling, then the `extra` modules."""
    return write_folder(
        root,
        BERT_CONFIG,
        {"modules.json": [*ST_MODULES, *extra], "1_Pooling/config.json": pooling, **files},
    )


def legacy_pooling(*active: str) -> dict[str, Any]:
    """An old sentence-transformers Pooling config: one boolean per mode."""
    return {"word_embedding_dimension": 32, **{k: k in active for k in LEGACY_POOLING_KEYS}}


# -- the built folders ---------------------------------------------------------------


def test_tiny_embedder(tiny_embedder: Path) -> None:
    info = read_model_info(tiny_embedder)
    assert (info.capability, info.towers) == (Capability.EMBED, {"text": "token_states"})
    assert (info.model_type, info.architectures) == ("bert", ("BertModel",))
    assert (info.pooling, info.normalize, info.dense) == ("mean", True, ())
    assert (info.hidden_size, info.dimensions, info.max_length) == (32, 32, 128)
    assert info.vocab_size is not None and info.vocab_size > 100
    assert info.labels == ()


@pytest.mark.parametrize(
    ("options", "pooling", "normalize"),
    [
        ({"pooling": "cls"}, "cls", True),
        ({"pooling": "max", "normalize": False}, "max", False),
        ({"pooling": "lasttoken"}, "lasttoken", True),
        ({"pooling": "mean_sqrt_len_tokens", "normalize": False}, "mean_sqrt_len", False),
    ],
)
def test_st6_pooling_and_normalize(
    build_model, options: dict[str, Any], pooling: str, normalize: bool
) -> None:
    path = build_model("bert_embedder", **options)
    assert json.loads((path / "1_Pooling/config.json").read_text())["pooling_mode"]  # the ST6 key
    info = read_model_info(path)
    assert (info.pooling, info.normalize) == (pooling, normalize)


@pytest.mark.parametrize(
    ("activation", "expected"), [("torch.nn.modules.activation.Tanh", "Tanh"), (None, "Identity")]
)
def test_dense_layer_read(build_model, activation: str | None, expected: str) -> None:
    path = build_model(
        "bert_embedder", pooling="cls", normalize=False, dense_out=16, dense_activation=activation
    )
    info = read_model_info(path)
    assert info.dimensions == 16 and info.hidden_size == 32
    (layer,) = info.dense
    assert layer.activation == expected
    assert layer.weight.shape == (16, 32) and layer.weight.dtype == np.float32
    assert layer.bias is not None and layer.bias.shape == (16,)
    from safetensors.numpy import load_file

    weights = load_file(str(path / "2_Dense/model.safetensors"))
    np.testing.assert_array_equal(layer.weight, weights["linear.weight"])
    np.testing.assert_array_equal(layer.bias, weights["linear.bias"])


def test_decoder_embedder(build_model) -> None:
    info = read_model_info(build_model("decoder_embedder"))
    assert (info.capability, info.model_type) == (Capability.EMBED, "qwen2")
    assert (info.pooling, info.normalize, info.max_length) == ("lasttoken", True, 128)


def test_roberta_max_length_drops_padding_offset(build_model) -> None:
    path = build_model("roberta_embedder")
    assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == 130
    info = read_model_info(path)
    assert (info.model_type, info.max_length, info.vocab_size) == ("roberta", 128, 400)


def test_reranker(tiny_reranker: Path) -> None:
    info = read_model_info(tiny_reranker)
    assert (info.capability, info.towers) == (Capability.RERANK, {"text": "logits"})
    assert info.architectures == ("BertForSequenceClassification",)
    assert info.dimensions is None and info.max_length == 128


def test_classifier(tiny_classifier: Path) -> None:
    info = read_model_info(tiny_classifier)
    assert (info.capability, info.towers) == (Capability.CLASSIFY, {"text": "logits"})
    assert info.labels == ("negative", "neutral", "positive")
    assert info.dimensions is None


@pytest.mark.slow
def test_minilm(minilm_dir: Path) -> None:
    """Old sentence-transformers files: boolean pooling keys, max_seq_length 256, Normalize
    named in modules.json without a folder of its own."""
    info = read_model_info(minilm_dir)
    assert (info.capability, info.pooling, info.normalize) == (Capability.EMBED, "mean", True)
    assert (info.hidden_size, info.dimensions, info.max_length) == (384, 384, 256)


# -- hand-written sentence-transformers configs --------------------------------------


@pytest.mark.parametrize(
    ("pooling_mode", "expected"),
    [
        ("mean", "mean"),
        ("cls", "cls"),
        ("max", "max"),
        ("lasttoken", "lasttoken"),
        ("mean_sqrt_len_tokens", "mean_sqrt_len"),
        (["cls"], "cls"),
    ],
)
def test_st6_pooling_mode_key(tmp_path: Path, pooling_mode: Any, expected: str) -> None:
    config = {"embedding_dimension": 32, "pooling_mode": pooling_mode, "include_prompt": True}
    path = st_folder(tmp_path, config)
    assert read_model_info(path).pooling == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_max_tokens", "max"),
        ("pooling_mode_lasttoken", "lasttoken"),
        ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
    ],
)
def test_legacy_boolean_pooling_keys(tmp_path: Path, key: str, expected: str) -> None:
    assert read_model_info(st_folder(tmp_path, legacy_pooling(key))).pooling == expected


@pytest.mark.parametrize(
    "pooling",
    [
        {"pooling_mode": ["mean", "max"]},
        {"pooling_mode": "weightedmean"},
        legacy_pooling("pooling_mode_cls_token", "pooling_mode_mean_tokens"),
        legacy_pooling("pooling_mode_weightedmean_tokens"),
    ],
    ids=["st6-combined", "st6-weightedmean", "legacy-combined", "legacy-weightedmean"],
)
def test_unsupported_pooling_fails_at_load(tmp_path: Path, pooling: dict[str, Any]) -> None:
    """Pooling the engine cannot do must fail when the model loads, not on every batch."""
    with pytest.raises(ModelLoadError, match="pooling"):
        read_model_info(st_folder(tmp_path, pooling))


def test_normalize_module(tmp_path: Path) -> None:
    path = st_folder(tmp_path, {"pooling_mode": "mean"}, module(2, "Normalize"))
    assert read_model_info(path).normalize is True
    assert read_model_info(st_folder(tmp_path / "plain", {"pooling_mode": "mean"})).normalize is False


def test_no_sentence_transformers_files_defaults(tmp_path: Path) -> None:
    info = read_model_info(write_folder(tmp_path, BERT_CONFIG))
    assert info.capability is Capability.EMBED
    assert (info.pooling, info.normalize, info.dense) == ("mean", False, ())
    assert info.max_length == 512


def _dense_folder(root: Path, activation: str, weights: dict[str, np.ndarray], fmt: str) -> Path:
    config = {"in_features": 32, "out_features": 4, "activation_function": activation}
    path = st_folder(root, {"pooling_mode": "cls"}, module(2, "Dense"), **{"2_Dense/config.json": config})
    if fmt == "safetensors":
        from safetensors.numpy import save_file

        save_file(weights, str(path / "2_Dense/model.safetensors"))
    else:
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in weights.items()}, path / "2_Dense/pytorch_model.bin")
    return path


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("bias", [True, False])
def test_dense_by_hand(tmp_path: Path, fmt: str, bias: bool) -> None:
    rng = np.random.default_rng(0)
    weights = {"linear.weight": rng.standard_normal((4, 32)).astype(np.float32)}
    if bias:
        weights["linear.bias"] = rng.standard_normal(4).astype(np.float32)
    info = read_model_info(_dense_folder(tmp_path, "torch.nn.modules.activation.ReLU", weights, fmt))
    (layer,) = info.dense
    assert (layer.activation, info.dimensions) == ("ReLU", 4)
    np.testing.assert_array_equal(layer.weight, weights["linear.weight"])
    if bias:
        np.testing.assert_array_equal(layer.bias, weights["linear.bias"])
    else:
        assert layer.bias is None


def test_dense_without_weights(tmp_path: Path) -> None:
    path = st_folder(tmp_path, {"pooling_mode": "cls"}, module(2, "Dense"), **{"2_Dense/config.json": {}})
    with pytest.raises(ModelLoadError, match="no weights"):
        read_model_info(path)


# -- limits ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "files", "expected"),
    [
        ({}, {}, 512),
        ({}, {"sentence_bert_config.json": {"max_seq_length": 256}}, 256),
        ({"max_position_embeddings": 128}, {"sentence_bert_config.json": {"max_seq_length": 256}}, 128),
        ({}, {"tokenizer_config.json": {"model_max_length": 384}}, 384),
        ({}, {"tokenizer_config.json": {"model_max_length": 1e30}}, 512),  # transformers' "no limit"
        (
            {},
            {
                "sentence_bert_config.json": {"max_seq_length": 200},
                "tokenizer_config.json": {"model_max_length": 100},
            },
            200,  # sentence-transformers' own setting wins over the tokenizer's
        ),
        ({"model_type": "xlm-roberta", "max_position_embeddings": 514}, {}, 512),
        ({"max_position_embeddings": None}, {"tokenizer_config.json": {"model_max_length": 1e30}}, 512),
        ({"max_position_embeddings": None}, {"tokenizer_config.json": {"model_max_length": 8192}}, 8192),
    ],
)
def test_max_length(tmp_path: Path, config: dict[str, Any], files: dict[str, Any], expected: int) -> None:
    path = write_folder(tmp_path, {**BERT_CONFIG, **config}, files)
    assert read_model_info(path).max_length == expected


# -- classification heads --------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "capability", "labels"),
    [
        ({"id2label": {"0": "LABEL_0"}}, Capability.RERANK, ("LABEL_0",)),
        ({"num_labels": 1}, Capability.RERANK, ()),
        ({"id2label": {"1": "yes", "0": "no"}}, Capability.CLASSIFY, ("no", "yes")),
        (
            {"id2label": {str(i): f"l{i}" for i in range(12)}},
            Capability.CLASSIFY,
            tuple(f"l{i}" for i in range(12)),  # numeric order, not "0", "1", "10", "11", "2"...
        ),
        ({"num_labels": 3}, Capability.CLASSIFY, ("LABEL_0", "LABEL_1", "LABEL_2")),
    ],
)
def test_sequence_classification(
    tmp_path: Path, extra: dict[str, Any], capability: Capability, labels: tuple[str, ...]
) -> None:
    config = {**BERT_CONFIG, "architectures": ["XLMRobertaForSequenceClassification"], **extra}
    info = read_model_info(write_folder(tmp_path, config))
    assert (info.capability, info.labels) == (capability, labels)


def test_text_config_nested(tmp_path: Path) -> None:
    text_config = {"hidden_size": 48, "vocab_size": 7}
    config = {"architectures": ["FooModel"], "model_type": "foo", "text_config": text_config}
    info = read_model_info(write_folder(tmp_path, config))
    assert (info.hidden_size, info.vocab_size) == (48, 7)


# -- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["qwen2_audio", "llava"])
def test_multimodal_models_not_served_are_named(tmp_path: Path, model_type: str) -> None:
    config = {"architectures": ["XModel"], "model_type": model_type, "text_config": {}, "audio_config": {}}
    with pytest.raises(UnsupportedError, match=f"is a {model_type} model; image and audio models served"):
        read_model_info(write_folder(tmp_path, config))


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        read_model_info(write_folder(tmp_path, None, {"modules.json": ST_MODULES}))


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_unreadable_config(tmp_path: Path, content: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelLoadError):
        read_model_info(tmp_path)


def test_backends_know_graphs_not_capabilities() -> None:
    """A backend runs a graph (`ModelInfo.towers`); what the caller wanted from it is the
    engine's business, so a new capability needs no backend change."""
    from conftest import ROOT

    for source in sorted((ROOT / "infinity_cloud" / "backends").glob("*.py")):
        text = source.read_text()
        assert "Capability" not in text and "info.capability" not in text, source.name
