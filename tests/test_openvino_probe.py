"""OpenVINO's reduced precisions, tried where a crash cannot take the server down.

Seen on a Xeon with AMX (OpenVINO 2026.4.1): a bf16 compilation loaded the f32 blob cached
for the same model (one cache key for every precision), answered zeros and corrupted the
heap; a Qwen2 graph in bf16 died of SIGFPE whenever a stream had one thread. Here: each
configuration caches its own blob; a reduced precision is compiled first in a child, and a
child that dies makes the server take one stream (with a warning), or float32 for `auto`,
or a clear error for a precision asked for by name. The dying child is the one stand-in: no
CPU in CI is known to crash, so a child that kills itself with the signal plays that part."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infinity_cloud import ModelSpec
from infinity_cloud.backends import exports, openvino_probe
from infinity_cloud.backends.openvino_backend import OpenVinoBackend
from infinity_cloud.core.errors import PrecisionCrashError
from infinity_cloud.families import read_model_info
from infinity_cloud.models.backend_choice import open_backend
from infinity_cloud.numerics.fidelity import agreement
from infinity_cloud.numerics.inputs import ModelInputs

ROWS = {
    "input_ids": np.array([[101, 7, 8, 9, 102, 0], [101, 11, 12, 13, 14, 102]], dtype=np.int64),
    "attention_mask": np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=np.int64),
}


def inputs(backend: OpenVinoBackend) -> ModelInputs:
    arrays = dict(ROWS)
    if "token_type_ids" in backend._inputs:
        arrays["token_type_ids"] = np.zeros_like(ROWS["input_ids"])
    return ModelInputs(arrays)


def open_(path: Path, dtype: str, **options: Any) -> OpenVinoBackend:
    spec = ModelSpec(model_id=str(path), backend="openvino", dtype=dtype,
                     backend_options={"streams": 2, "threads": 2, **options})
    backend = OpenVinoBackend(read_model_info(path), spec)
    backend.solo_ready.wait(120)
    return backend


@pytest.fixture
def fresh(build_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny embedder with an export cache of its own: IR, blobs and verdicts start empty."""
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path / "exports"))
    return build_model("bert_embedder")


def compiled(path: Path, pattern: str) -> list[Path]:
    """What the OpenVINO exports of `path` hold under their compiled blobs' folder."""
    return sorted(exports.cache_root(path).glob(f"openvino-*/compiled/{pattern}"))


def blob_folders(path: Path) -> list[str]:
    return [p.name for p in compiled(path, "*") if p.is_dir()]


def dying_child(signal_name: str, when: str) -> Any:
    """A probe child that kills itself with `signal_name` for configurations that match
    `when` ("several streams": NUM_STREAMS other than 1; "always"), else the real child."""
    real = openvino_probe.child_command

    def command(model_xml: Path, config: dict[str, Any]) -> list[str]:
        if when == "always" or config.get("NUM_STREAMS") != 1:
            kill = f"import os, signal; os.kill(os.getpid(), signal.{signal_name})"
            return [sys.executable, "-c", kill]
        return real(model_xml, config)

    return command


def test_each_precision_compiles_into_its_own_blob_and_answers_as_float32(fresh: Path) -> None:
    f32 = open_(fresh, "float32")
    want = f32.forward(inputs(f32))
    f32.close()
    bf16 = open_(fresh, "bfloat16")  # with f32's blob already on disk
    got = bf16.forward(inputs(bf16))
    bf16.close()
    folders = blob_folders(fresh)
    assert any("-f32-" in f for f in folders) and any("-bf16-" in f for f in folders), folders
    assert agreement(got, want) > 0.99  # bf16 where the CPU has it, else f32 under the hint


def test_a_reduced_precision_is_tried_in_a_child_once_per_configuration(fresh: Path) -> None:
    open_(fresh, "bfloat16").close()
    verdicts = compiled(fresh, "*/probe-*.json")
    assert verdicts and all(json.loads(v.read_text(encoding="utf-8"))["crash"] is None for v in verdicts)
    stamps = {v: v.stat().st_mtime_ns for v in verdicts}
    open_(fresh, "bfloat16").close()  # the verdicts are read, not tried again
    assert {v: v.stat().st_mtime_ns for v in verdicts} == stamps
    assert not compiled(fresh, "*-f32-*/probe-*.json")


def test_a_precision_that_crashes_on_streams_runs_on_one_stream_with_a_warning(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    f32 = open_(fresh, "float32")
    want = f32.forward(inputs(f32))
    f32.close()
    monkeypatch.setattr(openvino_probe, "child_command", dying_child("SIGFPE", "several streams"))
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        backend = open_(fresh, "bfloat16")
    assert backend.streams == 1 and backend.dtype == "bfloat16"
    assert agreement(backend.forward(inputs(backend)), want) > 0.99
    backend.close()
    loud = [r.getMessage() for r in caplog.records if "killed by SIGFPE" in r.getMessage()]
    assert loud and "one stream on every core" in loud[0] and "--dtype float32" in loud[0], loud


def test_a_precision_that_always_crashes_is_refused_by_name_and_float32_served_for_auto(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(openvino_probe, "child_command", dying_child("SIGSEGV", "always"))
    with pytest.raises(PrecisionCrashError, match=r"killed by SIGSEGV.*--dtype float32"):
        open_(fresh, "bfloat16")
    # `auto`, through the same choice a server makes, where auto means bf16 (AMX, AVX512-BF16):
    # made to mean it everywhere, so the path is taken on every CPU.
    monkeypatch.setattr(OpenVinoBackend, "_resolve_dtype",
                        lambda self, dtype: "bfloat16" if dtype == "auto" else dtype)
    info = read_model_info(fresh)
    spec = ModelSpec(model_id=str(fresh), backend="openvino", dtype="auto")
    probes = ModelInputs({**ROWS, "token_type_ids": np.zeros_like(ROWS["input_ids"])})
    with caplog.at_level(logging.WARNING, logger="infinity_cloud"):
        backend = open_backend(info, spec, info.towers["text"], probes, lambda out, mask: out, lambda: None)
    assert backend.dtype == "float32"
    backend.close()
    assert any("serving float32 instead" in r.getMessage() and "SIGSEGV" in r.getMessage()
               for r in caplog.records)
