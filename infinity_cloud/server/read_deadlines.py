"""uvicorn's HTTP protocol with read deadlines: a client gets `header_timeout_s` to send a
request's headers and `body_timeout_s` to send its body, else a 408 and the connection
closed. uvicorn itself only times out idle keep-alive connections, so a client trickling
bytes (slowloris) holds a connection, and a task, forever.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from infinity_cloud.core.config import ServerSpec
from infinity_cloud.server.errors import error_body


def _timeout_response(what: str, seconds: float) -> bytes:
    body = orjson.dumps(error_body(
        f"the request's {what} did not arrive within {seconds:g} s; send it faster or raise "
        f"--{'header' if what == 'headers' else 'body'}-timeout-s",
        "request_timeout", 408,
    ))
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


class DeadlineProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm("headers", self.header_timeout_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # the next request on a kept-alive connection
            self._arm("headers", self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm("body", self.body_timeout_s)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, what: str, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, what, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, what: str, seconds: float) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # A response under way (the app answered before reading the whole body) is left whole.
        if what == "headers" or self.cycle is None or not self.cycle.response_started:
            self.transport.write(_timeout_response(what, seconds))
        self.transport.close()


def deadline_protocol(server: ServerSpec) -> type[Any]:
    """The protocol class for uvicorn's `http=` with the spec's deadlines."""
    return type(
        "DeadlineProtocol", (DeadlineProtocol,),
        {"header_timeout_s": server.header_timeout_s, "body_timeout_s": server.body_timeout_s},
    )
