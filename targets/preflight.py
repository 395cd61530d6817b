"""What would otherwise fail after minutes of loading, checked before the first model loads:
each model's device, backend and media extras (read from its files where they are here; a
model still to be downloaded is checked when it loads), the export cache's writability, the
server's port, and the tracing extra where --otlp-endpoint asks for traces. Every problem is
one line with its fix, and all are reported at once.
Cheap: nothing here imports torch or a backend."""

from __future__ import annotations

import errno
import importlib.util
import socket
from pathlib import Path

from infinity_cloud.backends import exports
from infinity_cloud.backends.registry import auto_backends, backend_entry, installed, is_import_path
from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.core.errors import ConfigError, InfinityCloudError
from infinity_cloud.core.hardware import has_neuron_device, has_nvidia_gpu
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.families import input_kinds, read_model_info
from infinity_cloud.models.model_source import already_here
from infinity_cloud.server.tracing import sdk_problem


def check(spec: DeploymentSpec, *, port: bool = True) -> None:
    """Raise one ConfigError listing every problem found (`port`: whether this process will
    bind the spec's port)."""
    found = [line for model in spec.models for line in model_problems(model)]
    if port:
        found += port_problems(spec.server.host, spec.server.port)
    if spec.server.otlp_endpoint and (problem := sdk_problem()):
        found.append(problem)
    if found:
        raise ConfigError("cannot start:\n" + "\n".join(f"  - {line}" for line in found))


def model_problems(model: ModelSpec) -> list[str]:
    found = device_problems(model)
    if model.backend != "auto" and not is_import_path(model.backend) and not installed(model.backend):
        extras = backend_entry(model.backend).extras
        extra = extras.get(model.device.partition(":")[0]) or next(iter(extras.values()), None)
        found.append(f"model {model.name}: backend {model.backend} is not installed: "
                     f"{install_command(extra)}" if extra else
                     f"model {model.name}: backend {model.backend} is not installed")
    elif model.backend == "auto":
        try:
            auto_backends(model.device)
        except InfinityCloudError as exc:
            found.append(f"model {model.name}: {exc.message}")
    try:
        folder = already_here(model.model_id, model.revision)
    except InfinityCloudError as exc:  # a path that is not a folder
        return [*found, f"model {model.name}: {exc.message}"]
    if folder is None:
        return found
    try:
        info = read_model_info(folder, model.pooling)
    except InfinityCloudError as exc:
        return [*found, f"model {model.name}: {exc.message}"]
    kinds = input_kinds()  # each tower reads its kind's inputs, which may need an extra's modules
    for kind in (kinds[tower] for tower in info.towers if tower in kinds):
        missing = [m for m in kind.modules if importlib.util.find_spec(m) is None]
        if missing and kind.extra:
            found.append(f"model {model.name} reads {kind.name}s, which needs {kind.needs} "
                         f"({', '.join(missing)} is missing): {install_command(kind.extra)}")
    found += cache_problems(model, folder)
    return found


def device_problems(model: ModelSpec) -> list[str]:
    kind = model.device.partition(":")[0]
    if kind == "cuda" and not has_nvidia_gpu():
        return [f"model {model.name}: --device {model.device}, but this machine shows no NVIDIA GPU "
                "(no /dev/nvidia0 or nvidia-smi): use --device cpu, or auto"]
    if kind == "cuda" and model.backend in ("auto", "torch"):  # a driver, but can torch use it?
        from infinity_cloud.backends.cuda_check import require_usable_gpu

        try:
            require_usable_gpu(asked=f"model {model.name}: --device {model.device}")
        except ConfigError as exc:
            return [exc.message]
    if kind == "neuron" and not has_neuron_device():
        return [f"model {model.name}: --device neuron, but this machine has no Neuron device: "
                "use --device cpu"]
    return []


def cache_problems(model: ModelSpec, folder: Path) -> list[str]:
    """Exports (ONNX, OpenVINO, int8, fidelity verdicts) are written once, where
    `exports.cache_root` says: that place must be writable, or already hold them."""
    root = exports.cache_root(folder, model.export_into_folder)
    if exports.writable(root) or any(root.glob(f"*/{exports.MANIFEST}")):
        return []
    return [f"model {model.name}: the export cache {root} is not writable: set {exports.CACHE_ENV} "
            "to a writable folder"]


def port_problems(host: str, port: int) -> list[str]:
    """Whether `host:port` can be bound now (port 0: any free one can)."""
    if port == 0:
        return []
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        return [f"--host {host}: cannot be resolved ({exc.strerror})"]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return [f"port {port} on {host} is in use (another server?): stop it, or use --port"]
            return [f"cannot listen on {host}:{port}: {exc.strerror}"]
    return []

