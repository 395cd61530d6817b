"""One admitted call, run: the model's admission, the call's checks, its media fetched and
decoded or its text tokenized, the tower's batch queue (through the result cache), then the
task's finish. Every capability runs through here the same way; the engine decides which
task, with which call, on which served model (looked up once, by the caller)."""

from __future__ import annotations

import hashlib
import pickle
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from infinity_cloud.admission.memory import MemoryBudget
from infinity_cloud.admission.validation import check_answer_size
from infinity_cloud.cache.result_cache import ResultCache
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.hardware import usable_cores
from infinity_cloud.models.served_model import ServedModel
from infinity_cloud.tasks.base import Call, Result, Task
from infinity_cloud.text import pool_cancellation

if TYPE_CHECKING:  # imported on first use: they bring httpx, Pillow
    from infinity_cloud.media.decoding import MediaDecoder
    from infinity_cloud.media.fetch import MediaFetcher

T = TypeVar("T")


def request_key(task: Task[Any, Any], call: Any, model: str) -> str | None:
    """What a request asks, as a digest: a retry of it (same task, model and inputs) has the
    same key, and keeps the place in line its first try was given (batching/places.py)."""
    try:
        body = pickle.dumps((task.capability.value, type(call).__name__, model, call), protocol=5)
    except Exception:  # a caller's own call that does not pickle: no place kept, nothing else lost
        return None
    return hashlib.blake2b(body, digest_size=16).hexdigest()


class Pipeline:
    """The pools and budgets every call shares: the tokenizer pool, the media fetcher and
    decoder (made on first use: text never needs them), the memory budget, the result cache."""

    def __init__(self, limits: LimitsSpec, memory: MemoryBudget, cache: ResultCache) -> None:
        self.limits = limits
        self.memory = memory
        self.cache = cache
        self._tokenize_pool = ThreadPoolExecutor(
            max_workers=min(4, usable_cores()), thread_name_prefix="tokenize"
        )
        self._media: MediaFetcher | None = None
        self._decoder: MediaDecoder | None = None

    async def run(
        self, task: Task[Call, Result], call: Call, served: ServedModel, *, background: bool = False
    ) -> Result:
        """`call` on `served`, admitted by the model (a 503 while it loads or drains).
        `background`: the engine's own work that callers wait for (int8 calibration): never
        refused for load, and ahead of the requests in the model's queue."""
        with served.admitted():
            return await self._run_admitted(task, call, served, background)

    async def _run_admitted(
        self, task: Task[Call, Result], call: Call, served: ServedModel, background: bool
    ) -> Result:
        task.check(call, served, self.limits)
        tower = task.tower(call)
        # Admitted (or shed with a 429, or a 413 past the memory budget) before any work:
        # fetching and tokenizing count as waiting.
        # The replica it runs on is chosen now, the least loaded (`models.replicas`), and admits it.
        replica, cost = served.replica(tower), task.cost(call, served)
        queue = replica.queue
        check_answer_size(cost.answer_bytes, self.limits)
        # Held until the answer is made; one hold for the request, so a refusal judges all of it.
        with self.memory.growing() as hold:
            hold(cost.memory)
            key = request_key(task, call, served.name) if queue.contended and not background else None
            work = queue.request_work(cost.tokens, cost.inputs)  # attention's square counted
            predicted = queue.admit(work, key, cost.inputs, background, real_tokens=cost.tokens)
            try:
                uris = task.media(call, served)
                if uris:  # the fetched bytes join the hold as they arrive (counted once: not in `cost`)
                    fetched = await self.media.fetch_all(uris, hold)
                    items = await self.decoder.prepare_all(
                        served.loaded.encoders[tower], fetched, served.spec.deadline_s,
                        served.spec.request_limit_s,
                    )
                else:
                    items = await self.in_tokenizer_pool(task.encode, call, served, self.limits)
            finally:
                queue.settle(work)  # now queued (right below, before any await) or failed
            queued_at = time.perf_counter()
            if self.cache.enabled and task.cached:  # only the misses go to the model
                rows, ran = await self.cache.rows(
                    served.cache_namespace(tower), items,
                    lambda misses: served.run(misses, tower, background, replica),
                    offload=self.in_tokenizer_pool,
                )
            else:
                rows, ran = await served.run(items, tower, background, replica), len(items)
            if predicted is not None and ran == len(items):  # a prediction of the whole request's work
                queue.calibrate(predicted, time.perf_counter() - queued_at)
            return task.finish(rows, call, served, items)

    async def in_tokenizer_pool(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the tokenizer pool, stopped at its next check (`pool_cancellation`) when
        the caller goes."""
        return await pool_cancellation.in_pool(self._tokenize_pool, fn, *args)

    @property
    def decoder(self) -> MediaDecoder:
        """The pool that decodes images and audio, made on first use (text never needs it)."""
        if self._decoder is None:
            from infinity_cloud.media.decoding import MediaDecoder

            self._decoder = MediaDecoder(self.limits, self.memory)
        return self._decoder

    @property
    def media(self) -> MediaFetcher:
        """The shared client that fetches media URLs, made on first use (text never needs it)."""
        if self._media is None:
            from infinity_cloud.media.fetch import MediaFetcher

            self._media = MediaFetcher(self.limits)
        return self._media

    async def stop(self) -> None:
        if self._media is not None:
            await self._media.close()
            self._media = None

    def close(self) -> None:
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if self._decoder is not None:
            self._decoder.close()


__all__ = ["Pipeline", "request_key"]
