"""ASGI middleware of our own: the request body size limit, and a request's `Cache-Control`."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from infinity_cloud.cache.result_cache import CACHE_MODE, CacheMode
from infinity_cloud.core.errors import PayloadTooLargeError
from infinity_cloud.server.asgi import HttpMiddleware
from infinity_cloud.server.errors import error_response

# A body past the limit is still read, up to this many times the limit, before the 413 goes
# out: a server that answers and closes with the body unread resets the connection, and the
# client, still sending, often never reads the answer. Past it, the connection is cut.
DRAIN_FACTOR = 4


class BodyLimit(HttpMiddleware):
    """Refuse bodies over `max_bytes`: at once from Content-Length, else while reading; either
    way the body is read to its end first (up to `DRAIN_FACTOR` times the limit), so the
    client reads a 413, not a reset."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    def _error(self, size: str) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"request body of {size} bytes is over the limit of {self.max_bytes} bytes"
        )

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._drain(receive, 0)
            await error_response(self._error(declared.decode()))(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if message.get("more_body", False):
                        await self._drain(receive, seen)
                    raise _TooLarge(413, self._error(f"more than {self.max_bytes}").message)
            return message

        await self.app(scope, counting_receive, send)

    async def _drain(self, receive: Receive, seen: int) -> None:
        """Read and drop the rest of a refused body (`seen` bytes of it read already)."""
        while seen <= DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


class _TooLarge(HTTPException):
    """Raised from `receive` once a streamed body passes the limit. An HTTPException, because
    FastAPI re-raises those from body parsing (any other error there becomes a 400); the
    app's HTTPException handler then answers 413 in the error shape."""


class CacheControl(HttpMiddleware):
    """A request's `Cache-Control` as the result cache's mode for its calls: `no-store`, not
    read and not kept; `no-cache`, computed again (and kept); otherwise, the cache as usual."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        asked = {part.strip().lower() for value in headers.getlist("cache-control")
                 for part in value.split(",")}
        if headers.get("pragma", "").strip().lower() == "no-cache":  # HTTP/1.0's, which some clients send
            asked.add("no-cache")
        mode: CacheMode = "off" if "no-store" in asked else "refresh" if "no-cache" in asked else "use"
        token = CACHE_MODE.set(mode)
        try:
            await self.app(scope, receive, send)
        finally:
            CACHE_MODE.reset(token)
