"""Unit tests of the dynamic batcher: the queue's cutting rules and the worker's threads.

No model and no HTTP here: payloads are plain values, `run` and `finish` small functions.
`asyncio.wait_for` and thread joins carry generous timeouts only so that a regression
fails instead of hanging the suite; nothing here asserts on how long anything takes.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from conftest import wait_until

from infinity_cloud.batching import BatchQueue, BatchReport, BatchWorker, WorkItem
from infinity_cloud.batching.places import Places
from infinity_cloud.core.errors import (
    BatchFailedError,
    ModelNotReadyError,
    PayloadTooLargeError,
    QueueFullError,
)

HANG_GUARD_S = 30.0


def items(*lengths: int, start: int = 0) -> list[WorkItem]:
    """Work items whose payload is their position; the queue never touches the future."""
    return [WorkItem(start + i, n, None) for i, n in enumerate(lengths)]  # type: ignore[arg-type]


def take_all(queue: BatchQueue) -> list[list[WorkItem]]:
    batches = []
    while (batch := queue.take(timeout=0)) is not None:
        batches.append(batch)
    return batches


def check_batch(queue: BatchQueue, batch: list[WorkItem]) -> None:
    assert 1 <= len(batch) <= queue.max_batch_size
    longest = max(item.length for item in batch)
    if len(batch) > 1:
        assert longest * len(batch) <= queue.batch_tokens, [i.length for i in batch]


# -- BatchQueue ------------------------------------------------------------------------


def test_budget_and_max_batch_size_hold_for_random_queues() -> None:
    rng = random.Random(7)
    for _ in range(50):
        queue = BatchQueue(capacity=10_000, batch_tokens=rng.choice([64, 256, 1000]),
                           max_batch_size=rng.choice([1, 4, 16]))
        waiting = items(*(rng.randint(1, 300) for _ in range(rng.randint(1, 200))))
        queue.put(waiting)
        batches = take_all(queue)
        for batch in batches:
            check_batch(queue, batch)
        taken = [item.payload for batch in batches for item in batch]
        assert sorted(taken) == list(range(len(waiting)))  # each input exactly once
        assert queue.depth == 0


def test_an_input_over_the_budget_goes_alone() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=64, max_batch_size=8)
    queue.put(items(500, 3, 3, 3))
    first = queue.take(timeout=0)
    assert [i.length for i in first] == [500]
    assert [i.length for i in queue.take(timeout=0)] == [3, 3, 3]


def test_max_batch_size_caps_a_batch_of_cheap_inputs() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=4)
    queue.put(items(*[5] * 10))
    assert [len(b) for b in take_all(queue)] == [4, 4, 2]


def test_batch_keeps_the_queue_order_of_its_inputs() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=8)
    queue.put(items(9, 3, 7, 1, 5))
    assert [i.payload for i in queue.take(timeout=0)] == [0, 1, 2, 3, 4]


def test_mixed_queue_is_cut_into_length_homogeneous_batches() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=400, max_batch_size=8)
    queue.put(items(*[10, 100] * 8))
    batches = take_all(queue)
    assert [sorted({i.length for i in b}) for b in batches] == [[10], [100], [100]]
    assert [len(b) for b in batches] == [8, 4, 4]


def test_a_long_input_behind_a_stream_of_short_ones_still_goes() -> None:
    """No starvation: each request's oldest input anchors a batch in its turn."""
    rng = random.Random(3)
    queue = BatchQueue(capacity=10_000, batch_tokens=128, max_batch_size=8)
    queue.put(items(4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 120, start=0))
    long_item = 10
    taken: set[int] = set()
    next_id = 11
    for _ in range(20):
        queue.put(items(*(rng.randint(2, 6) for _ in range(6)), start=next_id))
        next_id += 6
        batch = queue.take(timeout=0)
        check_batch(queue, batch)
        taken.update(i.payload for i in batch)
    assert long_item in taken


