"""A served embedder's int8/uint8 ranges: its embeddings of fixed calibration texts, made once
per model, in the background, and the per-dimension ranges int8/uint8 quantise with."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np

from infinity_cloud.cache.result_cache import cache_mode
from infinity_cloud.core.errors import ModelNotReadyError
from infinity_cloud.numerics.pooling import truncate_dimensions
from infinity_cloud.tasks import quantization

if TYPE_CHECKING:  # the served model imports nothing of this module
    from infinity_cloud.models.served_model import ServedModel

log = logging.getLogger(__name__)

# Texts embedded by the model as the engine's own work: ahead of the requests in its queue
# and never refused for load (`Pipeline.run(background=True)`).
EmbedInBackground = Callable[[list[str]], Awaitable[np.ndarray]]


class Int8Ranges:
    """One served model's calibration for int8/uint8, made with the model and dropped with it:
    made at start for a model served as int8/uint8, else in the background from the first
    request that asks (a 503 till then)."""

    def __init__(self, served: ServedModel, embed: EmbedInBackground) -> None:
        self._served = served
        self._embed = embed
        self._vectors: np.ndarray | None = None  # its embeddings of the calibration texts
        self._calibrating: asyncio.Future[None] | None = None
        self._making_texts = False  # the calibration is still reading its texts

    @property
    def ready(self) -> bool:
        return self._vectors is not None

    @property
    def state(self) -> str:
        """"ready", "calibrating", or "on first request"."""
        if self._vectors is not None:
            return "ready"
        return "calibrating" if self._calibrating is not None else "on first request"

    async def ranges(self, dimensions: int | None = None, *, wait: bool = True) -> np.ndarray:
        """(2, d) per-dimension ranges of the model's embeddings (Matryoshka-truncated to
        `dimensions`); `wait` False: a 503 with Retry-After until they are ready."""
        served = self._served
        if self._vectors is None:
            task = self._start()
            if not wait:
                queue = served.queue("text")
                for _ in range(100):  # their texts queued (tokenized in ~50 ms): Retry-After from them
                    if task.done() or queue.urgent_s():
                        break
                    await asyncio.sleep(0.01)
                if not task.done():
                    raise self._calibrating_now()
            await asyncio.shield(task)
        assert self._vectors is not None  # the task above set them, or raised
        vectors = truncate_dimensions(self._vectors, dimensions, renormalize=served.loaded.normalize)
        return quantization.ranges(vectors)

    def _start(self) -> asyncio.Future[None]:
        """The calibration task, started now if it is not running."""
        if self._calibrating is None:
            self._calibrating = asyncio.ensure_future(self._calibrate())
            self._calibrating.add_done_callback(self._calibrated)
        return self._calibrating

    async def _calibrate(self) -> None:
        self._making_texts = True
        try:
            texts = await asyncio.to_thread(quantization.calibration_texts)
        finally:
            self._making_texts = False
        with cache_mode("off"):  # fixed texts: no caller's rows, and none to keep
            self._vectors = await self._embed(texts)
        log.info("model %s: int8/uint8 ranges calibrated on %d texts", self._served.name, len(texts))

    def _calibrated(self, done: asyncio.Future[None]) -> None:
        if done.cancelled() or done.exception() is not None:  # tried again on the next request
            self._calibrating = None
            if not done.cancelled():
                log.warning("model %s: calibrating int8/uint8 ranges failed: %s", self._served.name,
                            done.exception())

    def _calibrating_now(self) -> ModelNotReadyError:
        """The 503 while the ranges are calibrated, with when they will be ready: their texts
        go before every request in the model's queue, so that is their own work's time at the
        model's pace (all of it while they are still being tokenized)."""
        served = self._served
        queue = served.queue("text")
        left = queue.urgent_s()
        if not left:
            rate = queue.rate or queue.prior_rate
            tokens = quantization.CALIBRATION_SIZE * 64  # paragraphs of 60-600 characters
            left = tokens / rate if rate else 10.0
        if self._making_texts:  # its texts not yet made (a cold read parses ~60 modules): that too
            left += quantization.LAST_TEXTS_S
        seconds = max(1, math.ceil(left + 0.5))  # and the batch running now
        error = ModelNotReadyError(
            f"model {served.name!r} is calibrating its int8/uint8 ranges (once, in the background, "
            f"on {quantization.CALIBRATION_SIZE} texts); retry in about {seconds} s, or ask for float "
            "or binary meanwhile (serve it with --embedding-dtype int8 to calibrate at start)"
        )
        error.retry_after_s = seconds
        return error
