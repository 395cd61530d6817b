"""One tower of a served model, assembled from its parts: the task's head and probes, how its
inputs become a batch, the batches int8 is calibrated on, the backend (chosen and checked),
the head fused into it where it can run there, the queue, a warm-up, the device's memory fit,
and the batch worker that runs it all. `ServedModel` asks for each of its towers here."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from infinity_cloud.backends import Backend
from infinity_cloud.backends.base import Calibration
from infinity_cloud.batching import BatchQueue, BatchWorker
from infinity_cloud.batching.worker import Observer
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.family import Tower as TowerName
from infinity_cloud.models import replicas
from infinity_cloud.models.backend_choice import open_backend
from infinity_cloud.models.batch_budget import (
    attention_crossover,
    batch_tokens,
    bucket,
    fit_device_memory,
    max_batch_size,
)
from infinity_cloud.numerics.fidelity import CALIBRATION_BATCHES, CALIBRATION_ROWS, PROBES, STATISTICS_BATCHES
from infinity_cloud.numerics.heads import FINAL, Head
from infinity_cloud.numerics.inputs import InputEncoder, ModelInputs
from infinity_cloud.tasks.base import Task
from infinity_cloud.tasks.quantization import calibration_texts
from infinity_cloud.tasks.registry import task_for
from infinity_cloud.text.input_encoder import TextInputEncoder
from infinity_cloud.text.tokenization import TextTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replica:
    """A tower's copy on one device (`models.replicas`): its own backend, queue and batch
    worker."""

    backend: Backend
    queue: BatchQueue
    worker: BatchWorker
    device: str  # cpu:0, cuda:1: what /metrics and /models label it by

    @property
    def load(self) -> float:
        """The work queued, coming and running on it: what a request is routed by."""
        return self.queue.backlog + self.worker.running_work


@dataclass(frozen=True)
class Tower:
    """One graph of a model with what feeds it: a text model has one tower, CLIP two (text
    and image), each with a replica (backend, queue and batch worker) per device it runs on."""

    replicas: tuple[Replica, ...]
    # A row the model answered at warm-up and its input: the form its cached rows must have.
    sample: tuple[Any, Any] | None = None

    @property
    def backend(self) -> Backend:
        """What it runs: every replica runs the same backend in the same precision."""
        return self.replicas[0].backend

    @property
    def serving(self) -> list[Replica]:
        """Its replicas whose workers are alive: a dead one takes only its own requests with it."""
        return [r for r in self.replicas if r.worker.alive]

    def least_loaded(self) -> Replica | None:
        """The live replica with the least work on it (the first of equals); None if none lives."""
        return min(self.serving, key=lambda r: r.load, default=None)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.worker.stop()
            replica.backend.close()


@dataclass(frozen=True)
class Collator:
    """How a tower's inputs become a batch: a text tower's tokens padded here, to the spec's
    static shapes, else to the backend's length grain (or to the model's length, where its
    encoder says so); any other tower's inputs by its own `encoder`, from its
    own probes."""

    spec: ModelSpec
    tokenizer: TextTokenizer
    encoder: InputEncoder | None  # None: a text tower, whose tokens are padded here
    full_length: bool = False  # every text padded to the model's length (SigLIP)
    grain: int = 1  # the backend's `length_grain`, once it is open

    @classmethod
    def of(
        cls, spec: ModelSpec, tokenizer: TextTokenizer, encoder: TextInputEncoder | InputEncoder
    ) -> Collator:
        if isinstance(encoder, TextInputEncoder):
            return cls(spec, tokenizer, None, encoder.full_length)
        return cls(spec, tokenizer, encoder)

    def padded_length(self, longest: int) -> int:
        if self.full_length:
            return self.tokenizer.max_length
        if self.spec.length_buckets:
            return bucket(longest, self.spec.length_buckets)
        return min(self.tokenizer.max_length, -(-longest // self.grain) * self.grain)

    def collate(self, items: list[Any], static: bool = True) -> ModelInputs:
        """A batch; `static`: padded to the spec's static shapes (the probes are not)."""
        rows = bucket(len(items), self.spec.batch_buckets) if static else None
        if self.encoder:
            return self.encoder.collate(items, rows)
        longest = max(len(e) for e in items)
        length = self.padded_length(longest) if static or self.full_length else None
        return ModelInputs.collate(items, self.tokenizer.pad_id, length=length, rows=rows)


def int8_build_batches(
    collator: Collator, task: Task[Any, Any], probes: list[Any], compared: Head
) -> Calibration:
    """Batches to build int8 with: standard-library docstrings, one batch in four to rank
    layers on (a run per layer: few), the rest held out with the load's probes, and other
    docstrings for activation ranges; media towers, which have no such texts, their fixed
    probes."""
    if collator.encoder:
        batch = collator.collate(probes, static=False)
        return Calibration([batch], [batch], compared, [batch])
    texts = calibration_texts(CALIBRATION_BATCHES * CALIBRATION_ROWS)
    taken = set(texts)
    others = [t for t in calibration_texts(4 * len(texts)) if t not in taken]
    batches = _text_batches(collator, task, texts)
    # The load's probes are held out too: what is built must pass the check at load.
    held_out = [b for i, b in enumerate(batches) if i % 4] + [collator.collate(probes, static=False)]
    statistics = _text_batches(collator, task, others[: STATISTICS_BATCHES * CALIBRATION_ROWS])
    return Calibration(batches[0::4], held_out, compared, statistics)


