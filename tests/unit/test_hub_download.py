"""What a download from the hub leaves out: only files that serving never reads."""

from __future__ import annotations

import fnmatch

from infinity_cloud.models.model_source import files_not_downloaded

# sentence-transformers/all-MiniLM-L6-v2 as the hub lists it (`HfApi().list_repo_files`).
MINILM = [
    ".gitattributes", "1_Pooling/config.json", "README.md", "config.json",
    "config_sentence_transformers.json", "data_config.json", "model.safetensors", "modules.json",
    "onnx/model.onnx", "onnx/model_O1.onnx", "onnx/model_O2.onnx", "onnx/model_O3.onnx",
    "onnx/model_O4.onnx", "onnx/model_qint8_arm64.onnx", "onnx/model_qint8_avx512.onnx",
    "onnx/model_qint8_avx512_vnni.onnx", "onnx/model_quint8_avx2.onnx",
    "openvino/openvino_model.bin", "openvino/openvino_model.xml",
    "openvino/openvino_model_qint8_quantized.bin", "openvino/openvino_model_qint8_quantized.xml",
    "pytorch_model.bin", "rust_model.ot", "sentence_bert_config.json", "special_tokens_map.json",
    "tf_model.h5", "tokenizer.json", "tokenizer_config.json", "train_script.py", "vocab.txt",
]


def downloaded(files: list[str]) -> set[str]:
    """What `snapshot_download(ignore_patterns=...)` fetches (it matches with fnmatch)."""
    skipped = files_not_downloaded(files)
    return {name for name in files if not any(fnmatch.fnmatch(name, pattern) for pattern in skipped)}


def test_one_copy_of_the_weights_and_the_float_exports_are_fetched() -> None:
    got = downloaded(MINILM)
    assert {"model.safetensors", "onnx/model.onnx", "openvino/openvino_model.xml",
            "openvino/openvino_model.bin", "tokenizer.json", "vocab.txt", "modules.json",
            "1_Pooling/config.json", "config.json"} <= got
    assert not got & {"pytorch_model.bin", "tf_model.h5", "rust_model.ot", "onnx/model_O4.onnx",
                      "onnx/model_qint8_avx512_vnni.onnx", "openvino/openvino_model_qint8_quantized.bin"}


def test_pickled_weights_are_kept_where_they_are_the_only_copy() -> None:
    files = ["config.json", "pytorch_model.bin", "modules.json",
             "2_Dense/pytorch_model.bin", "2_Dense/config.json",  # a module folder's own weights
             "sharded/model-00001-of-00002.safetensors", "sharded/pytorch_model-00001-of-00002.bin"]
    got = downloaded(files)
    assert {"pytorch_model.bin", "2_Dense/pytorch_model.bin"} <= got
    assert "sharded/model-00001-of-00002.safetensors" in got
    assert "sharded/pytorch_model-00001-of-00002.bin" not in got
    # A module with both keeps only its safetensors.
    both = downloaded(
        ["2_Dense/model.safetensors", "2_Dense/pytorch_model.bin", "open_clip_pytorch_model.bin"]
    )
    assert both == {"2_Dense/model.safetensors", "open_clip_pytorch_model.bin"}
