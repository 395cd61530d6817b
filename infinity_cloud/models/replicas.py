"""Data parallel: which devices a model's towers are copied onto, one replica per device (its
own backend, queue and batch worker), and the spec each copy opens with.

TEI serves one GPU a process and Infinity only the devices named; a multi-GPU instance
(SageMaker's ml.g5.12xlarge, Modal's `L4:4`, a Kubernetes pod given 4 GPUs) should use every
GPU it pays for without one container each, so `cuda` (or `auto` on a GPU machine) without
`device_ids` means every GPU the backend sees. On a CPU, `device_ids` make that many replicas
sharing the cores: what the data-parallel path is tested on where no GPU is."""

from __future__ import annotations

from collections.abc import Callable

from infinity_cloud.backends import Backend
from infinity_cloud.backends.base import Calibration
from infinity_cloud.backends.cuda_check import usable_gpu
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.hardware import usable_cores


def _on_cpu(spec: ModelSpec) -> bool:
    """Whether `spec`'s replicas will share this machine's cores (known before any backend opens:
    the first replica must open with its share already)."""
    return spec.device == "cpu" or (spec.device == "auto" and not usable_gpu())


def first_spec(spec: ModelSpec) -> ModelSpec:
    """The spec the first replica opens with: with `device_ids` on a GPU, the first of them; on a
    CPU split into replicas, its share of the cores (unless `backend_options` sets threads)."""
    ids = spec.device_ids
    if ids is None:
        return spec
    if _on_cpu(spec):
        return cpu_share(spec, len(ids))
    return spec.model_copy(update={"device": f"{spec.device if spec.device != 'auto' else 'cuda'}:{ids[0]}"})


def cpu_share(spec: ModelSpec, replicas: int) -> ModelSpec:
    """`spec` with its backend's threads cut to one replica's share of the usable cores."""
    if replicas == 1 or "threads" in spec.backend_options:
        return spec
    threads = max(1, usable_cores() // replicas)
    return spec.model_copy(update={"backend_options": {**spec.backend_options, "threads": threads}})


def replica_devices(spec: ModelSpec, first: Backend) -> list[str]:
    """The device of each replica, the first's own first: on a GPU, each of `device_ids` (by
    default every GPU the backend sees, unless `device` named one); on a CPU, `cpu:0` to
    `cpu:N-1` for N `device_ids` (default one, on the backend's own device)."""
    kind = first.device.split(":")[0]
    ids = spec.device_ids
    if kind == "cpu":
        return [f"cpu:{i}" for i in range(len(ids))] if ids and len(ids) > 1 else [first.device]
    if ids is None:
        if ":" in spec.device:  # one device named
            return [first.device]
        ids = tuple(range(max(1, type(first).visible_devices(kind))))
    devices = [f"{kind}:{i}" for i in ids]
    # The first replica's device as the backend names it ("cuda" is "cuda:0").
    return [first.device if first.device in (kind, devices[0]) else devices[0], *devices[1:]]


def open_replica(
    first: Backend, info: ModelInfo, spec: ModelSpec, graph: GraphOutput, device: str, replicas: int,
    calibration: Callable[[], Calibration],
) -> Backend:
    """Another replica of `first` on `device`: the backend and precision `first` chose and
    verified (the same model on the same kind of device: measured once, not per device)."""
    cls = type(first)
    kind = device.split(":")[0]
    copy = spec.model_copy(update={"backend": first.name, "dtype": first.dtype,
                                   "device": "cpu" if kind == "cpu" else device})
    if kind == "cpu":
        copy = cpu_share(copy, replicas)
    backend = (cls(info, copy, graph, calibration=calibration) if copy.dtype in cls.calibrated_dtypes
               else cls(info, copy, graph))
    backend.agreement, backend.precision_note = first.agreement, first.precision_note
    return backend

