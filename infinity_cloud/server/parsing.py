"""Request bodies parsed with orjson, which is strict: invalid UTF-8, lone surrogates, nesting
deeper than 1,024 levels and numbers out of range are each a JSONDecodeError, which FastAPI
answers with a 422 naming the place, where the standard library's parser lets some through
(a lone surrogate reaches the tokenizer) or fails otherwise (a 400 without a reason)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body orjson parses; every route of the app is one."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_strictly(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return parsed_strictly