def _text_batches(collator: Collator, task: Task[Any, Any], texts: list[str]) -> list[ModelInputs]:
    """`texts` as the task's inputs, in unpadded batches of CALIBRATION_ROWS."""
    encode = functools.partial(task.encode_probes, collator.tokenizer)
    return [collator.collate(encode(texts[i : i + CALIBRATION_ROWS]), static=False)
            for i in range(0, len(texts), CALIBRATION_ROWS)]


# A started batch: the wait for its output, its attention mask, and its count of real inputs.
Started = tuple[Callable[[], np.ndarray], np.ndarray | None, int]


@dataclass(frozen=True)
class BatchRunner:
    """What the batch worker does with a batch: `run` collates and starts it on the backend,
    `finish` waits for it and makes its rows."""

    backend: Backend
    collator: Collator
    task: Task[Any, Any]
    head: Head

    def run(self, items: list[Any]) -> Started:
        inputs = self.collator.collate(items)
        return self.backend.submit(inputs), inputs.attention_mask, len(items)

    def finish(self, output: Started, items: list[Any]) -> Any:
        """The batch's rows, one per item (its model input)."""
        wait, mask, real = output  # `real`: static-shape filler rows are dropped
        return self.task.rows(self.head(wait()[:real], None if mask is None else mask[:real]), items)


def warm_up(runner: BatchRunner, queue: BatchQueue, probes: list[Any]) -> tuple[Any, Any]:
    """First-call kernel set-up, here, not in a caller's request; then a warm batch's pace,
    the queue's prior. Returns a row the model answered and its input."""
    sample = (runner.finish(runner.run(probes[:2]), probes[:2])[0], probes[0])
    started = time.perf_counter()
    runner.finish(runner.run(probes), probes)
    queue.prior(round(sum(queue.work(len(p)) for p in probes)), time.perf_counter() - started)
    return sample


class TowerBuilder:
    """Builds each tower of one model from what its load read: its spec and facts, its
    tokenizer, and whether its vectors are normalised."""

    def __init__(
        self, spec: ModelSpec, info: ModelInfo, tokenizer: TextTokenizer, normalize: bool,
        observers: Sequence[Observer] = (),
    ) -> None:
        self.spec = spec
        self.info = info
        self.tokenizer = tokenizer
        self.normalize = normalize
        self.observers = observers

    def build(
        self, name: TowerName, graph: GraphOutput, encoder: TextInputEncoder | InputEncoder,
        task: Task[Any, Any] | None = None,
    ) -> Tower:
        """The tower `name`, running `graph` on what `encoder` makes of its inputs, its worker
        started; `task`'s head on its output (default: the model's capability's task)."""
        spec, info, tokenizer = self.spec, self.info, self.tokenizer
        task = task or task_for(info.capability)
        head = task.head(info, graph, spec.pooling or info.pooling, self.normalize)
        compared = head.reference  # what precisions are measured on
        collator = Collator.of(spec, tokenizer, encoder)
        own = collator.encoder
        probes: list[Any] = own.probes() if own else task.encode_probes(tokenizer, PROBES)
        checked = probes if own else task.fidelity_probes(tokenizer)
        calibration = functools.partial(int8_build_batches, collator, task, probes, compared)
        first = open_backend(info, replicas.first_spec(spec), graph, collator.collate(checked, static=False),
                             compared, calibration, task.fidelity)
        opened, built = [first], []
        try:
            devices = replicas.replica_devices(spec, first)
            sample = None
            for index, device in enumerate(devices):
                if index:
                    opened.append(replicas.open_replica(first, info, spec, graph, device, len(devices),
                                                        calibration))
                replica, warm = self._serving(name, graph, opened[-1], collator, task, head, probes, device)
                built.append(replica)
                sample = sample or warm
        except BaseException:  # a warm-up or a device's fit failed: its memory goes back now
            for replica in built:
                replica.worker.stop()
            for backend in opened:
                backend.close()
            raise
        if len(devices) > 1:
            log.info("model %s: %d replicas (%s), %s %s each", spec.name, len(devices), ", ".join(devices),
                     first.name, first.dtype)
        return Tower(tuple(built), sample)

    def _serving(
        self, name: TowerName, graph: GraphOutput, backend: Backend, collator: Collator, task: Task[Any, Any],
        head: Head, probes: list[Any], device: str,
    ) -> tuple[Replica, tuple[Any, Any] | None]:
        """A replica around an open backend: the head fused where it can run there, the queue,
        the warm-up, the device's memory fit, and the worker, started; and the warm-up's sample."""
        spec, info = self.spec, self.info
        collator = replace(collator, grain=backend.length_grain)
        if backend.fuse(head):  # the backend runs it on its device; what it returns is final
            head = FINAL
        queue = BatchQueue(
            spec.queue_size, batch_tokens(spec, info, graph), max_batch_size(spec, backend.name),
            fill_wait_s=spec.batch_wait_ms / 1000, padded_length=collator.padded_length,
            deadline_s=spec.deadline_s, request_limit_s=spec.request_limit_s,
            attention_crossover=None if collator.encoder else attention_crossover(info),
        )
        runner = BatchRunner(backend, collator, task, head)
        sample = warm_up(runner, queue, probes) if spec.warmup else None
        if backend.free_device_bytes() is not None and not collator.encoder:
            fit_device_memory(backend, queue, probes, self.tokenizer.pad_id, self.tokenizer.max_length)
        label = spec.name if len(info.towers) == 1 and name in info.towers else f"{spec.name}:{name}"
        worker = BatchWorker(label, queue, runner.run, runner.finish, self.observers, device)
        worker.start()
        return Replica(backend, queue, worker, device), sample
