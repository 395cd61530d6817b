"""The tokenizer pool's cancellation: stopping a thread's work for a request whose caller has
gone.

A coroutine cancelled while it awaits work in a thread pool stops waiting, but the thread goes
on: tokenizing 2,000 long texts would run for seconds after the client left. So work run with
`in_pool` can look, between its steps, whether its caller is still there (`check`), and stops
with `Cancelled` when not. The flag travels with the work's context (a ContextVar), so code
deep inside (the tokenizer's chunks) needs no extra argument.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

_stop: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("stop", default=None)


class Cancelled(Exception):
    """The caller of this work has gone; nobody will read its result."""


def check() -> None:
    """Raise `Cancelled` when the work running in this context was given up."""
    stop = _stop.get()
    if stop is not None and stop.is_set():
        raise Cancelled


async def in_pool(pool: Executor, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in `pool`; if the awaiting task is cancelled, `fn`'s next `check` stops it."""
    stop = threading.Event()
    context = contextvars.copy_context()
    context.run(_stop.set, stop)
    future = asyncio.get_running_loop().run_in_executor(pool, context.run, fn, *args)
    try:
        return await future
    except asyncio.CancelledError:
        stop.set()
        raise
