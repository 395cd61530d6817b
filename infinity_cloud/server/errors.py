"""One table from errors to HTTP answers, in the OpenAI error shape the SDKs parse."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from infinity_cloud.core import errors
from infinity_cloud.server.asgi import HttpMiddleware
from infinity_cloud.server.encoding import json_response
from infinity_cloud.server.request_id import request_id

log = logging.getLogger(__name__)


class UnauthorizedError(errors.InfinityCloudError):
    """Missing or wrong API key (an HTTP concern, so it lives here)."""


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(BaseModel):
    """Every error answer but TEI's (`dialects/tei.py` reshapes it): OpenAI's shape, and the
    message again as Jina's and Voyage's `detail` (a 422's is FastAPI's list) and Cohere's
    `message`."""

    error: ErrorDetail
    detail: str | list[dict[str, Any]]
    message: str


_STATUSES = {
    400: "invalid input: empty, unsupported for the model, a refused or undecodable media input",
    401: "missing or wrong API key (when the server has keys); answered before the body is read",
    404: "no such model",
    409: "a model of that name is served, or is still loading (the admin API)",
    408: "the client took too long to send its headers or body",
    413: "too many inputs, too long a text, too large a body, more memory than the budget holds, or more "
         "work than an idle server could finish within the platform's own limit on one request",
    422: "malformed body: not JSON, bad UTF-8, wrong field types, unknown values",
    429: "overloaded (queue full, memory taken, or its wait past the model's deadline): retry after "
         "Retry-After seconds (a request shed by the deadline keeps its place in line)",
    500: "a bug, or a failed batch; the server stays up",
    503: "the model is loading or shutting down, its worker died, or its int8/uint8 ranges are being "
         "calibrated: retry after Retry-After seconds",
}


# What an inference route may answer; 409 is the admin API's.
_INFERENCE = tuple(status for status in _STATUSES if status != 409)


def error_responses(
    shape: Any = ErrorBody, *, validation: Any = None, statuses: Collection[int] = _INFERENCE
) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route: each error status of `statuses` with the shape it is
    answered in: `shape` (a model or a union) for the route's own errors, `validation` (default
    `shape`) for its 422s. A missing key (ApiKeyGate) and a slow client (the protocol's read
    deadlines) are answered before any route runs, so in our shape on every route; a body over
    the limit by its Content-Length (BodyLimit) and a bug (CatchBugs) too, besides the route's
    own 413s and 500s; and a path that no route takes (`/models/NAME` with a line break in the
    name: a path parameter stops there), besides the route's own 404s."""

    def model(status: int) -> Any:
        if status in (401, 408):
            return ErrorBody
        if status in (404, 413, 500):
            return ErrorBody | shape
        return validation if status == 422 and validation is not None else shape

    return {status: {"model": model(status), "description": _STATUSES[status]} for status in statuses}


# class -> (status, type); the first match in MRO order wins.
_TABLE: dict[type[errors.InfinityCloudError], tuple[int, str]] = {
    errors.InvalidInputError: (400, "invalid_request_error"),
    UnauthorizedError: (401, "authentication_error"),
    errors.ModelNotFoundError: (404, "model_not_found"),
    errors.ModelConflictError: (409, "model_conflict"),
    errors.PayloadTooLargeError: (413, "payload_too_large"),
    errors.QueueFullError: (429, "rate_limit_exceeded"),
    errors.MemoryExhaustedError: (503, "memory_exhausted"),
    errors.ModelNotReadyError: (503, "model_not_ready"),
    errors.DeviceMemoryError: (503, "device_out_of_memory"),
    errors.BatchFailedError: (500, "inference_error"),
}


