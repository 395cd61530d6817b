"""Two threads per model: one cuts and runs batches, one finishes them, so the next forward
pass starts while the last one's results are pooled and handed back."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infinity_cloud.batching.queue import Batch, BatchQueue, WorkItem
from infinity_cloud.core.errors import BatchFailedError, InfinityCloudError, ModelNotReadyError

log = logging.getLogger(__name__)


# Who submits work may say what it is for (the server: a request's trace, when tracing is on);
# each input keeps what was set when it was queued, and its batch's report hands it back.
ORIGIN: contextvars.ContextVar[Any] = contextvars.ContextVar("infinity_cloud_batch_origin", default=None)


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What one finished batch cost; handed to observers (metrics, stats, traces). Times are
    `time.perf_counter()` seconds."""

    model: str
    size: int
    real_tokens: int
    padded_tokens: int
    queue_wait_s: tuple[float, ...]
    forward_s: float  # the forward pass and its postprocessing
    failed: bool
    started_at: float = 0.0  # the forward pass's start
    ran_s: float = 0.0  # the forward pass alone
    origins: tuple[Any, ...] = ()  # each input's ORIGIN, as queue_wait_s
    device: str = ""  # the replica's device (`models.replicas`): cpu, cuda:1


Observer = Callable[[BatchReport], None]
# run(payloads) -> raw output; finish(raw output, payloads) -> one result per payload
RunBatch = Callable[[list[Any]], Any]
FinishBatch = Callable[[Any, list[Any]], Sequence[Any]]

_STOP = object()