def test_a_small_request_behind_a_large_one_goes_in_the_next_batches() -> None:
    """Fair by request: one text behind 2,000 goes out within two batches, not after them."""
    queue = BatchQueue(capacity=10_000, batch_tokens=512, max_batch_size=16)
    queue.put(items(*[30] * 2000))
    queue.put(items(200, start=5000))  # another length: it cannot ride along by chance
    first, second = queue.take(timeout=0), queue.take(timeout=0)
    assert 5000 in {i.payload for i in [*first, *second]}
    rest = take_all(queue)
    taken = [i.payload for batch in [first, second, *rest] for i in batch]
    assert sorted(taken) == [*range(2000), 5000] and queue.depth == 0


def test_requests_take_turns() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=2)
    queue.put(items(5, 5, 5, 5, start=0))
    queue.put(items(50, 50, start=10))
    queue.put(items(500, start=20))
    batches = [{i.payload for i in batch} for batch in take_all(queue)]
    assert 0 in batches[0] and 10 in batches[1] and 20 in batches[2]  # each request's turn


def test_overload_is_refused_by_deadline_with_retry_after() -> None:
    """At 100 tokens/s with five requests of 100 tokens waiting and a 2 s deadline, another
    like them would wait about 5 s on them (taking turns): refused at once, with Retry-After
    for when that wait will have drained to the deadline (its own 1 s is not held against
    it). A small one still fits (its turns come quickly), and once the queue has cleared the
    large one does too."""
    queue = BatchQueue(capacity=10_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0)
    for start in range(5):  # no throughput known yet: admitted
        queue.admit(100)
        queue.settle(100)
        queue.put(items(100, start=start))
    queue.observe(tokens=100, seconds=1.0)
    with pytest.raises(QueueFullError, match="overloaded") as refused:
        queue.admit(100)
    assert refused.value.retry_after_s == 3  # ceil(min(500, 5 x 100) / 100 - 2)
    queue.admit(10)  # 5 x 10 tokens: 0.5 s
    # Admitted requests still being tokenized count as coming: four more small ones fit, ...
    for _ in range(4):
        queue.admit(10)
    take_all(queue)
    # ... and while they are coming, a large one is weighed against them too.
    queue.admit(100)


def test_throughput_is_tokens_over_seconds_of_saturated_batches() -> None:
    """Batches on parallel streams finish close together: a mean of per-batch rates would read
    the 1 ms gap as 100,000 tokens/s; the ratio of the sums does not."""
    queue = BatchQueue(capacity=100, batch_tokens=10, max_batch_size=2)
    assert queue.rate is None
    queue.observe(tokens=100, seconds=1.0)
    queue.observe(tokens=100, seconds=0.001)
    assert 150 < queue.rate < 250
    # A batch is saturated when the queue held more than it took.
    queue.put(items(5, 5, 5))
    first, second = queue.take(timeout=0), queue.take(timeout=0)
    assert len(first) == 2 and first.saturated
    assert len(second) == 1 and not second.saturated


async def test_a_lone_small_batch_teaches_no_throughput() -> None:
    """Warming up with four tokens in a few milliseconds is fixed cost, not a rate: taken as
    one, the next burst would be refused as if it would wait for minutes."""
    worker = make_worker(lambda payloads: payloads, max_batch_size=4)
    try:
        await worker.submit([1], [4])
        assert worker.queue.rate is None
        await worker.submit(list(range(12)), [4] * 12)  # three batches, two cut from a longer queue
        assert worker.queue.rate is not None
    finally:
        worker.stop()


def test_the_wait_estimate_learns_from_requests_served() -> None:
    """Taking turns by length, a request is done only with its last input: if requests stay
    queued twice as long as predicted, the estimate doubles (and short queues teach nothing)."""
    queue = BatchQueue(capacity=10_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0)
    queue.observe(tokens=100, seconds=1.0)
    queue.put(items(100))
    predicted = queue.admit(100)  # 1 s on the other, 1 s its own
    queue.settle(100)
    assert predicted == pytest.approx(2.0)
    assert queue.estimated_wait_s(100) == pytest.approx(1.0)
    for _ in range(50):
        queue.calibrate(predicted, 4.0)
        queue.calibrate(0.1, 10.0)  # too short to teach
    assert queue.estimated_wait_s(100) == pytest.approx(2.0, rel=0.02)
    queue.put(items(100))
    with pytest.raises(QueueFullError, match="overloaded"):
        queue.admit(100)  # 2 requests ahead: ~4 s now


