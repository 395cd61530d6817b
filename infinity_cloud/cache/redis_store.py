"""The shared store: Redis, which every container of a deployment reads and writes. A miss
costs one round trip for a whole request (MGET); writes go out after the answer, in a
pipeline. Redis down or slow never fails a request: each call is bounded by `timeout_s`, an
error makes its rows misses (counted, logged once per outage), and Redis is left alone for
`backoff_s` after one, so a dead server costs a request nothing but that first timeout.

Connecting (TCP, TLS, AUTH) is not a request's to wait for: it happens in the background
with a longer bound (`CONNECT_S`), and requests use Redis once a connection answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from infinity_cloud.core.install_hint import install_command

log = logging.getLogger(__name__)


# Connecting, in the background: a TLS handshake across zones takes longer than a read.
CONNECT_S = 2.0
# A busy server waits for a free connection (bounded by the call's time) rather than open more.
MAX_CONNECTIONS = 32


def redacted(url: str) -> str:
    """The URL without its password, for logs and facts: redis-py takes it in the netloc
    (`redis://:PASSWORD@host`) or as a query parameter (`redis://host/0?password=PASSWORD`)."""
    parts = urlsplit(url)
    if parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key.lower() == "password" for key, _ in query):
        masked = [(key, "***" if key.lower() == "password" else value) for key, value in query]
        parts = parts._replace(query=urlencode(masked, safe="*"))
    return urlunsplit(parts)


class RedisStore:
    def __init__(self, url: str, ttl_s: int | None, timeout_s: float = 0.05, backoff_s: float = 5.0) -> None:
        try:
            from redis.asyncio import BlockingConnectionPool, Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
        except ImportError as exc:
            from infinity_cloud.core.errors import ConfigError

            raise ConfigError(
                f"--cache-url {redacted(url)} needs the redis client: {install_command('cache')}"
            ) from exc
        # Only its redacted form is kept: nothing here logs or shows the password.
        self.url, self.ttl_s, self.timeout_s, self.backoff_s = redacted(url), ttl_s, timeout_s, backoff_s
        # No retries: a call is bounded by `timeout_s`, and a failed one is a miss, not a wait.
        pool = BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=timeout_s, socket_timeout=CONNECT_S,
            socket_connect_timeout=CONNECT_S, retry=Retry(NoBackoff(), 0),
        )
        self._client = Redis(connection_pool=pool)
        self.errors = 0
        self._quiet_until = 0.0
        self._connected = False
        self._connecting: asyncio.Task[None] | None = None
        self._warned = False
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def available(self) -> bool:
        """Connected, and not resting after an error; else a connection is made in the
        background (once the rest is over) while requests go without Redis."""
        if time.monotonic() < self._quiet_until:
            return False
        if not self._connected and self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        return self._connected

    async def _connect(self) -> None:
        try:
            await asyncio.wait_for(self._client.ping(), CONNECT_S)
        except Exception as exc:
            self._failed("connect", exc)
        else:
            self._connected = True
            if self._warned:
                log.warning("the shared result cache at %s answers again", self.url)
                self._warned = False
        finally:
            self._connecting = None

    def _failed(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        self._connected = False  # connect again (in the background) after the rest
        self._quiet_until = time.monotonic() + self.backoff_s
        if not self._warned:  # once an outage: a dead Redis must not flood the log at every request
            self._warned = True
            log.warning(
                "the shared result cache at %s failed (%s: %s: %s); requests are served uncached, and "
                "Redis is tried again every %.0f s: check that it runs and is reachable from here "
                "(errors are counted in infinity_cloud_cache_redis_errors)",
                self.url, what, type(exc).__name__, exc or "timed out", self.backoff_s,
            )

    async def _ready(self) -> bool:
        """Available, or connecting and done within a call's time."""
        if self.available:
            return True
        if self._connecting is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._connecting), self.timeout_s)
        return self._connected

    async def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys or not await self._ready():
            return [None] * len(keys)
        try:
            found = await asyncio.wait_for(self._client.mget(list(keys)), self.timeout_s)
        except Exception as exc:  # RedisError, timeouts, a broken connection: a miss, never a failure
            self._failed("read", exc)
            return [None] * len(keys)
        return [value if isinstance(value, bytes) else None for value in found]

    def put_later(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """Write the rows after the answer has gone (a task the request does not wait for)."""
        if not pairs or (not self.available and self._connecting is None):
            return
        task = asyncio.get_running_loop().create_task(self._put(pairs))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        if self._connecting is not None:  # connecting: the write waits for it, nobody waits for the write
            with contextlib.suppress(Exception):
                await asyncio.shield(self._connecting)
        if not self._connected:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, value in pairs:
                    pipe.set(key, value, ex=self.ttl_s)
                # Longer than a read: nobody waits for a write, and a slow one is no miss.
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
        if self._connecting is not None:
            self._connecting.cancel()
        with contextlib.suppress(Exception):  # already gone
            await self._client.aclose()

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "ttl_s": self.ttl_s, "errors": self.errors, "available": self.available}
