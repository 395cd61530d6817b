"""ONNX Runtime backend: CPU, CUDA and TensorRT execution providers, optional int8.

Starts from `onnx_export.OnnxSource` (the folder's own file or the cached export), then
caches an optimised copy: ONNX Runtime's transformer fusions (attention, LayerNorm, GELU)
for BERT-like encoders, float16 for CUDA, and for `dtype int8` dynamic per-channel int8 with
the layers that lose most kept in float32 (`onnx_int8`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from infinity_cloud.backends import exports, onnx_int8
from infinity_cloud.backends.base import Backend, Calibration
from infinity_cloud.backends.onnx_export import OnnxSource
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import ConfigError, ModelLoadError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.hardware import has_nvidia_gpu, usable_cores
from infinity_cloud.numerics.fidelity import MIN_AGREEMENT
from infinity_cloud.numerics.inputs import ModelInputs

log = logging.getLogger(__name__)

# Encoders whose graphs ONNX Runtime's BERT fusions understand.
_BERT_LIKE = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "camembert", "nomic_bert"}
OPTIMIZED_FILE = "model.onnx"


class OnnxBackend(Backend):
    name = "onnx"
    traced = True  # it starts from the ONNX trace; graphs that do not trace are torch's
    calibrated_dtypes = frozenset({"int8"})

    def __init__(
        self, info: ModelInfo, spec: ModelSpec, graph: GraphOutput | None = None,
        calibration: Callable[[], Calibration] | None = None,
    ) -> None:
        super().__init__(info, spec, graph)
        self.device = _resolve_device(spec.device)
        self.dtype = _resolve_dtype(spec.dtype, self.device)
        source = OnnxSource(info, self.graph, spec.trust_remote_code, self.name, spec.export_into_folder)
        fuse = info.model_type in _BERT_LIKE
        # The source by its place in the folder, so a moved folder keeps its exports.
        options: dict[str, Any] = {
            "source": source.label, "dtype": self.dtype, "fuse": fuse,
        }
        if self.dtype == "int8" and calibration is not None:  # which layers stay float32 is measured
            options["int8_floor"] = MIN_AGREEMENT["int8"]

        def optimized() -> Path:
            return exports.cached_export(
                info.path, "onnxruntime", options,
                lambda out: _optimize(
                    source.path(), out / OPTIMIZED_FILE, info, self.dtype, fuse, calibration and calibration()
                ),
                f"optimising {info.path.name} for ONNX Runtime ({self.dtype})",
                beside=spec.export_into_folder,
            )

        def session(folder: Path) -> ort.InferenceSession:
            self.export_name, self.export_folder = folder.name, folder
            return self._session(folder / OPTIMIZED_FILE)

        self.session = exports.load_cached(optimized, session)
        self._inputs = {i.name for i in self.session.get_inputs()}
        self._output = self.session.get_outputs()[0].name

    @classmethod
    def fastest_dtypes(cls, spec: ModelSpec) -> tuple[str, ...]:
        return ("float32", "int8") if _resolve_device(spec.device) == "cpu" else ("float32", "float16")

    def _session(self, path: Path) -> ort.InferenceSession:
        spec = self.spec
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = int(spec.backend_options.get("threads", usable_cores()))
        opts.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), opts, providers=_providers(self.device, spec))

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        out = self.session.run([self._output], inputs.feed(self._inputs))[0]
        return out if out.dtype == np.float32 else out.astype(np.float32)

    def close(self) -> None:
        del self.session


def _resolve_device(device: str) -> str:
    if device == "auto":
        cuda = has_nvidia_gpu() and "CUDAExecutionProvider" in ort.get_available_providers()
        return "cuda" if cuda else "cpu"
    if device.startswith("cuda") and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ConfigError(
            f"device {device!r} needs onnxruntime-gpu; this onnxruntime has "
            f"{', '.join(ort.get_available_providers())}"
        )
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"the onnx backend runs on cpu or cuda, not {device!r}")
    return device


def _resolve_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return "float16" if device.startswith("cuda") else "float32"
    if dtype == "bfloat16" or (dtype == "float16" and device == "cpu"):
        raise ConfigError(
            f"the onnx backend does not run {dtype} on {device}; use float32 or int8 "
            "(or --backend openvino / torch for bfloat16)"
        )
    if dtype == "int8" and device != "cpu":
        raise ConfigError("int8 (dynamic quantisation) runs on cpu only")
    return dtype


def _providers(device: str, spec: ModelSpec) -> list[Any]:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    index = int(device.partition(":")[2] or 0)
    chosen: list[Any] = []
    available = ort.get_available_providers()
    if "TensorrtExecutionProvider" in available and spec.backend_options.get("tensorrt", True):
        chosen.append(("TensorrtExecutionProvider", {"device_id": index, "trt_fp16_enable": True}))
    chosen.append(("CUDAExecutionProvider", {"device_id": index}))
    return [*chosen, "CPUExecutionProvider"]


def _optimize(
    source: Path, target: Path, info: ModelInfo, dtype: str, fuse: bool, calibration: Calibration | None
) -> dict[str, Any]:
    """Fuse (BERT-like encoders), then convert: float16 for CUDA, int8 for CPU (every layer
    without a calibration, else only those that hold float32's answers)."""
    import onnx

    staged = target.with_suffix(".fused.onnx") if dtype == "int8" else target
    if fuse:
        from onnxruntime.transformers.optimizer import optimize_model

        try:
            optimized = optimize_model(
                str(source), model_type="bert",
                # Given, not detected: detection fails on exported graphs and skips attention fusion.
                num_heads=int(info.raw.get("num_attention_heads") or 0), hidden_size=info.hidden_size,
            )
            if dtype == "float16":
                optimized.convert_float_to_float16(keep_io_types=True)
            optimized.save_model_to_file(str(staged))
        except Exception as exc:
            raise ModelLoadError(
                f"optimising {source} for ONNX Runtime failed: {exc}; serve it with --backend torch"
            ) from exc
    else:
        model = onnx.load(str(source))
        if dtype == "float16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            model = convert_float_to_float16(model, keep_io_types=True)
        onnx.save(model, str(staged))
    facts: dict[str, Any] = {"dtype": dtype, "fused": fuse, "model_type": info.model_type}
    if dtype == "int8":
        if calibration is None:
            onnx_int8.quantize(staged, target)
        else:
            facts |= onnx_int8.quantize_holding(staged, target, calibration, MIN_AGREEMENT["int8"])
        staged.unlink()
    return facts
