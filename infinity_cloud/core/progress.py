"""A visible, logged step for slow one-time work (downloads, exports, precision checks)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("infinity_cloud")

# Without a terminal (a container's log, CI), how often a step still running says so.
HEARTBEAT_S = 15.0


@contextmanager
def slow_step(message: str, heartbeat_s: float = HEARTBEAT_S, spinner: bool = True) -> Iterator[None]:
    """Log `message` and its duration; while it runs, a spinner when a person is watching
    (`spinner`: the step draws no bars of its own), else a line every `heartbeat_s` seconds, so
    that a log never goes quiet for minutes."""
    log.info("%s ...", message)
    started = time.perf_counter()
    if sys.stderr.isatty() and not spinner:
        yield
    elif sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(message):
            yield
    else:
        done = threading.Event()

        def beat() -> None:
            while not done.wait(heartbeat_s):
                log.info("%s: still running after %.0fs", message, time.perf_counter() - started)

        beating = threading.Thread(target=beat, name="progress", daemon=True)
        beating.start()
        try:
            yield
        finally:
            done.set()
            beating.join()
    log.info("%s: done in %.1fs", message, time.perf_counter() - started)
