"""One served model: its files, tokenizer, backend, batch head and batch worker."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity_cloud.backend_choice import open_backend
from infinity_cloud.backends import Backend, ModelInputs
from infinity_cloud.backends.registry import default_batch_size
from infinity_cloud.batching import BatchQueue, BatchWorker
from infinity_cloud.batching.worker import Observer
from infinity_cloud.capability import Capability
from infinity_cloud.config import ModelSpec
from infinity_cloud.errors import ModelLoadError, ModelNotReadyError, UnsupportedError
from infinity_cloud.fidelity import PROBES
from infinity_cloud.model_files import ModelInfo, read_model_info
from infinity_cloud.model_source import resolve_model_dir
from infinity_cloud.tasks.pooling import supported_activation
from infinity_cloud.tasks.registry import task_for
from infinity_cloud.tokenization import Encoded, TextTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Loaded:
    info: ModelInfo
    tokenizer: TextTokenizer
    backend: Backend
    normalize: bool
    worker: BatchWorker


def max_batch_size(spec: ModelSpec, backend: str) -> int:
    """Inputs per batch: the spec's, else the backend's default, never past the largest static
    batch shape."""
    return min((spec.max_batch_size or default_batch_size(backend), *spec.batch_buckets[-1:]))


def bucket(size: int, buckets: Sequence[int]) -> int:
    """The smallest static size that holds `size`; `size` itself without buckets."""
    return next((b for b in buckets if b >= size), size)


class ServedModel:
    """States: loading -> ready -> stopped, or failed with a reason."""

    def __init__(self, spec: ModelSpec, observers: Sequence[Observer] = ()) -> None:
        self.spec = spec
        self.name = spec.name
        self._observers = observers
        self._loaded: _Loaded | None = None
        self.state = "loading"
        self.error: str | None = None
        self.load_seconds: float | None = None

    # -- lifecycle -------------------------------------------------------------------

    def load(self) -> None:
        """Blocking: find the files, load tokenizer and weights, start the worker."""
        started = time.perf_counter()
        try:
            self._loaded = self._load()
        except Exception as exc:
            self.state, self.error = "failed", str(exc)
            raise
        self.state = "ready"
        self.load_seconds = time.perf_counter() - started
        log.info(
            "model %s ready: %s via %s on %s (%s) in %.1fs", self.name,
            self._loaded.info.capability.value, self._loaded.backend.name, self._loaded.backend.device,
            self._loaded.backend.dtype, self.load_seconds,
        )

    def _load(self) -> _Loaded:
        spec = self.spec
        path = resolve_model_dir(spec.model_id, spec.revision)
        info = read_model_info(path)
        for layer in info.dense:
            if not supported_activation(layer.activation):
                raise ModelLoadError(f"{path}: Dense activation {layer.activation} is not supported")
        max_length = min(info.max_length, spec.max_length or info.max_length)
        if spec.length_buckets:  # an input longer than every static shape cannot run
            max_length = min(max_length, spec.length_buckets[-1])
        tokenizer = TextTokenizer.load(path, max_length, info.vocab_size, info.pad_token)
        pooling = spec.pooling or info.pooling
        normalize = info.normalize if spec.normalize is None else spec.normalize
        task = task_for(info.capability)
        head = task.head(info, pooling, normalize)
        backend = open_backend(info, spec, tokenizer, head)
        max_batch = max_batch_size(spec, backend.name)
        queue = BatchQueue(
            spec.queue_size, spec.batch_tokens, max_batch, fill_wait_s=spec.batch_wait_ms / 1000,
            padded_length=lambda n: bucket(n, spec.length_buckets),
        )

        def run(encodings: list[Encoded]) -> tuple[Callable[[], np.ndarray], np.ndarray, int]:
            inputs = ModelInputs.collate(
                encodings, tokenizer.pad_id,
                length=bucket(max(len(e) for e in encodings), spec.length_buckets),
                rows=bucket(len(encodings), spec.batch_buckets),
            )
            return backend.submit(inputs), inputs.attention_mask, len(encodings)

        def finish(output: tuple[Callable[[], np.ndarray], np.ndarray, int], _: list[Encoded]) -> np.ndarray:
            wait, mask, real = output  # `real`: static-shape filler rows are dropped
            return head(wait()[:real], mask[:real])

        if spec.warmup:  # first-call kernel set-up happens here, not in a caller's request
            finish(run(task.encode_probes(tokenizer, PROBES)[:2]), [])
        worker = BatchWorker(self.name, queue, run, finish, self._observers)
        worker.start()
        return _Loaded(info, tokenizer, backend, normalize, worker)

    def stop(self) -> None:
        if self._loaded is not None:
            self._loaded.worker.stop()
            self._loaded.backend.close()
        self.state = "stopped"

    # -- serving ---------------------------------------------------------------------

    @property
    def loaded(self) -> _Loaded:
        if self._loaded is None or self.state != "ready":
            reason = {"loading": "is still loading", "stopped": "is shutting down"}.get(
                self.state, f"failed to load: {self.error}"
            )
            raise ModelNotReadyError(f"model {self.name!r} {reason}")
        if not self._loaded.worker.alive:
            raise ModelNotReadyError(f"model {self.name!r} is not serving: {self._loaded.worker.death}")
        return self._loaded

    @property
    def capability(self) -> Capability | None:
        return self._loaded.info.capability if self._loaded else None

    def require(self, capability: Capability) -> _Loaded:
        loaded = self.loaded
        if loaded.info.capability is not capability:
            raise UnsupportedError(
                f"model {self.name!r} is for {loaded.info.capability.noun}, not {capability.noun}",
                param="model",
            )
        return loaded

    async def run(self, encodings: list[Encoded]) -> list[Any]:
        return await self.loaded.worker.submit(encodings, [len(e) for e in encodings])

    @property
    def healthy(self) -> bool:
        return self.state == "ready" and self._loaded is not None and self._loaded.worker.alive

    def describe(self) -> dict[str, Any]:
        """Facts for /models and /health."""
        out: dict[str, Any] = {"id": self.name, "state": self.state, "backend": self.spec.backend}
        if self.error:
            out["error"] = self.error
        if self._loaded is None:
            return out
        loaded = self._loaded
        worker = loaded.worker
        out.update(
            backend=loaded.backend.name,  # `auto` resolved
            capabilities=[loaded.info.capability.value],
            dtype=loaded.backend.dtype,
            # Worst cosine to float32 on the fidelity probes; None for float32 itself.
            agreement_with_float32=loaded.backend.agreement,
            device=loaded.backend.device,
            max_input_tokens=loaded.tokenizer.max_length,
            dimensions=loaded.info.dimensions,
            labels=list(loaded.info.labels) if loaded.info.capability is Capability.CLASSIFY else None,
            stats={
                "queue_depth": worker.queue.depth,
                "batches_done": worker.batches_done,
                "batches_failed": worker.batches_failed,
                "inputs_done": worker.inputs_done,
                "worker_alive": worker.alive,
                "load_seconds": round(self.load_seconds or 0.0, 3),
            },
        )
        if worker.death:
            out["error"] = worker.death
        return out


def prepare_model(spec: ModelSpec, *, build_exports: bool = True) -> str:
    """Fetch a model's files and, unless told not to, build its backend's exports once (by
    loading it), so a server or image started later does neither. Returns a summary line."""
    path = resolve_model_dir(spec.model_id, spec.revision)
    if not build_exports:
        return f"{spec.name}: {path}"
    served = ServedModel(spec)
    try:
        served.load()
        facts = served.describe()
    finally:
        served.stop()
    return f"{spec.name}: {path}, ready for {facts['backend']} ({facts['dtype']}, {facts['device']})"