def test_cancelled_inputs_are_skipped() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=1000, max_batch_size=8)
    waiting = items(5, 5, 5, 5, 5, 5)
    for i in (0, 1, 3, 5):
        waiting[i].cancelled = True
    queue.put(waiting)
    assert [i.payload for i in queue.take(timeout=0)] == [2, 4]
    assert queue.take(timeout=0) is None
    assert queue.depth == 0


def test_a_queue_of_cancelled_inputs_gives_no_batch() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=1000, max_batch_size=8)
    waiting = items(5, 5)
    for item in waiting:
        item.cancelled = True
    queue.put(waiting)
    assert queue.take(timeout=0.01) is None
    queue.close()
    assert queue.take() is None


def test_capacity_is_enforced_before_anything_is_queued() -> None:
    queue = BatchQueue(capacity=5, batch_tokens=1000, max_batch_size=8)
    queue.put(items(1, 1, 1))
    with pytest.raises(QueueFullError, match="queue is full"):
        queue.put(items(1, 1, 1))
    assert queue.depth == 3  # all or nothing
    queue.put(items(1, 1))  # exactly at capacity is fine
    assert queue.depth == 5


def test_close_wakes_a_blocked_take_and_then_take_returns_none() -> None:
    queue = BatchQueue(capacity=10, batch_tokens=1000, max_batch_size=8)
    queue._cond = WatchedCondition()
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(queue.take()))
    taker.start()
    assert queue._cond.waiting.wait(HANG_GUARD_S)  # really blocked before the close
    queue.close()
    taker.join(HANG_GUARD_S)
    assert not taker.is_alive()
    assert got == [None]
    assert queue.closed
    assert queue.take() is None


def test_a_closed_queue_still_hands_out_what_waits_then_none() -> None:
    queue = BatchQueue(capacity=10, batch_tokens=1000, max_batch_size=8)
    queue.put(items(3, 3))
    queue.close()
    assert len(queue.take()) == 2
    assert queue.take() is None


def test_a_closed_queue_refuses_inputs_as_not_ready() -> None:
    """Shutting down is a 503 (ModelNotReadyError), not a 429 (QueueFullError)."""
    queue = BatchQueue(capacity=10, batch_tokens=1000, max_batch_size=8)
    queue.close()
    with pytest.raises(ModelNotReadyError, match="shutting down"):
        queue.put(items(1))


