"""CTranslate2 backend: BERT-family embedders on CPU (float32, opt-in int8) or CUDA.

Converts the model's weights to CTranslate2's format once, at float32, and caches the
result; the compute type is chosen when the model is loaded, so one cached conversion serves
every dtype. Only the conversion needs torch and transformers; a cached one is served
without them. CTranslate2 has no classification heads, so rerankers and classifiers are
left to the other backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np

from infinity_cloud.backends import exports
from infinity_cloud.backends.base import Backend
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import BackendUnavailableError, ConfigError, ModelLoadError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.hardware import usable_cores
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.numerics.inputs import ModelInputs

MODEL_FILE = "model.bin"
# model_type -> whether the converted encoder takes token type ids. These are the encoder
# families CTranslate2's Transformers converter handles (4.x); decoders it converts have
# no encoder forward pass to embed with.
_ENCODERS = {"bert": True, "roberta": True, "xlm-roberta": True, "camembert": True, "distilbert": False}
# Activations the converter maps (ctranslate2.converters.transformers._SUPPORTED_ACTIVATIONS).
_ACTIVATIONS = {
    "gelu", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "quick_gelu",
    "relu", "silu", "swish",
}
_OTHERS = "--backend onnx, openvino or torch"


class CTranslate2Backend(Backend):
    name = "ctranslate2"
    graphs = frozenset({"token_states"})  # CTranslate2's encoders give token states, no heads
    others = _OTHERS

    def __init__(self, info: ModelInfo, spec: ModelSpec, graph: GraphOutput | None = None) -> None:
        super().__init__(info, spec, graph)
        _check_model(info)
        self.device, index = _resolve_device(spec.device)
        self.dtype, self.compute_type = _resolve_dtype(spec.dtype, self.device)
        threads = int(spec.backend_options.get("threads", usable_cores()))
        self._token_types = _ENCODERS[info.model_type] and int(info.raw.get("type_vocab_size") or 0) > 1
        # Weights stay float32 on disk whatever the dtype: CTranslate2 converts (or quantises)
        # them at load, so float32 and int8 share one cached conversion. The format is stable
        # within a major version, so a patch upgrade does not force a re-conversion (and torch).
        options = {"quantization": "float32", "ctranslate2": ctranslate2.__version__.split(".")[0],
                   **({"trust_remote_code": True} if spec.trust_remote_code else {})}  # kept apart

        def converted() -> Path:
            return exports.cached_export(
                info.path, "ctranslate2", options,
                lambda out: _convert(info, out, spec.trust_remote_code),
                f"converting {info.path.name} to CTranslate2", beside=spec.export_into_folder,
            )

        def load(folder: Path) -> ctranslate2.Encoder:
            self.export_folder = folder
            return ctranslate2.Encoder(
                str(folder), device=self.device.partition(":")[0], device_index=index,
                compute_type=self.compute_type, intra_threads=threads,
            )

        self.encoder = exports.load_cached(converted, load)

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        ids = np.ascontiguousarray(inputs.input_ids, dtype=np.int32)
        lengths = np.ascontiguousarray(inputs.attention_mask.sum(axis=1), dtype=np.int32)
        # Omitted token types are zeros, which every single-text embedding input has; skip
        # the list conversion the binding needs for them.
        types = inputs.token_type_ids.tolist() if self._token_types and inputs.token_type_ids.any() else None
        out = self.encoder.forward_batch(
            ctranslate2.StorageView.from_array(ids), ctranslate2.StorageView.from_array(lengths),
            token_type_ids=types,
        ).last_hidden_state
        if self.device != "cpu":
            out = out.to(ctranslate2.DataType.float32).to_device(ctranslate2.Device.cpu)
        states = np.array(out, dtype=np.float32)
        if states.shape[1] < ids.shape[1]:  # keep the batch's width: the engine's masks have it
            states = np.pad(states, ((0, 0), (0, ids.shape[1] - states.shape[1]), (0, 0)))
        return states

    def close(self) -> None:
        del self.encoder


def _check_model(info: ModelInfo) -> None:
    """Refuse, before any conversion, what CTranslate2 cannot run as an embedder."""
    if info.model_type not in _ENCODERS:
        raise ModelLoadError(
            f"the ctranslate2 backend cannot run {info.model_type or 'this'} models "
            f"(it converts {', '.join(sorted(_ENCODERS))}); serve {info.path.name} with {_OTHERS}"
        )
    raw = info.raw
    positions = raw.get("position_embedding_type", "absolute")
    activation = raw.get("activation" if info.model_type == "distilbert" else "hidden_act", "gelu")
    if positions != "absolute" or activation not in _ACTIVATIONS:
        raise ModelLoadError(
            f"the ctranslate2 backend cannot run {info.path.name} (position embeddings {positions!r}, "
            f"activation {activation!r}); serve it with {_OTHERS}"
        )


def _resolve_device(device: str) -> tuple[str, int]:
    gpus = ctranslate2.get_cuda_device_count()
    if device == "auto":
        return ("cuda", 0) if gpus else ("cpu", 0)
    if device == "cpu":
        return "cpu", 0
    if device == "cuda" or device.startswith("cuda:"):
        if not gpus:
            raise ConfigError(f"device {device!r} was asked for but ctranslate2 sees no CUDA device")
        try:
            index = int(device.partition(":")[2] or 0)
        except ValueError as exc:
            raise ConfigError(f"unknown device {device!r}") from exc
        if index >= gpus:
            raise ConfigError(f"device {device!r} does not exist; ctranslate2 sees {gpus} CUDA device(s)")
        return device, index
    raise ConfigError(f"the ctranslate2 backend runs on cpu or cuda, not {device!r}")


def _resolve_dtype(dtype: str, device: str) -> tuple[str, str]:
    """(the dtype reported to the engine, CTranslate2's compute type)."""
    supported = ctranslate2.get_supported_compute_types(device.partition(":")[0])
    if dtype == "auto":
        # CPU: float32. This build has no bfloat16 CPU kernels (supported: float32, int8),
        # and int8 changes results enough that it is opt-in only. GPU: half precision, which
        # the engine checks against float32 at load and drops if it disagrees.
        if device == "cpu":
            return "float32", "float32"
        half = next((t for t in ("bfloat16", "float16") if t in supported), None)
        return (half, half) if half else ("float32", "float32")
    if dtype == "int8":
        # int8 weights; activations in float32 on CPU, float16 on GPU where it is supported.
        compute = "int8_float32" if device == "cpu" else "int8_float16"
        compute = compute if compute in supported else "int8"
        if compute not in supported:
            raise ConfigError(f"this ctranslate2 build has no int8 kernels for {device}")
        return "int8", compute
    if dtype not in supported:
        raise ConfigError(
            f"the ctranslate2 backend does not run {dtype} on {device} (this build supports "
            f"{', '.join(sorted(supported))}); use float32 or int8, or --backend openvino / torch for {dtype}"
        )
    return dtype, dtype


def _convert(info: ModelInfo, out: Path, trust_remote_code: bool) -> dict[str, Any]:
    """Convert the transformers weights (float32) into `out`; needs torch and transformers."""
    try:
        import torch  # noqa: F401 - the converter's dependencies, checked for a clear message
        import transformers  # noqa: F401
        from ctranslate2.converters import TransformersConverter
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend 'ctranslate2' needs a one-time conversion of {info.path}, which needs torch and "
            f"transformers ({install_command('torch')}) ({exc.name or exc} is not installed)"
        ) from exc

    class _Converter(TransformersConverter):
        def load_model(self, model_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            # transformers 5 dropped `position_embedding_type` (absolute is all it runs), but
            # the converter still asserts it; `_check_model` refused any other declared type.
            if not hasattr(model.config, "position_embedding_type"):
                model.config.position_embedding_type = "absolute"
            return model

    converter = _Converter(str(info.path), trust_remote_code=trust_remote_code)
    try:
        converter.convert(str(out), quantization="float32", force=True)  # `out` exists, empty
    except Exception as exc:
        raise ModelLoadError(
            f"converting {info.path} ({info.model_type}) to CTranslate2 failed: {type(exc).__name__}: {exc}; "
            f"serve it with {_OTHERS}"
        ) from exc
    return {"model_type": info.model_type, "ctranslate2": ctranslate2.__version__}
