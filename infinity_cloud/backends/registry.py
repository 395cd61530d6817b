"""Backend names to lazily imported classes, with every fact the rest of the system needs
about a backend (devices, dtypes, the pip extra that installs it on each device, batch size,
`auto` order) declared here once. A missing dependency names its pip extra.

A backend may also be named by import path (`package.module:Class`, a `Backend` subclass):
that is how the tests use the deterministic fake backend, and how a user plugs in their own,
without either being offered by `--backend` or picked by `auto`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field

from infinity_cloud.backends.base import Backend
from infinity_cloud.core.errors import BackendUnavailableError, ConfigError
from infinity_cloud.core.hardware import has_neuron_device
from infinity_cloud.core.install_hint import install_command

DEFAULT_BATCH_SIZE = 64


@dataclass(frozen=True)
class BackendEntry:
    module: str
    cls: str
    runtime: str  # the module whose presence means it is installed
    dtypes: tuple[str, ...]  # besides `auto`
    # Device ("cpu", "cuda") -> the pip extra that installs everything it needs there; a
    # device missing here is one the backend does not run on, or that no extra packages.
    extras: Mapping[str, str] = field(default_factory=dict)
    # Inputs per batch when the spec does not say: the fastest measured for the backend.
    batch_size: int = DEFAULT_BATCH_SIZE
    # The pip packages it serves with once its exports are built (an image's run stage).
    serving_packages: tuple[str, ...] = ()
    # The pip extra of its one-time conversion (torch, transformers, onnx), kept apart from
    # its runtime's so that serving a model that ships its exports installs no torch.
    converter: str | None = None

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.extras)


_BACKENDS: dict[str, BackendEntry] = {
    "torch": BackendEntry(
        "infinity_cloud.backends.torch_backend", "TorchBackend", "torch",
        ("float32", "bfloat16", "float16"), {"cpu": "torch", "cuda": "torch"},
        serving_packages=("torch", "transformers"),
    ),
    # On CUDA ONNX Runtime needs onnxruntime-gpu built for the image's CUDA, which no extra
    # installs yet; it runs there when the user installs it.
    "onnx": BackendEntry(
        "infinity_cloud.backends.onnx_backend", "OnnxBackend", "onnxruntime",
        ("float32", "float16", "int8"), {"cpu": "onnx"}, serving_packages=("onnxruntime",),
        converter="export",
    ),
    # Measured on a 2-core AVX512-BF16 CPU (interleaved, in-process): batches of 16 beat 64
    # by 7 % on MiniLM and 25 % on mpnet; each stream's slice stays cache-sized.
    "openvino": BackendEntry(
        "infinity_cloud.backends.openvino_backend", "OpenVinoBackend", "openvino",
        ("float32", "bfloat16", "float16", "int8"), {"cpu": "openvino"}, batch_size=16,
        serving_packages=("openvino",), converter="export",
    ),
    # AWS Inferentia2 / Trainium: graphs compiled ahead of time for the spec's static shapes.
    "neuron": BackendEntry(
        "infinity_cloud.backends.neuron_backend", "NeuronBackend", "optimum.neuron",
        ("bfloat16", "float32"), {"neuron": "neuron"}, serving_packages=("optimum-neuron",),
    ),
    "ctranslate2": BackendEntry(
        "infinity_cloud.backends.ctranslate2_backend", "CTranslate2Backend", "ctranslate2",
        ("float32", "float16", "bfloat16", "int8"), {"cpu": "ctranslate2", "cuda": "ctranslate2"},
        serving_packages=("ctranslate2",),
    ),
}
# What `backend auto` tries, fastest first. On a GPU that is torch (bf16/fp16, SDPA); on
# CPU OpenVINO (bf16 on AMX, parallel streams; measured fastest here), then ONNX Runtime,
# then torch. The ONNX-based two also start without importing torch once their export is cached.
_AUTO_ORDER = {"cuda": ("torch", "onnx"), "cpu": ("openvino", "onnx", "torch"), "neuron": ("neuron",)}


def available_backends() -> list[str]:
    """What `--backend` offers."""
    return ["auto", *sorted(_BACKENDS)]


def is_import_path(name: str) -> bool:
    return ":" in name


def backend_class(name: str) -> type[Backend]:
    if is_import_path(name):
        return _custom_class(name)
    entry = backend_entry(name)
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        extra = next(iter(entry.extras.values()), None)
        hint = f" ({install_command(extra)})" if extra else ""
        raise BackendUnavailableError(
            f"backend {name!r} cannot be used: {exc.name or exc} is not installed{hint}"
        ) from exc
    return getattr(module, entry.cls)


def _custom_class(path: str) -> type[Backend]:
    module_name, _, class_name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"backend {path!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"backend {path!r} is not a subclass of infinity_cloud.backends.Backend")
    return cls


def backend_entry(name: str) -> BackendEntry:
    entry = _BACKENDS.get(name)
    if entry is None:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(available_backends())}")
    return entry


def device_kind(device: str) -> str:
    """"cuda:1" -> "cuda"; "cpu" -> "cpu"."""
    return device.partition(":")[0]


def backend_extra(name: str, device: str) -> str | None:
    """The pip extra that installs everything `name` needs on `device`; None when no extra
    packages it there (the backend does not run there, or needs a hand-installed runtime)."""
    return backend_entry(name).extras.get(device_kind(device))


def converter_extra(name: str) -> str | None:
    """The pip extra that `name` needs to convert a model that ships no export of its own."""
    return None if is_import_path(name) else backend_entry(name).converter


def default_batch_size(name: str) -> int:
    return DEFAULT_BATCH_SIZE if is_import_path(name) or name not in _BACKENDS else _BACKENDS[name].batch_size


def auto_order(device: str) -> tuple[str, ...]:
    """The backends `auto` tries on a device kind (cpu, cuda, neuron), fastest first,
    installed or not."""
    # Another device (mps, xpu): the CPU order, whose backends then say what they run on.
    return _AUTO_ORDER.get(device_kind(device), _AUTO_ORDER["cpu"])


def resolve_auto(backend: str, device: str) -> str:
    """The backend a model will run with where everything is installed (an image built for
    it): `auto` is its first choice there."""
    return auto_order(device)[0] if backend == "auto" else backend


def installed(name: str) -> bool:
    """Whether a backend's runtime is installed, without importing it (a dotted runtime
    imports only its parent package)."""
    try:
        return importlib.util.find_spec(backend_entry(name).runtime) is not None
    except ModuleNotFoundError:
        return False


def auto_backends(device: str) -> list[str]:
    """What `backend auto` tries on this machine, fastest first, among those installed."""
    if device == "auto":
        from infinity_cloud.backends.cuda_check import usable_gpu

        device = "neuron" if has_neuron_device() else "cuda" if usable_gpu() else "cpu"
    found = [name for name in auto_order(device) if installed(name)]
    if not found:
        raise BackendUnavailableError(
            f"no inference backend is installed: {install_command('openvino')} (CPU) "
            f"or {install_command('torch')}"
        )
    return found
