"""What the result cache keys rows by, and how it stores them: exact inputs, a model's
identity by its files' content, rows as numpy's own format (never a pickle)."""

from __future__ import annotations

import dataclasses
import io
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from infinity_cloud.cache.codec import decode_row, encode_row
from infinity_cloud.cache.keys import fingerprint
from infinity_cloud.cache.model_identity import ModelIdentity, namespace
from infinity_cloud.core.content_digest import model_fingerprint, one_reading
from infinity_cloud.core.results import SparseVector
from infinity_cloud.numerics.inputs import Encoded


def test_an_input_is_known_by_exactly_what_the_model_reads() -> None:
    one = fingerprint(Encoded([101, 7, 102], [0, 0, 0]))
    assert one == fingerprint(Encoded([101, 7, 102], [0, 0, 0]))
    assert one != fingerprint(Encoded([101, 8, 102], [0, 0, 0]))
    assert one != fingerprint(Encoded([101, 7, 102], [0, 0, 1]))
    assert one != fingerprint(Encoded([101, 7, 102], [0, 0, 0], attended=2))  # a ColBERT query's expansion
    assert fingerprint("not a model input") is None


def test_a_model_is_known_by_its_files_not_its_place(tmp_path: Path) -> None:
    model = tmp_path / "a"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 20_000)  # past the ends read
    shutil.copytree(model, tmp_path / "b")
    assert model_fingerprint(model) == model_fingerprint(tmp_path / "b")
    for where in (-1, len(bytes(range(256)) * 20_000) // 2):  # an end, and the middle (a fine-tune)
        weights = bytearray((model / "model.safetensors").read_bytes())
        weights[where] ^= 1
        (tmp_path / "b" / "model.safetensors").write_bytes(bytes(weights))
        assert model_fingerprint(model) != model_fingerprint(tmp_path / "b"), where
    assert namespace("x", ("openvino", "bfloat16")) != namespace("x", ("openvino", "float32"))


def test_a_load_reads_a_folders_fingerprint_once(tmp_path: Path) -> None:
    """Inside `one_reading` (a model's load) the first reading is kept; outside, a changed
    file is seen."""
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    first = model_fingerprint(tmp_path)
    with one_reading():
        assert model_fingerprint(tmp_path) == first
        (tmp_path / "config.json").write_text('{"model_type": "roberta"}', encoding="utf-8")
        assert model_fingerprint(tmp_path) == first
    assert model_fingerprint(tmp_path) != first


def test_a_model_identity_changes_with_every_fact_that_changes_its_rows() -> None:
    """Each fact of a tower changes its namespace; its device counts by its model, so on a CPU
    (known by the CPU's model and kernel flags) a backend's name for it does not."""
    one = ModelIdentity(fingerprint="f", family="bert", graph="token_states", backend="openvino",
                        dtype="float32", device="cpu", device_model="cpu", pooling="mean", normalize=True,
                        trust_remote_code=False, backend_options={"streams": 2})
    changed = [
        dataclasses.replace(one, **{name: value}) for name, value in {
            "fingerprint": "g", "family": "xlmr", "graph": "splade_max", "backend": "onnx",
            "dtype": "bfloat16", "device": "cuda:0", "pooling": "cls", "normalize": False,
            "trust_remote_code": True, "backend_options": {"streams": 4},
        }.items()
    ]
    assert len({one.namespace, *(c.namespace for c in changed)}) == 1 + len(changed)
    assert dataclasses.replace(one, device_model="another name").namespace == one.namespace
    on_gpu = dataclasses.replace(one, device="cuda:0", device_model="NVIDIA H200")
    assert dataclasses.replace(on_gpu, device_model="NVIDIA A10G").namespace != on_gpu.namespace


def test_rows_round_trip_and_nothing_else_decodes() -> None:
    row = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(decode_row(encode_row(row)), row)
    sparse = SparseVector(np.array([3, 9]), np.array([0.5, 1.25], dtype=np.float32))
    back = decode_row(encode_row(sparse))
    assert np.array_equal(back.indices, sparse.indices) and np.array_equal(back.values, sparse.values)
    assert encode_row({"not": "a row"}) is None
    with pytest.raises(ValueError):
        decode_row(pickle.dumps(row))
    stream = io.BytesIO()
    np.save(stream, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):  # numpy refuses an object array without allow_pickle
        decode_row(b"a" + stream.getvalue())
