"""ASGI middleware of our own: the request body size limit."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from infinity_cloud.errors import PayloadTooLargeError
from infinity_cloud.server.asgi import HttpMiddleware
from infinity_cloud.server.errors import error_response


class BodyLimit(HttpMiddleware):
    """Refuse bodies over `max_bytes`: at once from Content-Length, else while reading."""

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
            await error_response(self._error(declared.decode()))(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(413, self._error(f"more than {self.max_bytes}").message)
            return message

        await self.app(scope, counting_receive, send)


class _TooLarge(HTTPException):
    """Raised from `receive` once a streamed body passes the limit. An HTTPException, because
    FastAPI re-raises those from body parsing (any other error there becomes a 400); the
    app's HTTPException handler then answers 413 in the error shape."""