class WatchedCondition(threading.Condition):
    """A condition that says when someone waits on it, so a test can put only once `take`
    really blocks (not sleep and hope)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_take_blocks_until_an_input_arrives() -> None:
    queue = BatchQueue(capacity=10, batch_tokens=1000, max_batch_size=8)
    queue._cond = WatchedCondition()
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(queue.take(timeout=HANG_GUARD_S)))
    taker.start()
    assert queue._cond.waiting.wait(HANG_GUARD_S) and got == []  # blocked, with nothing yet
    queue.put(items(7))
    taker.join(HANG_GUARD_S)
    assert [[i.length for i in got[0]]] == [[7]]


# -- BatchWorker -----------------------------------------------------------------------


class Fatal(BaseException):
    """Not an Exception: what a batch-level `except Exception` does not catch."""


def identity_finish(output: Any, _: list[Any]) -> Sequence[Any]:
    return output


def make_worker(
    run: Callable[[list[Any]], Any],
    finish: Callable[[Any, list[Any]], Sequence[Any]] = identity_finish,
    *,
    batch_tokens: int = 100,
    max_batch_size: int = 4,
    capacity: int = 1000,
    observers: Sequence[Callable[[BatchReport], None]] = (),
) -> BatchWorker:
    worker = BatchWorker("m", BatchQueue(capacity, batch_tokens, max_batch_size), run, finish, observers)
    worker.start()
    return worker


async def submit(worker: BatchWorker, payloads: list[Any], lengths: list[int]) -> list[Any]:
    return await asyncio.wait_for(worker.submit(payloads, lengths), HANG_GUARD_S)


async def test_results_come_back_in_input_order() -> None:
    reports: list[BatchReport] = []
    worker = make_worker(lambda payloads: [p * 2 for p in payloads], observers=[reports.append])
    try:
        rng = random.Random(1)
        lengths = [rng.randint(1, 60) for _ in range(40)]
        assert await submit(worker, list(range(40)), lengths) == [2 * i for i in range(40)]
        assert worker.inputs_done == 40
        assert worker.batches_done == len(reports) > 1
        for report in reports:
            assert report.size <= 4 and report.padded_tokens <= 100 and not report.failed
        assert sum(r.real_tokens for r in reports) == sum(lengths)
    finally:
        worker.stop()


async def test_concurrent_submits_each_get_their_own_results() -> None:
    worker = make_worker(lambda payloads: [f"out:{p}" for p in payloads])
    try:
        requests = [[f"r{r}i{i}" for i in range(r % 5 + 1)] for r in range(30)]
        results = await asyncio.gather(*(submit(worker, req, [len(p) for p in req]) for req in requests))
        assert results == [[f"out:{p}" for p in req] for req in requests]
    finally:
        worker.stop()


def fails_on_bad(payloads: list[str]) -> list[str]:
    """A run function whose batch fails when it holds the input "bad"."""
    if "bad" in payloads:
        raise RuntimeError("boom")
    return payloads


async def test_a_failing_batch_fails_only_its_own_requests() -> None:
    worker = make_worker(fails_on_bad)
    try:
        # The bad input costs the whole budget, so it is always in a batch of its own.
        outcomes = await asyncio.gather(
            submit(worker, ["a", "b"], [5, 5]),
            submit(worker, ["bad"], [100]),
            submit(worker, ["c"], [5]),
            return_exceptions=True,
        )
        assert outcomes[0] == ["a", "b"] and outcomes[2] == ["c"]
        assert isinstance(outcomes[1], BatchFailedError)
        assert "inference failed for the batch" in outcomes[1].message and "boom" in outcomes[1].message
        assert await submit(worker, ["d"], [5]) == ["d"]  # the next batch succeeds
        assert worker.alive and worker.batches_failed == 1
    finally:
        worker.stop()


async def test_a_failing_finish_fails_only_its_batch() -> None:
    def finish(output: list[str], _: list[str]) -> list[str]:
        if "bad" in output:
            raise ValueError("pooling broke")
        return output

    worker = make_worker(lambda payloads: payloads, finish)
    try:
        with pytest.raises(BatchFailedError, match=r"postprocessing failed.*pooling broke"):
            await submit(worker, ["bad"], [100])
        assert await submit(worker, ["ok"], [5]) == ["ok"]
        assert worker.alive and worker.batches_failed == 1
    finally:
        worker.stop()


async def test_one_failing_input_fails_the_whole_request() -> None:
    """A request split over two batches fails if either does; its other input is dropped."""
    worker = make_worker(fails_on_bad)
    try:
        with pytest.raises(BatchFailedError):
            await submit(worker, ["good", "bad"], [5, 100])
        assert await submit(worker, ["x"], [5]) == ["x"]
    finally:
        worker.stop()


class Gate:
    """Holds a batch inside the worker (one holding `trigger`, or any) until opened, so a
    test can queue more behind it."""

    def __init__(self, trigger: str | None = None) -> None:
        self.trigger = trigger
        self.entered = threading.Event()
        self._open = threading.Event()

    def hold(self, payloads: Sequence[Any]) -> bool:
        """Called from the worker thread; True when this batch was held."""
        if self.trigger is not None and self.trigger not in payloads:
            return False
        self.entered.set()
        self._open.wait(HANG_GUARD_S)
        return True

    def open(self) -> None:
        self._open.set()


@asynccontextmanager
async def gated(worker: BatchWorker, gate: Gate, first: list[str]) -> AsyncIterator[asyncio.Future[Any]]:
    """Submit `first` and wait until the gate holds it; on exit open the gate and stop."""
    try:
        held = asyncio.ensure_future(submit(worker, first, [100] * len(first)))
        await wait_until(gate.entered.is_set)
        yield held
    finally:
        gate.open()
        worker.stop()


async def test_base_exception_in_run_kills_the_worker_and_fails_every_waiter() -> None:
    gate = Gate("fatal")

    def run(payloads: list[str]) -> list[str]:
        if gate.hold(payloads):
            raise Fatal("the backend pulled the plug")
        return payloads

    worker = make_worker(run)
    async with gated(worker, gate, ["fatal"]) as in_flight:
        queued = [asyncio.ensure_future(submit(worker, [f"q{i}"], [5])) for i in range(3)]
        await wait_until(lambda: worker.queue.depth == 3)
        gate.open()
        outcomes = await asyncio.gather(in_flight, *queued, return_exceptions=True)
        assert all(isinstance(o, ModelNotReadyError) for o in outcomes), outcomes
        assert not worker.alive  # dead before anyone got an answer
        assert "Fatal" in (worker.death or "")
        with pytest.raises(ModelNotReadyError, match="not serving"):
            await submit(worker, ["late"], [5])


async def test_base_exception_in_finish_kills_the_worker_and_fails_every_waiter() -> None:
    gate = Gate("fatal")

    def finish(output: list[str], _: list[str]) -> list[str]:
        if gate.hold(output):
            raise Fatal("postprocessing pulled the plug")
        return output

    worker = make_worker(lambda payloads: payloads, finish)
    async with gated(worker, gate, ["fatal"]) as in_finish:
        # The next batches run and wait for the finisher (one in the hand-off, maybe one more).
        behind = [asyncio.ensure_future(submit(worker, [f"b{i}"], [100])) for i in range(4)]
        await wait_until(lambda: worker.queue.depth <= 2)
        gate.open()
        outcomes = await asyncio.gather(in_finish, *behind, return_exceptions=True)
        assert all(isinstance(o, ModelNotReadyError) for o in outcomes), outcomes
        assert not worker.alive  # dead before anyone got an answer
        assert "Fatal" in (worker.death or "")


async def test_stop_finishes_the_running_batch_and_fails_the_queued_ones() -> None:
    gate = Gate("slow")

    def run(payloads: list[str]) -> list[str]:
        gate.hold(payloads)
        return payloads

    worker = make_worker(run)
    async with gated(worker, gate, ["slow"]) as running:
        queued = asyncio.ensure_future(submit(worker, ["q"], [5]))
        await wait_until(lambda: worker.queue.depth == 1)
        stopper = asyncio.ensure_future(asyncio.to_thread(worker.stop, HANG_GUARD_S))
        await wait_until(lambda: worker.queue.closed)
        gate.open()
        await asyncio.wait_for(stopper, HANG_GUARD_S)
        assert await running == ["slow"]
        with pytest.raises(ModelNotReadyError, match="shutting down"):
            await queued
        assert not worker.alive


async def test_a_cancelled_submit_drops_its_queued_inputs() -> None:
    gate = Gate("slow")
    seen: list[str] = []

    def run(payloads: list[str]) -> list[str]:
        seen.extend(payloads)
        gate.hold(payloads)
        return payloads

    worker = make_worker(run)
    async with gated(worker, gate, ["slow"]) as running:
        leaver = asyncio.ensure_future(worker.submit(["gone1", "gone2"], [5, 5]))
        await wait_until(lambda: worker.queue.depth == 2)
        leaver.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaver
        gate.open()
        assert await running == ["slow"]
        assert await submit(worker, ["after"], [5]) == ["after"]
        assert seen == ["slow", "after"]


async def test_a_full_queue_refuses_a_request_whole() -> None:
    gate = Gate()  # holds every batch until opened

    def run(payloads: list[str]) -> list[str]:
        gate.hold(payloads)
        return payloads

    worker = make_worker(run, capacity=3)
    async with gated(worker, gate, ["first"]) as running:
        waiting = asyncio.ensure_future(submit(worker, ["x", "y"], [1, 1]))
        await wait_until(lambda: worker.queue.depth == 2)
        with pytest.raises(QueueFullError):
            await submit(worker, ["a", "b"], [1, 1])
        assert worker.queue.depth == 2  # nothing of the refused request was queued
        gate.open()
        assert await running == ["first"]
        assert await waiting == ["x", "y"]
        assert await submit(worker, ["a", "b", "c"], [1, 1, 1]) == ["a", "b", "c"]


async def test_a_failing_observer_neither_fails_the_batch_nor_the_worker() -> None:
    reports: list[BatchReport] = []

    def broken(_: BatchReport) -> None:
        raise RuntimeError("observer bug")

    worker = make_worker(lambda payloads: payloads, observers=[broken, reports.append])
    try:
        assert await submit(worker, ["a", "b"], [3, 4]) == ["a", "b"]
        assert worker.alive
        assert [(r.size, r.real_tokens, r.padded_tokens, r.failed) for r in reports] == [(2, 7, 8, False)]
    finally:
        worker.stop()


def test_more_inputs_than_the_whole_queue_is_too_large_not_full():
    queue = BatchQueue(capacity=4, batch_tokens=1024, max_batch_size=8)
    with pytest.raises(PayloadTooLargeError, match="split the request"):
        queue.put(items(3, 3, 3, 3, 3))
    assert queue.depth == 0


# -- fill wait -----------------------------------------------------------------------


def take_in_thread(queue: BatchQueue) -> tuple[threading.Thread, list[list[WorkItem] | None]]:
    got: list[list[WorkItem] | None] = []
    thread = threading.Thread(target=lambda: got.append(queue.take()), daemon=True)
    thread.start()
    return thread, got


def take_without_help(queue: BatchQueue) -> list[WorkItem]:
    """The batch a take cuts with nothing more arriving; fails instead of hanging."""
    thread, got = take_in_thread(queue)
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "take waited although nothing more was coming"
    return got[0]


def test_fill_wait_lets_a_trickle_of_inputs_share_one_batch() -> None:
    # A wait far longer than the test: the batch is cut by the size rule, not the clock.
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=4, fill_wait_s=HANG_GUARD_S)
    queue.put(items(10))
    thread, got = take_in_thread(queue)
    for i in range(1, 4):
        queue.put(items(10, start=i))
    thread.join(HANG_GUARD_S)
    assert [item.payload for item in got[0]] == [0, 1, 2, 3]


def test_fill_wait_is_skipped_when_a_full_batch_is_waiting() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=4, fill_wait_s=1000.0)
    queue.put(items(10, 10, 10, 10, 10))
    assert len(take_without_help(queue)) == 4


def test_fill_wait_is_skipped_when_the_token_budget_is_reached() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=100, max_batch_size=64, fill_wait_s=1000.0)
    queue.put(items(50, 50))
    assert len(take_without_help(queue)) == 2


def test_fill_wait_ends_at_its_deadline_with_a_partial_batch() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=64, fill_wait_s=0.01)
    queue.put(items(10, 10))
    assert len(take_without_help(queue)) == 2


def test_close_cuts_a_waiting_partial_batch_at_once() -> None:
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=64, fill_wait_s=1000.0)
    queue.put(items(10))
    thread, got = take_in_thread(queue)
    queue.close()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive() and [item.payload for item in got[0]] == [0]


# -- static-shape buckets ------------------------------------------------------------


def test_bucketed_budget_counts_padded_lengths() -> None:
    # Inputs of 10 tokens pad to 64: the budget of 256 padded tokens holds 4 of them, not 25.
    queue = BatchQueue(
        capacity=100, batch_tokens=256, max_batch_size=64,
        padded_length=lambda n: next(b for b in (64, 128, 512) if b >= n),
    )
    queue.put(items(*[10] * 10))
    assert [len(b) for b in take_all(queue)] == [4, 4, 2]


def test_a_large_request_is_never_refused_for_its_own_work_but_for_the_platforms_limit() -> None:
    """At 100 tokens/s, 500 tokens take 5 s alone: past a 2 s deadline, which bounds waiting,
    not work, so it is admitted. Past the platform's 4 s limit on one request it is a 413 at
    once (retrying would not help), naming the limit and what fits."""
    queue = BatchQueue(capacity=10_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0)
    queue.observe(tokens=100, seconds=1.0)
    assert queue.admit(5000, inputs=10) == pytest.approx(50.0)
    limited = BatchQueue(capacity=10_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0,
                         request_limit_s=4.0)
    limited.observe(tokens=100, seconds=1.0)
    with pytest.raises(PayloadTooLargeError) as refused:
        limited.admit(500, inputs=10)
    message = refused.value.message
    assert "about 5.0 s on an idle server" in message and "4 s limit on one request" in message
    assert "about 400 of its 500 tokens fit (about 8 of its 10 inputs)" in message
    assert limited.admit(400) == pytest.approx(4.0)  # exactly the limit: admitted


def test_a_request_that_would_pass_the_platforms_limit_behind_others_is_a_429() -> None:
    """Its wait (1.5 s) is within the 2 s deadline, but with its own 3 s it would end past
    the platform's 4 s limit, which would cut it off: a 429 for the excess, not a 413."""
    queue = BatchQueue(capacity=10_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0,
                       request_limit_s=4.0)
    queue.observe(tokens=100, seconds=1.0)
    queue.put(items(150))
    with pytest.raises(QueueFullError, match="4 s limit on one request") as refused:
        queue.admit(300)
    assert refused.value.retry_after_s == 1  # ceil(1.5 + 3 - 4)


