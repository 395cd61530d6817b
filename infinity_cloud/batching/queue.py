"""A thread-safe queue of inputs that hands out length-sorted batches under a token budget."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.errors import ModelNotReadyError, PayloadTooLargeError, QueueFullError


@dataclass(eq=False, slots=True)
class WorkItem:
    """One input waiting for the model; `payload` is opaque here, `length` its cost."""

    payload: Any
    length: int
    future: asyncio.Future[Any]
    enqueued_at: float = field(default_factory=time.perf_counter)
    # Set on the event loop when the caller gave up (disconnect, cancel); read by the cutter.
    cancelled: bool = False


class BatchQueue:
    """Bounded FIFO whose `take` cuts the next batch.

    A batch is anchored on the oldest waiting input, so nothing starves, and filled from a
    window of the oldest inputs with those closest to it in length, so padding stays small.
    Its cost is padded tokens (longest x count), bounded by `batch_tokens`; its size by
    `max_batch_size`. An input longer than the budget still goes, alone.

    `fill_wait_s`: when what is waiting would make a batch that is not full, wait up to this
    long (from the oldest input's arrival) for more, so trickling requests share a forward
    pass; under load the queue is long and nobody waits. `padded_length` maps a batch's
    longest input to the length it is padded to (static-shape buckets); identity otherwise.
    """

    def __init__(
        self,
        capacity: int,
        batch_tokens: int,
        max_batch_size: int,
        fill_wait_s: float = 0.0,
        padded_length: Callable[[int], int] | None = None,
    ) -> None:
        self.capacity = capacity
        self.batch_tokens = batch_tokens
        self.max_batch_size = max_batch_size
        self.fill_wait_s = fill_wait_s
        self._padded = padded_length or (lambda n: n)
        self._window = max(8 * max_batch_size, 256)
        self._items: deque[WorkItem] = deque()
        self._cond = threading.Condition()
        self._closed = False

    @property
    def depth(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, items: list[WorkItem]) -> None:
        with self._cond:
            if self._closed:
                raise ModelNotReadyError("the model is shutting down and takes no new inputs")
            if len(items) > self.capacity:  # could never fit: retrying would not help
                raise PayloadTooLargeError(
                    f"{len(items)} inputs are more than the model's whole queue ({self.capacity}); "
                    "split the request"
                )
            if len(self._items) + len(items) > self.capacity:
                raise QueueFullError(
                    f"the model's queue is full ({len(self._items)} inputs waiting, limit "
                    f"{self.capacity}); retry shortly"
                )
            self._items.extend(items)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drain(self) -> list[WorkItem]:
        """Remove and return everything still waiting."""
        with self._cond:
            items = list(self._items)
            self._items.clear()
            return items

    def take(self, timeout: float | None = None) -> list[WorkItem] | None:
        """Block until a batch can be cut; None once closed and empty (or on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                while self._items and self._items[0].cancelled:
                    self._items.popleft()
                if self._items:
                    fill_by = self._fill_deadline()
                    if fill_by is None or self._closed:
                        return self._cut()
                    # Wake at the fill deadline, or earlier when more arrives.
                    self._cond.wait(max(0.0, fill_by - time.perf_counter()))
                    continue
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def _fill_deadline(self) -> float | None:
        """When to stop waiting for a fuller batch; None: cut now."""
        if not self.fill_wait_s:
            return None
        fill_by = self._items[0].enqueued_at + self.fill_wait_s
        if time.perf_counter() >= fill_by or len(self._items) >= self.max_batch_size:
            return None
        waiting_tokens = sum(self._padded(item.length) for item in self._items)
        return None if waiting_tokens >= self.batch_tokens else fill_by

    def _cut(self) -> list[WorkItem]:
        window: list[WorkItem] = []
        while self._items and len(window) < self._window:
            item = self._items.popleft()
            if not item.cancelled:
                window.append(item)
        order = sorted(range(len(window)), key=lambda i: window[i].length)
        anchor = order.index(0)  # window[0] is the oldest input
        lo = hi = anchor
        longest = window[0].length
        pad = self._padded
        count = 1
        while count < self.max_batch_size:
            options = []
            if lo > 0:  # a shorter input: the batch's cost grows by one padded row
                shorter = window[order[lo - 1]].length
                options.append((longest - shorter, -1, longest))
            if hi < len(order) - 1:  # a longer one: every row grows to its length
                longer = window[order[hi + 1]].length
                options.append(((longer - longest) * count, 1, longer))
            options = [o for o in options if pad(o[2]) * (count + 1) <= self.batch_tokens]
            if not options:
                break
            _, step, longest = min(options)
            if step < 0:
                lo -= 1
            else:
                hi += 1
            count += 1
        chosen = set(order[lo : hi + 1])
        batch = [window[i] for i in sorted(chosen)]
        rest = [item for i, item in enumerate(window) if i not in chosen]
        self._items.extendleft(reversed(rest))
        return batch
