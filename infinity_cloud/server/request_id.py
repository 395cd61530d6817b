"""A request id for every request: the caller's `X-Request-Id` when it sends a sane one, else
a new one; answered in the `X-Request-Id` header and carried by every log line the request
causes (`RequestIdFilter`), so a client's report and the server's log meet."""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from infinity_cloud.server.asgi import HttpMiddleware

HEADER = "X-Request-Id"
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
current: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def request_id() -> str | None:
    """The id of the request being served here; None outside one."""
    return current.get()


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to each log record (None outside a request), and `request_tag`, the
    text format's " [ID]" (empty outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = rid = current.get()
        record.request_tag = f" [{rid}]" if rid else ""
        return True


class RequestId(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = Headers(scope=scope).get(HEADER.lower(), "")
        rid = given if _SANE.fullmatch(given) else uuid.uuid4().hex[:16]
        token = current.set(rid)

        async def with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        try:
            await self.app(scope, receive, with_header)
        finally:
            current.reset(token)
