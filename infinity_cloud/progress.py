"""A visible, logged step for slow one-time work (exports, conversions)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("infinity_cloud")


@contextmanager
def slow_step(message: str) -> Iterator[None]:
    """Log `message` and its duration; show a spinner too when a person is watching."""
    log.info("%s ...", message)
    started = time.perf_counter()
    if sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(message):
            yield
    else:
        yield
    log.info("%s: done in %.1fs", message, time.perf_counter() - started)