def test_a_shed_request_keeps_its_place_and_newcomers_wait_behind_it() -> None:
    """A request shed by the deadline keeps its place (by key): while it is away, newcomers
    are weighed behind all of it, and when it returns it is weighed only against the queue
    and older places, so it is admitted before them. A place lapses when nobody returns."""
    queue = BatchQueue(capacity=10_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0)
    queue.observe(tokens=100, seconds=1.0)
    queue.put(items(300))  # 3 s of work waiting
    with pytest.raises(QueueFullError, match="place in line is kept") as first:
        queue.admit(300, key="large")  # 3 s on the other, taking turns
    assert first.value.retry_after_s == 1
    # Without the place, a newcomer of 40 fits easily (0.4 s behind the other); with the large
    # one's place ahead of it (counted up to a deadline's work: 2 s more), it does not.
    with pytest.raises(QueueFullError):
        queue.admit(40, key="small")
    take_all(queue)  # the queue drains
    assert queue.admit(300, key="large") == pytest.approx(3.0)  # back first: only its own work
    queue.admit(40, key="newcomer")  # 0.4 s behind the large one, 0.4 s behind the small one's place
    queue.admit(40, key="small")  # its place taken: 0.8 s behind the two coming
    assert len(queue._places) == 0


def test_places_lapse_when_nobody_returns() -> None:
    """A place lapses its Retry-After and half as much again (at least the grace) after it was
    kept; what places count toward a newcomer's wait is capped."""
    places = Places(grace_s=2.0)
    places.keep("gone", 10, retry_after_s=1, now=0.0)
    places.keep("back", 5, retry_after_s=1, now=0.5)
    assert places.ahead_of(None, now=1.0) == (15, 2)
    assert places.ahead_of(None, most=12, now=1.0) == (12, 2)
    assert places.ahead_of("back", now=1.0) == (10, 1)  # only the older place is ahead of it
    assert places.ahead_of(None, now=3.1) == (5, 1)  # due back by 0 + 1 + 2 s: lapsed
    places.release("back")
    assert places.ahead_of(None, now=3.2) == (0, 0)
    places.keep("slow", 5, retry_after_s=10, now=0.0)
    assert places.ahead_of(None, now=14.9) == (5, 1)  # 10 s, and half as much again
    assert places.ahead_of(None, now=15.1) == (0, 0)


