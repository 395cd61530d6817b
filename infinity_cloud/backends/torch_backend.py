"""PyTorch + transformers backend, on CPU or CUDA.

On CUDA a batch is uploaded from pinned memory, run, headed (`Backend.fuse`: pooling,
normalisation and the Dense layers on the device) and copied back into pinned memory, all
queued on one of two CUDA streams without waiting: the batch worker tokenizes and uploads the
next batch while this one computes, and two batches may run at once.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable, Iterator

import numpy as np
import torch

from infinity_cloud.backends.base import Backend
from infinity_cloud.backends.graphs import build_graph
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import ConfigError, DeviceMemoryError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.hardware import cpu_has_fast_bf16, usable_cores
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.inputs import ModelInputs

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# torch's CPU allocator raises a plain RuntimeError with the first message, where CUDA's
# caching allocator raises torch.OutOfMemoryError; pinned host memory and cuBLAS's workspace
# fail as CUDA errors (torch.AcceleratorError, a RuntimeError) with the others.
_OUT_OF_MEMORY_MESSAGES = {
    "cpu": ("DefaultCPUAllocator: can't allocate memory",),
    "cuda": ("out of memory", "ALLOC_FAILED"),
}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} was asked for but torch sees no CUDA device")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {device!r}: {exc}") from exc


def native_reduced_dtypes(device: torch.device) -> tuple[str, ...]:
    """The reduced precisions `device` computes natively: on CUDA float16 (tensor cores since
    Volta) and bfloat16 from compute capability 8.0 (Ampere); is_bf16_supported() also counts
    the T4's (7.5) slow emulation."""
    if device.type != "cuda":
        return ("bfloat16",) if cpu_has_fast_bf16() else ()
    return ("float16", "bfloat16") if torch.cuda.get_device_capability(device)[0] >= 8 else ("float16",)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype == "int8":
        raise ConfigError("the torch backend has no int8 mode; use --backend onnx --dtype int8")
    # `auto`: the first native reduced precision. On CUDA the engine measures them all against
    # float32 at load and serves the fastest that agrees (`TorchBackend.auto_dtypes`); on CPU it
    # checks this one against float32 and falls back.
    native = native_reduced_dtypes(device)
    return _DTYPES[native[0]] if native else torch.float32


@contextlib.contextmanager
def out_of_memory_is_retryable(device: torch.device) -> Iterator[None]:
    """A batch that does not fit the device's memory fails its requests with a 503 to retry
    (the cached blocks are released first), never the worker."""
    try:
        yield
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        messages = _OUT_OF_MEMORY_MESSAGES.get(device.type, ())
        if not isinstance(exc, torch.OutOfMemoryError) and not any(m in str(exc) for m in messages):
            raise
        # The traceback's frames hold the failed batch's tensors: free them before the cache
        # is emptied, or the error (kept on each request until answered) keeps them on the GPU.
        traceback.clear_frames(exc.__traceback__)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise DeviceMemoryError(_memory_message(device, exc)) from exc


def _memory_message(device: torch.device, exc: Exception) -> str:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (f"the batch holding this request did not fit the {device.type} memory ({first}); "
            "retry, or serve with a lower --batch-tokens")


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
        self._head: Head | None = None
        # Two streams, taken in turn: a batch's upload and compute overlap the last one's.
        self._streams = [torch.cuda.Stream(device) for _ in range(2)] if device.type == "cuda" else []
        self._turn = 0

    @classmethod
    def auto_dtypes(cls, spec: ModelSpec) -> tuple[str, ...]:
        """On CUDA `dtype auto` measures float32 and each native reduced precision at load and
        serves the fastest that agrees with float32: which is fastest depends on the model's
        size (on an H200, MiniLM ran fastest in float32)."""
        device = resolve_device(spec.device)
        return ("float32", *native_reduced_dtypes(device)) if device.type == "cuda" else ()

    @classmethod
    def fastest_dtypes(cls, spec: ModelSpec) -> tuple[str, ...]:
        return ("float32", *native_reduced_dtypes(resolve_device(spec.device)))

    @classmethod
    def visible_devices(cls, kind: str) -> int:
        return torch.cuda.device_count() if kind == "cuda" else 1

    @classmethod
    def device_name(cls, spec: ModelSpec) -> str:
        device = resolve_device(spec.device)
        return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    def fuse(self, head: Head) -> bool:
        self._head = head.on_device(lambda array: torch.as_tensor(array, device=self._device))
        return True

    def _run(self, inputs: ModelInputs, pinned: bool) -> torch.Tensor:
        feed = inputs.feed(self.model.input_names)
        tensors = {}
        for name, array in feed.items():
            tensor = torch.from_numpy(array)
            if pinned:
                tensor = tensor.pin_memory()
            # Pixels and audio features come as float32; the weights may be bf16/fp16.
            tensors[name] = tensor.to(self._device, self._dtype if array.dtype.kind == "f" else None,
                                      non_blocking=pinned)
        out = self.model(*tensors.values())
        if self._head is not None:
            out = self._head(out, tensors.get("attention_mask"), torch)
        return out

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        with out_of_memory_is_retryable(self._device), torch.inference_mode():
            return self._run(inputs, pinned=False).float().cpu().numpy()

    def submit(self, inputs: ModelInputs) -> Callable[[], np.ndarray]:
        if not self._streams:
            return super().submit(inputs)
        stream = self._streams[self._turn]
        self._turn = 1 - self._turn
        with out_of_memory_is_retryable(self._device), torch.inference_mode(), torch.cuda.stream(stream):
            out = self._run(inputs, pinned=True).float()
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out, non_blocking=True)
            done = torch.cuda.Event(blocking=True)  # waiting sleeps rather than spins a core
            done.record(stream)

        def wait() -> np.ndarray:
            done.synchronize()
            return host.numpy()

        return wait

    @property
    def batches_in_flight(self) -> int:
        """One a CUDA stream (two); on the CPU `submit` is `forward`: one."""
        return len(self._streams) or 1

    def peak_device_bytes(self, inputs: ModelInputs) -> int | None:
        if self._device.type != "cuda":
            return None
        torch.cuda.synchronize(self._device)
        before = torch.cuda.memory_allocated(self._device)
        torch.cuda.reset_peak_memory_stats(self._device)
        self.forward(inputs)
        return torch.cuda.max_memory_allocated(self._device) - before

    def free_device_bytes(self) -> int | None:
        if self._device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self._device)
        return free + torch.cuda.memory_reserved(self._device) - torch.cuda.memory_allocated(self._device)

    def close(self) -> None:
        del self.model
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
