"""PyTorch + transformers backend, on CPU or CUDA."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from infinity_cloud.backends.base import Backend, ModelInputs
from infinity_cloud.config import ModelSpec
from infinity_cloud.errors import ConfigError, ModelLoadError
from infinity_cloud.hardware import cpu_has_fast_bf16, usable_cores
from infinity_cloud.model_files import ModelInfo

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


def load_model(info: ModelInfo, spec: ModelSpec, dtype: torch.dtype, attention: str) -> torch.nn.Module:
    """The transformers model for `info`: the bare encoder for embedders, else its classifier."""
    auto_class = AutoModel if info.output == "token_states" else AutoModelForSequenceClassification
    kwargs = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code}
    try:
        try:
            model = auto_class.from_pretrained(str(info.path), attn_implementation=attention, **kwargs)
        except (ValueError, ImportError):  # architectures without that attention implementation
            model = auto_class.from_pretrained(str(info.path), **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"cannot load weights from {info.path}: {exc}") from exc
    return model.eval()


def takes_token_types(model: torch.nn.Module) -> bool:
    params = inspect.signature(model.forward).parameters
    return "token_type_ids" in params and bool(getattr(model.config, "type_vocab_size", 0))


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, info: ModelInfo, spec: ModelSpec) -> None:
        super().__init__(info, spec)
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
        model = load_model(info, spec, dtype, attention="sdpa")
        self.model = model.to(device)
        self._device = device
        self.device = str(device)
        self.dtype = str(dtype).removeprefix("torch.")
        self._token_types = takes_token_types(self.model)

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        feed = {
            "input_ids": torch.from_numpy(inputs.input_ids).to(self._device),
            "attention_mask": torch.from_numpy(inputs.attention_mask).to(self._device),
        }
        if self._token_types:
            feed["token_type_ids"] = torch.from_numpy(inputs.token_type_ids).to(self._device)
        with torch.inference_mode():
            out = self.model(**feed)
            result = out.last_hidden_state if self.info.output == "token_states" else out.logits
            return result.float().cpu().numpy()

    def close(self) -> None:
        del self.model
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
