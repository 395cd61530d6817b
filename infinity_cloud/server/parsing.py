"""Request bodies parsed with orjson, which is strict: invalid UTF-8, lone surrogates, nesting
deeper than 1,024 levels and numbers out of range are each a JSONDecodeError, which FastAPI
answers with a 422 naming the place, where the standard library's parser lets some through
(a lone surrogate reaches the tokenizer) or fails otherwise (a 400 without a reason).

orjson reports every byte it cannot read as "surrogates not allowed", so a body that is not
UTF-8 at all (gzip, UTF-16) is diagnosed here, and told what it is."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response

_GZIP = b"\x1f\x8b"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _not_utf8(body: bytes) -> str | None:
    """Why `body` is not UTF-8 text, and where; None when it is."""
    if body.startswith(_GZIP):
        return "the body is gzip-compressed; send the JSON uncompressed (Content-Encoding is not read)"
    if body.startswith(_UTF16_BOMS) or (len(body) > 1 and b"\x00" in body[:2]):
        return "the body is UTF-16 (or UTF-32); send the JSON as UTF-8"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not valid UTF-8: byte 0x{body[exc.start]:02x} at byte {exc.start} ({exc.reason})"
    return None


def parse_json(body: bytes) -> Any:
    """`body` as JSON, or a JSONDecodeError that says what is wrong and where."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        why = _not_utf8(body)
        if why is not None:
            raise json.JSONDecodeError(why, "", 0) from None
        if exc.msg.startswith("number is infinity"):
            raise json.JSONDecodeError(
                "a number is too large (beyond a 64-bit float's range)", exc.doc, exc.pos
            ) from None
        raise


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body orjson parses; every route of the app is one."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_strictly(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return parsed_strictly
