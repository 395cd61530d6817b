"""Running one engine call for a route: disconnect watching and request metrics, once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from fastapi import Request

from infinity_cloud.errors import InfinityCloudError, InputTooLongError
from infinity_cloud.server.errors import status_of

T = TypeVar("T")


@contextlib.contextmanager
def truncation_named(field: str | None, value: str = "true") -> Iterator[None]:
    """A too-long input's error naming the dialect's own truncation field (None: ours)."""
    try:
        yield
    except InputTooLongError as exc:
        if field is None:
            raise
        raise exc.naming(field, value) from None


class ClientDisconnected(Exception):
    """The client left before its answer was ready; its queued inputs were dropped."""


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await `work`, cancelling it (and so dropping its queued inputs) if the client leaves."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request was cancelled (server shutdown, a cancelling server)
        await _cancelled(task)
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    await _cancelled(task)
    raise ClientDisconnected()


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """Cancel the work and wait until it has handled that: its inputs still queued are then
    marked dropped before the batcher can cut them into a batch."""
    task.cancel()
    await asyncio.wait({task})


async def answer(
    request: Request, route: str, model: str | None, inputs: int, work: Coroutine[Any, Any, T]
) -> T:
    """Run an engine call for a route and record its metrics."""
    state = request.app.state
    engine, metrics = state.engine, state.metrics
    only = next(iter(engine.models)) if len(engine.models) == 1 else "unknown"
    label = model if model in engine.models else only
    started = time.perf_counter()
    try:
        result = await until_disconnected(request, work)
    except ClientDisconnected:
        metrics.errors.labels(label, "client_disconnected").inc()
        raise
    except InfinityCloudError as exc:
        metrics.errors.labels(label, type(exc).__name__).inc()
        metrics.requests.labels(label, route, str(status_of(exc)[0])).inc()
        raise
    metrics.requests.labels(result.model, route, "200").inc()
    metrics.inputs.labels(result.model).inc(inputs)
    metrics.tokens.labels(result.model).inc(result.prompt_tokens)
    metrics.latency.labels(result.model, route).observe(time.perf_counter() - started)
    return result
