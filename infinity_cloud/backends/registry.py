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
    extra: str | None  # the pip extra that installs it
    runtime: str | None  # the module whose presence means it is installed
    # Inputs per batch when the spec does not say: the fastest measured for the backend.
    batch_size: int = 64


_BACKENDS: dict[str, _Entry] = {
    "torch": _Entry("infinity_cloud.backends.torch_backend", "TorchBackend", "torch", "torch"),
    "onnx": _Entry("infinity_cloud.backends.onnx_backend", "OnnxBackend", "onnx", "onnxruntime"),
    # Measured on a 2-core AVX512-BF16 CPU (interleaved, in-process): batches of 16 beat 64
    # by 7 % on MiniLM and 25 % on mpnet; each stream's slice stays cache-sized.
    "openvino": _Entry(
        "infinity_cloud.backends.openvino_backend", "OpenVinoBackend", "openvino", "openvino", 16
    ),
    "ctranslate2": _Entry(
        "infinity_cloud.backends.ctranslate2_backend", "CTranslate2Backend", "ctranslate2", "ctranslate2"
    ),
    "fake": _Entry("infinity_cloud.backends.fake", "FakeBackend", None, None),
}
# What `backend auto` tries, fastest first. On a GPU that is torch (bf16/fp16, SDPA); on
# CPU OpenVINO (bf16 on AMX, parallel streams; measured fastest here), then ONNX Runtime,
# then torch. The ONNX-based two also start without importing torch once their export is cached.
_AUTO_ORDER = {"gpu": ("torch", "onnx"), "cpu": ("openvino", "onnx", "torch")}


def available_backends() -> list[str]:
    return ["auto", *sorted(_BACKENDS)]


def backend_class(name: str) -> type[Backend]:
    entry = _entry(name)
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        hint = f" (pip install 'infinity-cloud[{entry.extra}]')" if entry.extra else ""
        raise BackendUnavailableError(
            f"backend {name!r} cannot be used: {exc.name or exc} is not installed{hint}"
        ) from exc
    return getattr(module, entry.cls)


def _entry(name: str) -> _Entry:
    entry = _BACKENDS.get(name)
    if entry is None:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(available_backends())}")
    return entry


def backend_extra(name: str) -> str | None:
    """The pip extra that installs a backend's runtime."""
    return _entry(name).extra


def default_batch_size(name: str) -> int:
    return _entry(name).batch_size


def auto_order(gpu: bool) -> tuple[str, ...]:
    """The backends `auto` tries on a GPU or a CPU, fastest first, installed or not."""
    return _AUTO_ORDER["gpu" if gpu else "cpu"]


def installed(name: str) -> bool:
    """Whether a backend's runtime is installed, without importing it."""
    runtime = _entry(name).runtime
    return runtime is None or importlib.util.find_spec(runtime) is not None


def auto_backends(device: str) -> list[str]:
    """What `backend auto` tries on this machine, fastest first, among those installed."""
    gpu = device.startswith("cuda") or (device == "auto" and has_nvidia_gpu())
    found = [name for name in auto_order(gpu) if installed(name)]
    if not found:
        raise BackendUnavailableError(
            "no inference backend is installed: pip install 'infinity-cloud[openvino]' (CPU) "
            "or 'infinity-cloud[torch]'"
        )
    return found