def test_places_of_clients_that_never_return_do_not_push_retry_after_out() -> None:
    """Hundreds of requests shed and never retried (clients that gave up) keep places; a
    newcomer's Retry-After counts at most a deadline's work of them, so it stays near the
    time the queue really needs, not the sum of every place."""
    queue = BatchQueue(capacity=100_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0)
    queue.observe(tokens=100, seconds=1.0)
    queue.put(items(300))
    for n in range(300):
        with pytest.raises(QueueFullError):
            queue.admit(300, key=f"gone-{n}")
    with pytest.raises(QueueFullError) as refused:
        queue.admit(300, key="newcomer")
    assert refused.value.retry_after_s <= 4  # 3 s of queue + 2 s of places - 2 s (was 900 s)


def test_an_urgent_request_goes_first_until_it_is_done() -> None:
    """The engine's own background work that callers wait for (int8 calibration) is put
    ahead of the requests waiting and anchors every batch until it is done; then the others
    take turns as before."""
    queue = BatchQueue(capacity=100, batch_tokens=10_000, max_batch_size=2)
    queue.put(items(5, 5, 5, start=0))
    queue.put(items(6, 6, start=10))
    queue.put(items(7, 7, 7, 7, start=20), urgent=True)
    queue.observe(tokens=100, seconds=1.0)
    assert queue.urgent_s() == pytest.approx(0.28)
    batches = [{i.payload for i in batch} for batch in take_all(queue)]
    assert batches[:2] == [{20, 21}, {22, 23}]
    assert queue.urgent_s() == 0
    assert 0 in batches[2] and 10 in batches[3]


