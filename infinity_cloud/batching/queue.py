"""A thread-safe queue of inputs that hands out length-sorted batches under a token budget."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.batching.places import Places
from infinity_cloud.core.errors import ModelNotReadyError, PayloadTooLargeError, QueueFullError


@dataclass(eq=False, slots=True)
class WorkItem:
    """One input waiting for the model; `payload` is opaque here, `length` its cost."""

    payload: Any
    length: int
    future: asyncio.Future[Any]
    enqueued_at: float = field(default_factory=time.perf_counter)
    # Set on the event loop when the caller gave up (disconnect, cancel); read by the cutter.
    cancelled: bool = False
    # What the submitter said the input is for (`worker.ORIGIN`), handed back in its batch's report.
    origin: Any = None


class Batch(list[WorkItem]):
    """Inputs cut to run together. `saturated`: cut from a queue that held more than it took,
    so the batch was as large as the limits allow, and its pace is the model's throughput
    under load (a lone small batch is mostly fixed cost: 4 tokens in 6 ms is not a rate)."""

    saturated = False


class _Urgent(deque[WorkItem]):
    """The inputs of a request that goes before the others (`BatchQueue.put`)."""


class BatchQueue:
    """Bounded queue of requests' inputs whose `take` cuts the next batch.

    Fair by request: each `put` is one request, and batches are cut from a window that takes
    the waiting requests' oldest inputs in turn, anchored on the oldest input of the request
    whose turn it is; after each batch that request goes to the back. So a one-text request
    behind a 2,000-text one goes out in the next batch or two, not after all 2,000, and nothing
    starves. Within the window a batch takes the inputs closest in length to its anchor, so
    padding stays small. Its cost is padded tokens (longest x count), bounded by
    `batch_tokens`; its size by `max_batch_size`. An input longer than the budget still goes,
    alone.

    `fill_wait_s`: when what is waiting would make a batch that is not full, wait up to this
    long (from the oldest input's arrival) for more, so trickling requests share a forward
    pass; under load the queue is long and nobody waits. `padded_length` maps a batch's
    longest input to the length it is padded to (static-shape buckets); identity otherwise.

    `deadline_s` bounds a request's *wait*: one whose wait on the work ahead of it (what is
    queued or coming, taking turns, and the places kept for requests shed before it), at the
    model's recent throughput under load (`observe`), corrected by how long admitted requests
    really stayed (`calibrate`), would pass it is refused at `admit` with a 429 whose
    Retry-After is when that wait will have drained, its place kept. Its own work is not held
    against the deadline: a large request is batched and takes turns with the others.
    `request_limit_s` is the platform's own limit on one request (SageMaker's 60 s, an API
    Gateway's 29 s; None locally): a request whose own work alone would pass it on an idle
    server is a 413 that names what fits, and one whose wait and work together would is a 429.

    An `urgent` request (the model's own background work that callers wait for, such as
    int8 calibration) goes first: every batch is anchored on it until it is done.

    Waits are judged in work, not tokens (`work`): with `attention_crossover` (the length at
    which a token's attention costs what its linear layers do), an input of L tokens is
    L x (1 + L / crossover) of work, so an 8,192-token input on a long-context model counts
    what attention's square makes it, and a burst of them is refused with a Retry-After that
    holds, not admitted at a short input's pace. Without it, work is tokens.
    """

    def __init__(
        self,
        capacity: int,
        batch_tokens: int,
        max_batch_size: int,
        fill_wait_s: float = 0.0,
        padded_length: Callable[[int], int] | None = None,
        deadline_s: float | None = None,
        request_limit_s: float | None = None,
        attention_crossover: float | None = None,
    ) -> None:
        self.capacity = capacity
        self.attention_crossover = attention_crossover
        self.batch_tokens = batch_tokens
        self.max_batch_size = max_batch_size
        self.fill_wait_s = fill_wait_s
        self.deadline_s = deadline_s
        self.request_limit_s = request_limit_s
        self._places = Places()
        self._padded = padded_length or (lambda n: n)
        self._window = max(8 * max_batch_size, 256)
        self._requests: deque[deque[WorkItem]] = deque()
        self._depth = 0
        self._tokens = 0  # lengths of everything waiting
        self._work = 0.0  # their work (`work`)
        # Requests admitted (`admit`) and still being tokenized: their estimated tokens.
        self._pending_tokens = 0
        self._pending_requests = 0
        # Recent saturated batches' tokens and seconds, each summed with decay: their ratio is
        # the throughput. (A mean of per-batch rates is not: batches on parallel streams finish
        # close together, and the near-zero gaps between them read as huge rates.)
        self._done_tokens = 0.0
        self._done_seconds = 0.0
        self._prior_rate: float | None = None  # `prior`
        # How much longer requests really stay queued than the plain estimate says (taking
        # turns by length, a request is done only when its last input is; later arrivals
        # take turns too), learned from requests served (`calibrate`).
        self._slack = 1.0
        self._cond = threading.Condition()
        self._closed = False

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def queued_tokens(self) -> int:
        """Tokens of the inputs waiting for a batch: the work queued, which an autoscaler
        divides by what a replica should hold (`infinity_cloud_queued_tokens`)."""
        return self._tokens

    @property
    def backlog(self) -> float:
        """The work waiting and admitted to come (`work`): how loaded this queue's replica is."""
        return self._work + self._pending_tokens

    @property
    def closed(self) -> bool:
        return self._closed

    def work(self, length: int) -> float:
        """An input of `length` tokens as work: its tokens, each weighed by the attention over
        the others (linear in `length`)."""
        crossover = self.attention_crossover
        return float(length) if not crossover else length * (1.0 + length / crossover)

    def request_work(self, tokens: int, inputs: int) -> int:
        """A request's estimated `tokens` over `inputs` as work, at their mean length (what
        `admit` and `settle` take)."""
        return round(self.work(max(1, tokens // max(1, inputs))) * max(1, inputs)) if tokens else 0

    def observe(self, tokens: int, seconds: float) -> None:
        """A finished saturated batch: `tokens` in `seconds` of the model's time."""
        if seconds < 0 or tokens <= 0:
            return
        with self._cond:
            self._done_tokens = 0.9 * self._done_tokens + tokens
            self._done_seconds = 0.9 * self._done_seconds + seconds

    def prior(self, tokens: int, seconds: float) -> None:
        """The pace of a small batch timed at load: until saturated batches are measured, the
        deadline is judged by it, so a storm at start is not all admitted unjudged. A small
        batch is mostly fixed cost, so it underrates the model: sheds are on the safe side."""
        if seconds > 0 and tokens > 0:
            self._prior_rate = tokens / seconds

    @property
    def prior_rate(self) -> float | None:
        """The pace of the warm batch timed at load (`prior`)."""
        return self._prior_rate

    @property
    def rate(self) -> float | None:
        """Tokens per second under load, recently; None before a saturated batch finished."""
        return self._done_tokens / self._done_seconds if self._done_seconds > 0 else None

    def _plain_wait_s(self, tokens: int, ahead: tuple[int, int] = (0, 0)) -> float | None:
        """Requests take turns, so a new one waits for a share of each waiting request's
        tokens like its own, never more than the whole queue; and behind the whole of each
        place kept before it (`ahead`: their tokens and count, `Places`), which its turn must
        not push past the deadline. None before a throughput (measured, or the prior)."""
        rate = self.rate or self._prior_rate
        if rate is None:
            return None
        queued = self._work + self._pending_tokens
        others = len(self._requests) + self._pending_requests
        return (min(queued, others * tokens) + ahead[0]) / rate

    def estimated_wait_s(self, tokens: int = 0) -> float | None:
        """How long a new request of `tokens` would wait on others (its own work not counted),
        as calibrated; None before a throughput."""
        plain = self._plain_wait_s(tokens)
        return None if plain is None else plain * self._slack

    def urgent_s(self) -> float | None:
        """How long the urgent work queued will take, at the model's pace; None before one."""
        rate = self.rate or self._prior_rate
        with self._cond:
            urgent = [r for r in self._requests if isinstance(r, _Urgent)]
            work = sum(self.work(item.length) for request in urgent for item in request if not item.cancelled)
        return None if rate is None else work / rate

    @property
    def contended(self) -> bool:
        """Whether a request could be shed now (anything queued, coming, or a place kept): only
        then does `admit` need its key."""
        return bool(self._depth or self._pending_requests or self._places)

    def admit(
        self, tokens: int, key: str | None = None, inputs: int = 0, background: bool = False,
        real_tokens: int | None = None,
    ) -> float | None:
        """Before a request is tokenized: refuse it when it cannot be served in time, else count
        its estimated `tokens` (of work: `request_work`; `real_tokens`, its tokens, for the
        413's message) as coming, until `settle`. Deciding here, not at `put`, keeps a
        flood of requests from waiting in the tokenizer pool unseen.

        - 413 when its own work alone, on an idle server at the model's pace measured under
          load, would pass `request_limit_s` (`inputs`: its count, for the message).
        - 429 with Retry-After when the model has work in hand and the request's wait on it (its
          turns with what is queued or coming, behind the places kept before `key`'s) would pass
          `deadline_s`, or that wait and its own work would pass `request_limit_s`; its place is
          kept under `key` (`Places`).
        `background`: the model's own work (calibration), never refused for load.

        Returns the plain estimate of its time queued, its own share included, for
        `calibrate` (None before a throughput is known)."""
        with self._cond:
            if self._closed:
                raise ModelNotReadyError("the model is shutting down and takes no new inputs")
            rate = self.rate or self._prior_rate  # before load's first full batches: the prior
            if rate is None or background:  # nothing to judge by, or nothing to refuse
                self._places.release(key)
                self._count_coming(tokens)
                return None
            own = tokens / rate
            # A 413 is final for its caller: given only on a pace measured under load, never on the
            # prior (a small batch's pace, which underrates the model).
            limit = self.request_limit_s
            if limit is not None and self.rate is not None and own > limit:
                raise self._too_large(tokens if real_tokens is None else real_tokens, own, inputs)
            # Kept places count for at most a deadline's work: more could not be served within
            # one anyway, and places of clients that gave up would push every estimate out.
            most = None if self.deadline_s is None else int(self.deadline_s * rate)
            plain = self._plain_wait_s(tokens, self._places.ahead_of(key, most))
            assert plain is not None
            wait = plain * self._slack
            # Only a model with work in hand sheds: on an idle one, places kept for clients not
            # back yet (or gone) hold nobody back.
            if self._depth or self._pending_requests:
                excess = max(
                    -1.0 if self.deadline_s is None else wait - self.deadline_s,
                    -1.0 if limit is None else wait + own - limit,
                )
                if excess > 0:
                    retry_after = max(1, math.ceil(excess))
                    if key is not None:
                        self._places.keep(key, tokens, retry_after)
                    kept = " (its place in line is kept)" if key is not None else ""
                    what = (f"the {self.deadline_s:g} s deadline" if self.deadline_s is not None
                            and wait > self.deadline_s else f"the {limit:g} s limit on one request")
                    error = QueueFullError(
                        f"the model is overloaded: this request would wait about {wait:.1f} s for the "
                        f"work ahead of it, past {what}; retry after {retry_after} s{kept}"
                    )
                    error.retry_after_s = retry_after
                    raise error
            self._places.release(key)
            self._count_coming(tokens)
            return plain + own

    def _count_coming(self, tokens: int) -> None:
        self._pending_tokens += tokens
        self._pending_requests += 1

    def _too_large(self, tokens: int, seconds: float, inputs: int) -> PayloadTooLargeError:
        """A request that alone would take past the platform's limit on one request: how much
        would fit."""
        assert self.request_limit_s is not None
        fits = int(tokens * self.request_limit_s / seconds)
        share = f" (about {max(1, inputs * fits // tokens)} of its {inputs} inputs)" if inputs > 1 else ""
        return PayloadTooLargeError(
            f"this request alone would take about {seconds:.1f} s on an idle server at the model's pace, "
            f"past this platform's {self.request_limit_s:g} s limit on one request: about {fits:,} of "
            f"its {tokens:,} tokens fit{share}; split it"
        )

    def calibrate(self, predicted_s: float, queued_s: float) -> None:
        """A request `admit` predicted to stay `predicted_s` was served after `queued_s`. Only
        queues long enough to matter teach: short ones are mostly fixed costs."""
        if predicted_s < 0.5:
            return
        with self._cond:
            self._slack = min(4.0, max(0.5, 0.9 * self._slack + 0.1 * queued_s / predicted_s))

    def settle(self, tokens: int) -> None:
        """An admitted request is queued (or failed before): it is no longer coming."""
        with self._cond:
            self._pending_tokens -= tokens
            self._pending_requests -= 1

    def put(self, items: list[WorkItem], urgent: bool = False) -> None:
        """Queue one request's inputs, or refuse them all. `urgent`: ahead of every request but
        urgent ones queued before it, and every batch anchored on it until it is done."""
        with self._cond:
            if self._closed:
                raise ModelNotReadyError("the model is shutting down and takes no new inputs")
            if len(items) > self.capacity:  # could never fit: retrying would not help
                raise PayloadTooLargeError(
                    f"{len(items)} inputs are more than the model's whole queue ({self.capacity}); "
                    "split the request"
                )
            if self._depth + len(items) > self.capacity:
                raise QueueFullError(
                    f"the model's queue is full ({self._depth} inputs waiting, limit "
                    f"{self.capacity}); retry shortly"
                )
            if urgent:
                first = next((i for i, r in enumerate(self._requests) if not isinstance(r, _Urgent)),
                             len(self._requests))
                self._requests.insert(first, _Urgent(items))
            else:
                self._requests.append(deque(items))
            self._depth += len(items)
            self._tokens += sum(item.length for item in items)
            self._work += sum(self.work(item.length) for item in items)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drain(self) -> list[WorkItem]:
        """Remove and return everything still waiting."""
        with self._cond:
            items = [item for request in self._requests for item in request]
            self._requests.clear()
            self._depth = self._tokens = 0
            self._work = 0.0
            return items

    def _oldest(self) -> WorkItem | None:
        """The head request's oldest live input, dropping cancelled ones and empty requests."""
        while self._requests:
            head = self._requests[0]
            while head and head[0].cancelled:
                self._forget(head.popleft())
            if head:
                return head[0]
            self._requests.popleft()
        return None

    def _forget(self, item: WorkItem) -> None:
        self._depth -= 1
        self._tokens -= item.length
        self._work -= self.work(item.length)

    def take(self, timeout: float | None = None) -> Batch | None:
        """Block until a batch can be cut; None once closed and empty (or on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._oldest() is not None:
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
        oldest = min(request[0].enqueued_at for request in self._requests if request)
        fill_by = oldest + self.fill_wait_s
        if time.perf_counter() >= fill_by or self._depth >= self.max_batch_size:
            return None
        waiting = sum(self._padded(item.length) for request in self._requests for item in request)
        return None if waiting >= self.batch_tokens else fill_by

    def _gather(self) -> tuple[list[WorkItem], list[int]]:
        """The window: waiting requests' oldest inputs, one from each in turn, the head
        request first; and how far into each request it reached."""
        window: list[WorkItem] = []
        cursors = [0] * len(self._requests)
        head = self._requests[0] if self._requests else None
        if isinstance(head, _Urgent):  # its inputs first: the batch is made of them
            while cursors[0] < len(head) and len(window) < self._window:
                if not head[cursors[0]].cancelled:
                    window.append(head[cursors[0]])
                cursors[0] += 1
        more = True
        while more and len(window) < self._window:
            more = False
            for r, request in enumerate(self._requests):
                while cursors[r] < len(request) and request[cursors[r]].cancelled:
                    cursors[r] += 1
                if cursors[r] < len(request) and len(window) < self._window:
                    window.append(request[cursors[r]])
                    cursors[r] += 1
                    more = True
        return window, cursors

    def _cut(self) -> Batch:
        window, reached = self._gather()
        order = sorted(range(len(window)), key=lambda i: window[i].length)
        lo, hi = self._grow([window[i].length for i in order], order.index(0))
        batch = Batch(window[i] for i in sorted(order[lo : hi + 1]))
        self._take(batch, reached)
        if not isinstance(self._requests[0], _Urgent):  # the next batch is anchored on the next request
            self._requests.rotate(-1)
        self._requests = deque(request for request in self._requests if request)
        batch.saturated = any(not item.cancelled for request in self._requests for item in request)
        return batch

    def _grow(self, lengths: list[int], anchor: int) -> tuple[int, int]:
        """The batch, as a run [lo, hi] of the window's inputs sorted by `lengths`, grown from
        `anchor` (the head request's oldest input) one input at a time, each time by the
        neighbour that adds the least padding, while it fits the token budget."""
        lo = hi = anchor
        longest = lengths[anchor]
        count = 1
        while count < self.max_batch_size:
            options = []
            if lo > 0:  # a shorter input: the batch's cost grows by one padded row
                options.append((longest - lengths[lo - 1], -1, longest))
            if hi < len(lengths) - 1:  # a longer one: every row grows to its length
                options.append(((lengths[hi + 1] - longest) * count, 1, lengths[hi + 1]))
            options = [o for o in options if self._padded(o[2]) * (count + 1) <= self.batch_tokens]
            if not options:
                break
            _, step, longest = min(options)
            if step < 0:
                lo -= 1
            else:
                hi += 1
            count += 1
        return lo, hi

    def _take(self, batch: Batch, reached: list[int]) -> None:
        """What was taken (or cancelled) leaves its request; only the part the window reached
        is looked at, so a cut costs the window, not the whole queue."""
        taken = {id(item) for item in batch}
        for request, seen in zip(self._requests, reached, strict=True):
            front = [request.popleft() for _ in range(seen)]
            for item in front:
                if id(item) in taken or item.cancelled:
                    self._forget(item)
            request.extendleft(reversed([i for i in front if id(i) not in taken and not i.cancelled]))
