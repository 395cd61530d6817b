"""The shared store: Redis, which every container of a deployment reads and writes. A miss
costs one round trip for a whole request (MGET); writes go out after the answer, in a
pipeline. Redis down or slow never fails a request: each call is bounded by `timeout_s`, an
error makes its rows misses (counted, logged once), and Redis is left alone for
`backoff_s` after one, so a dead server costs a request nothing but that first timeout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


class RedisStore:
    def __init__(self, url: str, ttl_s: int | None, timeout_s: float = 0.05, backoff_s: float = 5.0) -> None:
        try:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
        except ImportError as exc:
            from infinity_cloud.errors import ConfigError

            raise ConfigError(
                f"--cache-url {url} needs the redis client: pip install 'infinity-cloud[cache]'"
            ) from exc
        self.url, self.ttl_s, self.timeout_s, self.backoff_s = url, ttl_s, timeout_s, backoff_s
        # No retries: a call is bounded by `timeout_s`, and a failed one is a miss, not a wait.
        self._client = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
        )
        self.errors = 0
        self._quiet_until = 0.0
        self._warned = False
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._quiet_until

    def _failed(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        self._quiet_until = time.monotonic() + self.backoff_s
        if not self._warned:  # once: a dead Redis must not flood the log at every request
            self._warned = True
            log.warning(
                "the shared result cache at %s failed (%s: %s: %s); requests are served uncached, and "
                "Redis is tried again every %.0f s: check that it runs and is reachable from here "
                "(errors are counted in infinity_cloud_cache_redis_errors)",
                self.url, what, type(exc).__name__, exc or "timed out", self.backoff_s,
            )

    async def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys or not self.available:
            return [None] * len(keys)
        try:
            found = await asyncio.wait_for(self._client.mget(list(keys)), self.timeout_s)
        except Exception as exc:  # RedisError, timeouts, a broken connection: a miss, never a failure
            self._failed("read", exc)
            return [None] * len(keys)
        return [value if isinstance(value, bytes) else None for value in found]

    def put_later(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """Write the rows after the answer has gone (a task the request does not wait for)."""
        if not pairs or not self.available:
            return
        task = asyncio.get_running_loop().create_task(self._put(pairs))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, value in pairs:
                    pipe.set(key, value, ex=self.ttl_s)
                await asyncio.wait_for(pipe.execute(), max(self.timeout_s, 0.001) * 4)
        except Exception as exc:
            self._failed("write", exc)

    async def flushed(self) -> None:
        """Wait for the writes still in flight (tests, and a clean stop)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def delete_namespace(self, prefix: bytes) -> None:
        """Forget one model's rows (its namespace), best effort."""
        if not self.available:
            return
        try:
            async for key in self._client.scan_iter(match=prefix + b"*", count=1000):
                await self._client.unlink(key)
        except Exception as exc:
            self._failed("delete", exc)

    async def close(self) -> None:
        await self.flushed()
        with contextlib.suppress(Exception):  # already gone
            await self._client.aclose()

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "ttl_s": self.ttl_s, "errors": self.errors, "available": self.available}