def test_before_the_pace_is_measured_the_prior_judges_but_never_refuses_for_good() -> None:
    """Before any saturated batch, the pace of a small batch timed at load (the prior) judges
    the deadline, so a storm at start is shed with Retry-After, but it underrates the model:
    no 413 is given on it, whatever the platform's limit."""
    blind = BatchQueue(capacity=10_000, batch_tokens=100, max_batch_size=8, deadline_s=2.0)
    blind.admit(5000)
    blind.admit(5000)  # no pace at all: nothing to judge by
    queue = BatchQueue(capacity=10_000, batch_tokens=100, max_batch_size=8, deadline_s=2.0,
                       request_limit_s=4.0)
    queue.prior(tokens=20, seconds=0.2)  # 100 tokens/s
    assert queue.admit(500) == pytest.approx(5.0)  # alone and past the limit: no 413 on a prior
    with pytest.raises(QueueFullError, match="overloaded") as refused:
        queue.admit(300, key="early")  # 3 s behind the other: a 429, not a 413
    assert refused.value.retry_after_s >= 1 and len(queue._places) == 1
    queue.settle(500)
    queue.observe(tokens=1000, seconds=1.0)  # measured now: 1,000 tokens/s
    with pytest.raises(PayloadTooLargeError):
        queue.admit(5000)
    assert queue.admit(300, key="early") is not None and len(queue._places) == 0


