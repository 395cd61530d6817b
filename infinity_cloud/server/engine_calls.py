"""Running one engine call for a route: disconnect watching and request metrics, once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from fastapi import Request

from infinity_cloud.batching import ORIGIN
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import InfinityCloudError, InputTooLongError
from infinity_cloud.server.errors import status_of
from infinity_cloud.server.tracing import SCOPE_KEY

T = TypeVar("T")


@contextlib.contextmanager
def in_own_terms(fields: Mapping[str, str], truncate_value: str = "true") -> Iterator[None]:
    """The engine's refusals naming the caller's own fields: the engine names its parameters
    (asks.EmbedAsk's: dimensions, embedding_types, truncate, ...); a dialect that calls one
    otherwise (Voyage's `output_dimension`) maps it here, and a too-long input's remedy says
    the dialect's truncation field and the value that turns it on."""
    try:
        yield
    except InputTooLongError as exc:
        if "truncate" not in fields:
            raise
        raise exc.naming(fields["truncate"], truncate_value) from None
    except InfinityCloudError as exc:
        if exc.param in fields:
            exc.param = fields[exc.param]
        raise


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


def _label(engine: Any, model: str | None, serves: Sequence[Capability], any_name: bool) -> str:
    """The name a failed call's metrics go under: the model the call means (its name or alias,
    else the one that does what the route `serves`), else "unknown"."""
    try:
        return engine.model(model, *serves, any_name=any_name).name
    except InfinityCloudError:
        return "unknown"


def route_of(request: Request) -> str:
    """The route's template (`/v1/embeddings`, `/models/{model_id}`), never the raw path: what
    the metrics and the traces name a request's route by, so their series stay bounded."""
    route, path = request.scope["route"], request.scope["path"]
    if not route.param_convertors:  # a path without parameters is its own template
        return path
    # FastAPI hands over the route as its router declared it (`/models/{model_id:path}`),
    # without the prefix it is included under (`/v1`, the server's --url-prefix): put that back.
    for at in (i for i, char in enumerate(path) if char == "/"):
        if route.path_regex.match(path[at:]):
            return path[:at] + route.path
    return route.path


async def answer(
    request: Request, model: str | None, inputs: int, work: Coroutine[Any, Any, T],
    serves: Sequence[Capability] = (), *, any_name: bool = False,
) -> T:
    """Run an engine call for a route and record its metrics (`serves`: what the route's
    models do, which names the model of a failed call that named none; `any_name`: the
    route takes any name, as its ask does)."""
    state = request.app.state
    engine, metrics = state.engine, state.metrics
    route = route_of(request)
    trace = request.scope.get(SCOPE_KEY)  # with --otlp-endpoint only (server/tracing.py)
    if trace is not None:
        trace.begin(route)
        ORIGIN.set(trace)  # the inputs this call queues are this request's
    started = time.perf_counter()
    try:
        result = await until_disconnected(request, work)
    except ClientDisconnected:
        metrics.errors.labels(_label(engine, model, serves, any_name), "client_disconnected").inc()
        raise
    except InfinityCloudError as exc:  # the model's name looked up for a failure only
        label = _label(engine, model, serves, any_name)
        metrics.errors.labels(label, type(exc).__name__).inc()
        metrics.requests.labels(label, route, str(status_of(exc)[0])).inc()
        if trace is not None:
            trace.answered(label)
        raise
    if trace is not None:
        trace.answered(result.model)
    metrics.requests.labels(result.model, route, "200").inc()
    metrics.inputs.labels(result.model).inc(inputs)
    metrics.tokens.labels(result.model).inc(result.prompt_tokens)
    metrics.latency.labels(result.model, route).observe(time.perf_counter() - started)
    return result
