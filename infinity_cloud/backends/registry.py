"""Backend names to lazily imported classes; a missing dependency names its pip extra."""

from __future__ import annotations

import importlib
import importlib.util
from typing import NamedTuple

from infinity_cloud.backends.base import Backend
from infinity_cloud.errors import BackendUnavailableError, ConfigError
from infinity_cloud.hardware import has_nvidia_gpu


class _Entry(NamedTuple):
    module: str
    cls: str
    extra: str | None


_BACKENDS: dict[str, _Entry] = {
    "torch": _Entry("infinity_cloud.backends.torch_backend", "TorchBackend", "torch"),
    "onnx": _Entry("infinity_cloud.backends.onnx_backend", "OnnxBackend", "onnx"),
    "openvino": _Entry("infinity_cloud.backends.openvino_backend", "OpenVinoBackend", "openvino"),
    "ctranslate2": _Entry("infinity_cloud.backends.ctranslate2_backend", "CTranslate2Backend", "ctranslate2"),
    "fake": _Entry("infinity_cloud.backends.fake", "FakeBackend", None),
}


def available_backends() -> list[str]:
    return ["auto", *sorted(_BACKENDS)]


def backend_class(name: str) -> type[Backend]:
    entry = _BACKENDS.get(name)
    if entry is None:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(available_backends())}")
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        hint = f" (pip install 'infinity-cloud[{entry.extra}]')" if entry.extra else ""
        raise BackendUnavailableError(
            f"backend {name!r} cannot be used: {exc.name or exc} is not installed{hint}"
        ) from exc
    return getattr(module, entry.cls)


def installed(name: str) -> bool:
    """Whether a backend's runtime is installed, without importing it."""
    module = {"torch": "torch", "onnx": "onnxruntime", "openvino": "openvino", "ctranslate2": "ctranslate2"}
    return importlib.util.find_spec(module.get(name, name)) is not None


def auto_backends(device: str) -> list[str]:
    """What `backend auto` tries, fastest first, among those installed.

    On a GPU that is torch (bf16/fp16, SDPA); on CPU OpenVINO (bf16 on AMX, parallel
    streams; measured fastest here), then ONNX Runtime, then torch. The ONNX-based two also
    start without importing torch once their export is cached.
    """
    gpu = device.startswith("cuda") or (device == "auto" and has_nvidia_gpu())
    order = ["torch", "onnx"] if gpu else ["openvino", "onnx", "torch"]
    found = [name for name in order if installed(name)]
    if not found:
        raise BackendUnavailableError(
            "no inference backend is installed: pip install 'infinity-cloud[openvino]' (CPU) "
            "or 'infinity-cloud[torch]'"
        )
    return found
