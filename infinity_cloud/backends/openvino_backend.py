"""OpenVINO backend (Intel CPUs): bfloat16 on AMX, several inference requests in flight.

Converts the model's ONNX file (`onnx_export.onnx_file`) to OpenVINO IR once and caches it;
compiled blobs are cached beside it, so later starts skip compilation too. Each batch is
split into length-sorted slices that run as parallel inference requests, one per stream, so
every core is busy and each slice pads only to its own longest input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov

from infinity_cloud.backends import exports
from infinity_cloud.backends.base import Backend, ModelInputs
from infinity_cloud.backends.onnx_export import onnx_file, source_label
from infinity_cloud.config import ModelSpec
from infinity_cloud.errors import ConfigError
from infinity_cloud.hardware import cpu_has_fast_bf16, usable_cores
from infinity_cloud.model_files import ModelInfo

IR_FILE = "model.xml"
_PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


class OpenVinoBackend(Backend):
    name = "openvino"

    def __init__(self, info: ModelInfo, spec: ModelSpec) -> None:
        super().__init__(info, spec)
        if spec.device not in ("auto", "cpu"):
            raise ConfigError(f"the openvino backend runs on cpu, not {spec.device!r}")
        self.core = ov.Core()
        self.dtype = self._resolve_dtype(spec.dtype)
        source = onnx_file(info, spec.trust_remote_code, self.name)

        def converted() -> Path:
            return exports.cached_export(
                info.path, "openvino", {"source": source_label(info, source), "openvino": ov.__version__},
                lambda out: ov.save_model(ov.convert_model(str(source)), str(out / IR_FILE), False),
                f"converting {info.path.name} to OpenVINO IR",
            )

        self.compiled = exports.load_cached(converted, self._compile)
        streams = int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.requests = [self.compiled.create_infer_request() for _ in range(max(1, streams))]
        self._inputs = [port.any_name for port in self.compiled.inputs]

    def _resolve_dtype(self, dtype: str) -> str:
        if dtype == "auto":
            capabilities = self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
            fast = cpu_has_fast_bf16() and "BF16" in capabilities
            return "bfloat16" if fast else "float32"
        if dtype not in _PRECISIONS:
            raise ConfigError(f"the openvino backend runs float32, bfloat16 or float16, not {dtype}")
        return dtype

    def _compile(self, folder: Path) -> ov.CompiledModel:
        options = self.spec.backend_options
        config = {
            "INFERENCE_PRECISION_HINT": _PRECISIONS[self.dtype],
            "PERFORMANCE_HINT": str(options.get("performance_hint", "THROUGHPUT")).upper(),
            "INFERENCE_NUM_THREADS": int(options.get("threads", usable_cores())),
            "CACHE_DIR": str(folder / "compiled"),
        }
        if "streams" in options:
            config["NUM_STREAMS"] = int(options["streams"])
        return self.core.compile_model(self.core.read_model(str(folder / IR_FILE)), "CPU", config)

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        lengths = inputs.attention_mask.sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        slices = [s for s in np.array_split(order, min(len(self.requests), len(order))) if len(s)]
        feeds = {
            "input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask,
            "token_type_ids": inputs.token_type_ids,
        }
        for request, rows in zip(self.requests, slices, strict=False):
            width = int(lengths[rows].max())
            request.start_async({name: feeds[name][rows, :width] for name in self._inputs})
        parts = []
        for request, _ in zip(self.requests, slices, strict=False):
            request.wait()
            parts.append(request.get_output_tensor(0).data.copy())
        return _reassemble(parts, slices, inputs.input_ids.shape[1])

    def close(self) -> None:
        del self.requests, self.compiled


def _reassemble(parts: list[np.ndarray], slices: list[np.ndarray], width: int) -> np.ndarray:
    """Put slice outputs back in the batch's row order; token states padded back to `width`."""
    rows = sum(len(s) for s in slices)
    first = parts[0]
    shape = (rows, width, first.shape[2]) if first.ndim == 3 else (rows, *first.shape[1:])
    out = np.zeros(shape, dtype=np.float32)
    for part, index in zip(parts, slices, strict=True):
        if part.ndim == 3:
            out[index, : part.shape[1]] = part
        else:
            out[index] = part
    return out