def test_a_large_request_is_shed_only_for_its_wait() -> None:
    """A large request's own work does not count against the deadline: a one-text request in
    flight does not shed it, but a wait of 5 s behind another large one does."""
    queue = BatchQueue(capacity=10_000, batch_tokens=1000, max_batch_size=8, deadline_s=2.0)
    queue.observe(tokens=100, seconds=1.0)
    queue.admit(5)  # a probe, being tokenized
    assert queue.admit(500) == pytest.approx(5.05)  # 0.05 s behind the probe, 5 s its own
    with pytest.raises(QueueFullError):
        queue.admit(500)  # 5 s behind the other: past the deadline


async def test_a_running_batch_counts_as_work_until_it_is_answered() -> None:
    """What routes a call between replicas (`BatchQueue.backlog` + `BatchWorker.running_work`):
    a batch taken from the queue is still its replica's work while it runs, and none once
    answered or failed."""
    entered, release = threading.Event(), threading.Event()

    def held(payloads: list[Any]) -> list[Any]:
        entered.set()
        release.wait(HANG_GUARD_S)
        if "bad" in payloads:
            raise RuntimeError("a failing batch")
        return payloads

    worker = make_worker(held, max_batch_size=4)
    try:
        assert worker.queue.backlog == 0 and worker.running_work == 0
        worker.queue.admit(7)
        assert worker.queue.backlog == 7  # admitted, coming
        worker.queue.settle(7)
        running = asyncio.ensure_future(worker.submit(["a", "b"], [3, 4]))
        await wait_until(entered.is_set, HANG_GUARD_S)
        assert worker.running_work == 7 and worker.queue.backlog == 0
        release.set()
        assert await asyncio.wait_for(running, HANG_GUARD_S) == ["a", "b"]
        await wait_until(lambda: worker.running_work == 0, HANG_GUARD_S)
        with pytest.raises(BatchFailedError):
            await asyncio.wait_for(worker.submit(["bad"], [5]), HANG_GUARD_S)
        await wait_until(lambda: worker.running_work == 0, HANG_GUARD_S)
    finally:
        release.set()
        worker.stop()
