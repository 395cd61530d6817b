"""PyTorch + transformers backend, on CPU or CUDA."""

from __future__ import annotations

import logging

import numpy as np
import torch

from infinity_cloud.backends.base import Backend, ModelInputs
from infinity_cloud.backends.graphs import build_graph
from infinity_cloud.config import ModelSpec
from infinity_cloud.errors import ConfigError
from infinity_cloud.hardware import cpu_has_fast_bf16, usable_cores
from infinity_cloud.model_files import GraphOutput, ModelInfo

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} was asked for but torch sees no CUDA device")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {device!r}: {exc}") from exc


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype == "int8":
        raise ConfigError("the torch backend has no int8 mode; use --backend onnx --dtype int8")
    if device.type == "cuda":
        # Native bf16 needs compute capability 8.0 (Ampere); is_bf16_supported() also counts
        # the T4's (7.5) slow emulation, where float16 runs on its tensor cores.
        return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16
    # The engine checks a reduced-precision choice against float32 at load and falls back.
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, info: ModelInfo, spec: ModelSpec, graph: GraphOutput | None = None) -> None:
        super().__init__(info, spec, graph)
        device = resolve_device(spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        if device.type == "cpu":
            torch.set_num_threads(int(spec.backend_options.get("threads", usable_cores())))
        else:
            # SDPA picks cuDNN attention for fp16/bf16 on Hopper, which builds a graph for each
            # new (batch, length) shape: measured on an H200 with MiniLM, 144 ms per forward
            # on unseen shapes against 8 ms once built, and serving meets new shapes all the
            # time. Memory-efficient attention has no such cost.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.model = build_graph(info, spec, self.graph, dtype, attention="sdpa").to(device)
        self._device, self._dtype = device, dtype
        self.device = str(device)
        self.dtype = str(dtype).removeprefix("torch.")

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        feed = inputs.feed(self.model.input_names)
        tensors = [
            # Pixels and audio features come as float32; the weights may be bf16/fp16.
            torch.from_numpy(array).to(self._device, self._dtype if array.dtype.kind == "f" else None)
            for array in feed.values()
        ]
        with torch.inference_mode():
            return self.model(*tensors).float().cpu().numpy()

    def close(self) -> None:
        del self.model
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