class BatchWorker:
    def __init__(
        self,
        name: str,
        batch_queue: BatchQueue,
        run: RunBatch,
        finish: FinishBatch,
        observers: Sequence[Observer] = (),
        device: str = "",
    ) -> None:
        self.name = name
        self.device = device  # its replica's (`models.replicas`)
        self.queue = batch_queue
        self._run = run
        self._finish = finish
        self._observers = observers  # shared with the engine, which may add more later
        # One finished forward pass may wait for its postprocessing while the next runs.
        self._handoff: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._threads = [
            threading.Thread(target=self._guard, args=(self._forward_loop, self._stop_finisher),
                             name=f"{name}-forward", daemon=True),
            threading.Thread(target=self._guard, args=(self._finish_loop, self._drain_handoff),
                             name=f"{name}-finish", daemon=True),
        ]
        self.batches_done = 0
        self.batches_failed = 0
        self._last_finish = 0.0
        self.inputs_done = 0
        # Work taken from the queue, and of it answered (each written by one thread only):
        # a replica running a batch is not idle (`running_work`).
        self._taken_work = 0.0
        self._answered_work = 0.0
        self.death: str | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def running_work(self) -> float:
        """Work (`BatchQueue.work`) taken for batches and not yet answered."""
        return max(0.0, self._taken_work - self._answered_work)

    @property
    def alive(self) -> bool:
        return self.death is None and all(t.is_alive() for t in self._threads)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish what is running, fail what is still queued, and join the threads."""
        self.queue.close()
        for item in self.queue.drain():
            self._fail([item], ModelNotReadyError("the model is shutting down"))
        for thread in self._threads:
            thread.join(timeout)

    # -- event-loop side -------------------------------------------------------------

    async def submit(
        self, payloads: Sequence[Any], lengths: Sequence[int], urgent: bool = False
    ) -> list[Any]:
        """Queue the inputs and wait for their results, in order (`urgent`: `BatchQueue.put`)."""
        if not self.alive:
            raise ModelNotReadyError(f"model {self.name!r} is not serving: {self.death or 'worker stopped'}")
        loop = asyncio.get_running_loop()
        origin = ORIGIN.get()
        items = [WorkItem(p, n, loop.create_future(), origin=origin)
                 for p, n in zip(payloads, lengths, strict=True)]
        # Queued shortest first: all of a call's inputs are known now, so each batch cut from
        # its front holds inputs of nearly one length (a bulk job's shard, a chunked document),
        # where the queue alone sorts only the window it looks at. Results stay in call order.
        self.queue.put(sorted(items, key=lambda item: item.length), urgent)
        try:
            return await asyncio.gather(*(item.future for item in items))
        except BaseException:
            # The caller left or another input failed: drop what has not run yet.
            for item in items:
                item.cancelled = True
                if item.future.done() and not item.future.cancelled():
                    item.future.exception()  # mark it seen: one error answers the request
                item.future.cancel()
            raise

    # -- worker threads --------------------------------------------------------------

    def _guard(self, body: Callable[[], None], after_death: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as exc:  # a bug in the loop itself: make it visible, fail waiters
            self._die(exc)
            after_death()

    def _die(self, exc: BaseException, held: Sequence[WorkItem] = ()) -> None:
        """Mark the worker dead first (so nobody sees it alive after their answer), then fail
        the batch the dying thread held and everything still queued."""
        if self.death is None:
            self.death = f"{threading.current_thread().name} died: {type(exc).__name__}: {exc}"
            log.exception("model %s: %s", self.name, self.death)
        self.queue.close()
        for item in [*held, *self.queue.drain()]:
            self._fail([item], self._died())

    def _died(self) -> ModelNotReadyError:
        return ModelNotReadyError(f"model {self.name!r} worker died")

    def _stop_finisher(self) -> None:
        self._handoff.put(_STOP)

    def _drain_handoff(self) -> None:
        """The finisher died: fail what the forward thread still hands over, until it stops."""
        while (job := self._handoff.get()) is not _STOP:
            self._fail(job[0], self._died())

    def _forward_loop(self) -> None:
        while True:
            items = self.queue.take()
            if items is None:
                self._handoff.put(_STOP)
                return
            started = time.perf_counter()
            work = self._work(items)
            self._taken_work += work
            try:
                output = self._run([item.payload for item in items])
            except Exception as exc:
                log.exception("model %s: a batch of %d inputs failed", self.name, len(items))
                self._taken_work -= work
                self._report(items, started, failed=True)
                self._fail(items, _batch_error(exc, "inference"))
                continue
            except BaseException as exc:  # kills this thread (see _guard)
                self._die(exc, items)
                raise
            self._handoff.put((items, output, started, time.perf_counter() - started, work))

    def _finish_loop(self) -> None:
        while True:
            job = self._handoff.get()
            if job is _STOP:
                return
            items, output, started, ran_s, work = job
            try:
                results = self._finish(output, [item.payload for item in items])
            except Exception as exc:
                self._answered_work += work
                log.exception("model %s: postprocessing a batch failed", self.name)
                self._report(items, started, failed=True, ran_s=ran_s)
                self._fail(items, _batch_error(exc, "inference or postprocessing"))
                continue
            except BaseException as exc:
                self._die(exc, items)
                raise
            self._answered_work += work
            self._report(items, started, failed=False, ran_s=ran_s)
            self._observe_throughput(items, started)
            _on_loops(items, _resolve, results)

    def _work(self, items: Batch) -> float:
        return sum(self.queue.work(item.length) for item in items)

    def _observe_throughput(self, items: Batch, started: float) -> None:
        """Tell the queue how fast the model clears tokens under load: per saturated batch, the
        wall time since the later of its start and the previous batch's end (batches overlap
        when busy)."""
        now = time.perf_counter()
        if items.saturated:
            self.queue.observe(round(self._work(items)), now - max(started, self._last_finish))
        self._last_finish = now

    def _report(
        self, items: list[WorkItem], started: float, failed: bool, ran_s: float | None = None
    ) -> None:
        if failed:
            self.batches_failed += 1
        else:
            self.batches_done += 1
            self.inputs_done += len(items)
        if not self._observers:
            return
        lengths = [item.length for item in items]
        elapsed = time.perf_counter() - started
        report = BatchReport(
            model=self.name,
            size=len(items),
            real_tokens=sum(lengths),
            padded_tokens=max(lengths) * len(items),
            queue_wait_s=tuple(started - item.enqueued_at for item in items),
            forward_s=elapsed,
            failed=failed,
            started_at=started,
            ran_s=elapsed if ran_s is None else ran_s,
            origins=tuple(item.origin for item in items),
            device=self.device,
        )
        for observer in self._observers:
            try:
                observer(report)
            except Exception:
                log.exception("batch observer failed")

    def _fail(self, items: list[WorkItem], error: BaseException) -> None:
        _on_loops(items, _reject, [error] * len(items))


def _batch_error(exc: Exception, stage: str) -> InfinityCloudError:
    """What a batch's failure answers its requests with: a domain error a backend raised on
    purpose (a device out of memory: 503) as itself, anything else as a failed batch (500)."""
    if isinstance(exc, InfinityCloudError):
        return exc
    return BatchFailedError(
        f"{stage} failed for the batch holding this request's inputs ({type(exc).__name__}: {exc})"
    )


def _on_loops(items: list[WorkItem], callback: Callable[..., None], values: Sequence[Any]) -> None:
    """Hand results to the event loop(s) that wait for them: one wake-up per loop per batch."""
    by_loop: dict[asyncio.AbstractEventLoop, tuple[list[WorkItem], list[Any]]] = {}
    for item, value in zip(items, values, strict=True):
        group = by_loop.setdefault(item.future.get_loop(), ([], []))
        group[0].append(item)
        group[1].append(value)
    for loop, (group_items, group_values) in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(callback, group_items, group_values)


def _resolve(items: list[WorkItem], results: Sequence[Any]) -> None:
    for item, result in zip(items, results, strict=True):
        if not item.future.done():
            item.future.set_result(result)


def _reject(items: list[WorkItem], errors: Sequence[BaseException]) -> None:
    for item, error in zip(items, errors, strict=True):
        if not item.future.done():
            item.future.set_exception(error)