def error_body(message: str, kind: str, code: int, param: str | None = None, **extra: Any) -> dict[str, Any]:
    """OpenAI's `error` object, with the message also where the other dialects' clients read
    it: Jina's and Voyage's at `detail` (jina-haystack, voyageai; a 422's `detail` stays
    FastAPI's list, which infinity_client reads), Cohere's at `message`. Their routes share
    paths (Jina's and Voyage's embeddings are OpenAI's), so one body speaks to each."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code},
            "detail": message, "message": message, **extra}


def status_of(exc: errors.InfinityCloudError) -> tuple[int, str]:
    for cls in type(exc).__mro__:
        if cls in _TABLE:
            return _TABLE[cls]
    return 500, "server_error"


def error_response(exc: errors.InfinityCloudError) -> Response:
    status, kind = status_of(exc)
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    retry = getattr(exc, "retry_after_s", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return json_response(error_body(exc.message, kind, status, exc.param), status, headers)


async def _domain_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, errors.InfinityCloudError)
    return error_response(exc)


def _describe(err: dict[str, Any]) -> str:
    if err.get("type") == "json_invalid":  # FastAPI's loc holds a character offset, not a field
        reason = (err.get("ctx") or {}).get("error")
        at = f" at character {err['loc'][1]}" if len(err.get("loc", ())) > 1 else ""
        return f"body: malformed JSON{at}" + (f": {reason}" if reason else f" ({err.get('msg')})")
    where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
    return f"{where}: {err.get('msg', 'invalid')}"


def _not_json(request: Request, details: list[dict[str, Any]]) -> str | None:
    """What to say when a body was not read as JSON because its content type is another."""
    kind = request.headers.get("content-type", "")
    whole_body = [e for e in details if tuple(e.get("loc", ())) == ("body",)]
    if "json" in kind or not any(e.get("type") == "model_attributes_type" for e in whole_body):
        return None
    hint = ""
    if "form-urlencoded" in kind:
        hint = " (curl -d sends that: add -H 'Content-Type: application/json')"
    return (
        "invalid request: the body must be JSON sent as Content-Type: application/json, not "
        f"{kind or 'none'}{hint}"
    )


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    details = exc.errors()
    fields = (e["loc"][1] for e in details if len(e.get("loc", ())) > 1)
    param = next((f for f in fields if isinstance(f, str)), None)
    message = _not_json(request, details) or "invalid request: " + "; ".join(
        _describe(e) for e in details[:5]
    )
    # Each error without the `input` it was about: the caller has it, echoing a 16 MB body back
    # helps nobody, and a value nested 1,000 deep would exhaust the encoder's recursion (a 500).
    detail = jsonable_encoder([{k: v for k, v in e.items() if k != "input"} for e in details])
    body = error_body(message, "invalid_request_error", 422, param, detail=detail)
    return json_response(body, 422)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> str | None:
    """Every method the request's path is served with. Starlette's 405 names those of the first
    route the path matches; `/` and `/models/NAME` are two routes each (GET, and TEI's POST).
    Asked of the routes as the router asks them (FastAPI keeps included routers nested)."""
    routes = request.app.router.routes
    allowed = [method for method in _METHODS if any(
        route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)]
    return ", ".join(allowed) or None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kinds = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
    kind = kinds.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
    return json_response(error_body(str(exc.detail), kind, exc.status_code), exc.status_code, headers)


EXCEPTION_HANDLERS = {
    errors.InfinityCloudError: _domain_error,
    RequestValidationError: _validation_error,
    HTTPException: _http_error,
}


async def handled(request: Request, exc: Exception) -> Response | None:
    """The answer the app's handlers give `exc`; None for an exception they leave alone."""
    for cls in type(exc).__mro__:
        if cls in EXCEPTION_HANDLERS:
            return await EXCEPTION_HANDLERS[cls](request, exc)  # type: ignore[index]
    return None


class CatchBugs(HttpMiddleware):
    """Turn an unexpected exception into a logged 500 with a request id; the server lives on."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            rid = request_id() or uuid.uuid4().hex[:16]
            method, path = scope.get("method"), scope.get("path")
            log.exception("unhandled error in %s %s (request id %s)", method, path, rid)
            if started:
                raise
            message = f"internal server error (request id {rid}); the server logged the details"
            await json_response(error_body(message, "server_error", 500), 500, {"X-Request-Id": rid})(
                scope, receive, send
            )
