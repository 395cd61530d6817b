"""Decoding a request's media in a pool of its own, each input's cost counted before it is
decoded.

Images and audio are small on the wire and large decoded: a 2 KB WebP can hold 64 megapixels.
So each input's header is read first (size checked, what decoding it takes computed), that
memory is held from the process's budget while it decodes (429, or 413 when it could not fit
alone), and decoding runs in its own pool, a worker per two cores, so text requests never wait
behind it in the tokenizer pool. A request's inputs decode one after the other: its peak is
its largest input's, and a client that leaves stops it at the next input.

Decoding time is judged as the model's queue judges its work (`batching/queue.py`): from what
the pool has decoded (seconds per byte of decoding, learned), a request that would wait past
`deadline_s` behind others' decoding, or whose wait and decoding would pass the platform's
`request_limit_s`, is a 429 before it starts; a 413 only when its decoding alone would pass
`request_limit_s`.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from infinity_cloud.admission.memory import MemoryBudget
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import PayloadTooLargeError, QueueFullError
from infinity_cloud.core.hardware import usable_cores
from infinity_cloud.numerics.inputs import InputEncoder

# Seconds per byte of decoding before any is measured: a 16 MP RGBA PNG, 184 MB of decoding
# by `decoding_bytes`, took 0.8 s on one AVX2 core; learned from each decode after that.
_FIRST_SECONDS_PER_BYTE = 4e-9


class MediaDecoder:
    def __init__(self, limits: LimitsSpec, memory: MemoryBudget, workers: int | None = None) -> None:
        self.limits = limits
        self.memory = memory
        self.workers = workers or max(1, usable_cores() // 2)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="decode")
        self._lock = threading.Lock()
        self._seconds_per_byte = _FIRST_SECONDS_PER_BYTE
        self._queued_bytes = 0  # decoding admitted and not done yet, every request's

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def estimated_s(self, decoding: int) -> float:
        return decoding * self._seconds_per_byte

    async def prepare_all(
        self, encoder: InputEncoder, fetched: Sequence[bytes], deadline_s: float | None,
        request_limit_s: float | None = None,
    ) -> list[Any]:
        """Each fetched input as its model input, in order (a bad one: a 400 naming it)."""
        loop = asyncio.get_running_loop()
        opened = await loop.run_in_executor(self._pool, self._open_all, encoder, fetched)
        total = sum(cost for _, cost in opened)
        self._admit(total, deadline_s, request_limit_s)
        try:
            prepared = []
            for index in range(len(opened)):
                item, cost = opened[index]
                opened[index] = (None, 0)  # decoded, its pixels go with the last reference
                with self.memory.reserved(cost):
                    prepared.append(await loop.run_in_executor(
                        self._pool, self._prepare, encoder, item, index, cost
                    ))
                del item
                total -= cost
                self._release(cost)
            return prepared
        finally:
            self._release(total)

    def _open_all(self, encoder: InputEncoder, fetched: Sequence[bytes]) -> list[tuple[Any, int]]:
        return [encoder.open(data, index, self.limits) for index, data in enumerate(fetched)]

    def _admit(self, decoding: int, deadline_s: float | None, limit_s: float | None) -> None:
        with self._lock:
            ahead = self.estimated_s(self._queued_bytes) / self.workers
            own = self.estimated_s(decoding)
            if limit_s is not None and own > limit_s:
                raise PayloadTooLargeError(
                    f"decoding these media would take about {own:.1f} s on an idle server, past this "
                    f"platform's {limit_s:g} s limit on one request; send fewer or smaller images (or "
                    "audio clips)"
                )
            excess = max(-1.0 if deadline_s is None else ahead - deadline_s,
                         -1.0 if limit_s is None else ahead + own - limit_s)
            if excess > 0:
                error = QueueFullError(
                    f"the server is decoding other requests' media (about {ahead:.1f} s of it), past "
                    f"what this request may wait; retry after {max(1, math.ceil(excess))} s"
                )
                error.retry_after_s = max(1, math.ceil(excess))
                raise error
            self._queued_bytes += decoding

    def _release(self, decoding: int) -> None:
        with self._lock:
            self._queued_bytes -= decoding

    def _prepare(self, encoder: InputEncoder, item: Any, index: int, cost: int) -> Any:
        started = time.perf_counter()
        try:
            prepared = encoder.prepare(item, index)
        finally:
            close = getattr(item, "close", None)
            if close is not None:  # a picture: its decoded pixels freed now, not when collected
                close()
        if cost > 1 << 20:  # small inputs are mostly fixed costs: they teach nothing per byte
            rate = (time.perf_counter() - started) / cost
            with self._lock:
                self._seconds_per_byte = 0.8 * self._seconds_per_byte + 0.2 * rate
        return prepared
