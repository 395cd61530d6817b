"""How a dialect is told to the app: its routes, where they are mounted, and its bodies on
paths other dialects own (Voyage's and TEI's `/rerank`, told apart by their fields).

A path's owner writes an ordinary route; a dialect that shares the path adds a `Body`. The
app then serves that path with one route that gives each body to the dialect it is: the
first whose `claims` holds, else the owner. A field another dialect of the path serves but
the claimant does not is a 400 naming it, never ignored (the contract's rule for fields)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_type_hints

from fastapi import Body as BodyParam
from fastapi import FastAPI, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, APIRouter
from pydantic import BaseModel, PlainValidator, ValidationError
from starlette.responses import Response

from infinity_cloud.core.errors import UnsupportedError

Handler = Callable[[Any, Request], Awaitable[Response]]


@dataclass(frozen=True)
class Mount:
    """A router of a dialect and the prefixes it is served under (below the server's own
    prefix). Under a prefix other than "", operation ids are `<prefix>_<route name>`."""

    router: APIRouter
    prefixes: tuple[str, ...] = ("",)


@dataclass(frozen=True)
class Body:
    """A dialect's request on a POST path another dialect's route owns: its model, its
    handler `(body, request)`, and which bodies are its (null fields count as absent)."""

    path: str
    schema: type[BaseModel]
    handler: Handler
    claims: Callable[[dict[str, Any]], bool]
    responses: dict[int | str, dict[str, Any]] | None = None  # its answers, added to the path's


@dataclass(frozen=True)
class Dialect:
    name: str
    mounts: tuple[Mount, ...] = ()
    bodies: tuple[Body, ...] = ()


def validated(schema: type[BaseModel], data: Any) -> BaseModel:
    """`data` as `schema`, its errors reported as FastAPI reports a body's."""
    try:
        return schema.model_validate(data, from_attributes=True)  # as FastAPI validates a body
    except ValidationError as exc:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        ) from None


class PathBodies:
    """The bodies one POST path takes: its owner's, and those other dialects claim."""

    def __init__(self, path: str, owner: tuple[str, type[BaseModel], Handler],
                 others: Sequence[tuple[str, Body]] = ()) -> None:
        self.path, self.owner, self.others = path, owner, list(others)
        self.entries = [owner, *((name, b.schema, b.handler) for name, b in self.others)]

    def _pick(self, data: Any) -> tuple[str, type[BaseModel], Handler]:
        if isinstance(data, dict):
            for name, body in self.others:
                if body.claims(data):
                    return name, body.schema, body.handler
        return self.owner

    async def answer(self, data: Any, request: Request) -> Response:
        dialect, schema, handler = self._pick(data)
        if isinstance(data, dict):
            for field, value in data.items():
                others = [n for n, s, _ in self.entries if field in s.model_fields]
                if value is not None and field not in schema.model_fields and others:
                    raise UnsupportedError(
                        f"'{field}' is {' and '.join(others)}'s, and this {self.path} request is "
                        f"{dialect}'s; send one dialect's fields", param=field,
                    )
        return await handler(validated(schema, data), request)


def _own_body(route: APIRoute) -> type[BaseModel] | None:
    """The request model of a route whose handler is `(body, request)`, the shape every
    route a body can be forwarded to has; None for any other."""
    names = list(inspect.signature(route.endpoint).parameters)
    if names != ["body", "request"] or "POST" not in route.methods:
        return None
    schema = get_type_hints(route.endpoint).get("body")
    return schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None


def _merged(responses: dict[int | str, dict[str, Any]], more: dict[int | str, dict[str, Any]] | None
            ) -> dict[int | str, dict[str, Any]]:
    """A path's documented answers, each status in either shape when a sharer adds one."""
    merged = dict(responses)
    for status, extra in (more or {}).items():
        mine = merged.get(status)
        merged[status] = extra if mine is None else {**mine, "model": mine["model"] | extra["model"]}
    return merged


def _shared_route(router: APIRouter, route: APIRoute, bodies: PathBodies, others: Sequence[Body]) -> None:
    """`route` served by `bodies`, its document stating every body the path takes."""
    # The body is parsed by FastAPI (its JSON errors as on every route) and validated here,
    # once its dialect is known; the document names each dialect's model.
    union = Union[tuple(schema for _, schema, _ in bodies.entries)]  # noqa: UP007  (a runtime tuple)
    body_type = Annotated[Any, PlainValidator(lambda data: data, json_schema_input_type=union), BodyParam()]

    async def endpoint(request: Request, body: Any) -> Response:
        return await bodies.answer(body, request)

    endpoint.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request),
        inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, annotation=body_type),
    ])
    responses = route.responses
    for other in others:
        responses = _merged(responses, other.responses)
    router.add_api_route(
        route.path, endpoint, methods=list(route.methods), name=route.name, summary=route.summary,
        description=route.description or None, tags=route.tags, responses=responses,
        dependencies=route.dependencies, response_class=route.response_class,
        openapi_extra=route.openapi_extra, route_class_override=type(route),
    )


def mount(app: FastAPI, dialects: Sequence[Dialect], prefix: str, dependencies: Sequence[params.Depends]
          ) -> dict[str, PathBodies]:
    """Include every dialect's routes in `app`; the bodies each POST path takes, by path
    (below `prefix`), for a route that forwards a body to another (SageMaker's)."""
    sharers: dict[str, list[tuple[str, Body]]] = {}
    for dialect in dialects:
        for body in dialect.bodies:
            sharers.setdefault(body.path, []).append((dialect.name, body))
    table: dict[str, PathBodies] = {}
    for dialect in dialects:
        for at in dialect.mounts:
            for sub in at.prefixes:
                router = APIRouter()
                for route in at.router.routes:
                    schema = _own_body(route) if isinstance(route, APIRoute) else None
                    if schema is None:
                        router.routes.append(route)
                        continue
                    assert isinstance(route, APIRoute)
                    path = f"{sub}{route.path}"
                    others = sharers.pop(path, [])
                    table[path] = PathBodies(path, (dialect.name, schema, route.endpoint), others)
                    if others:
                        _shared_route(router, route, table[path], [b for _, b in others])
                    else:
                        router.routes.append(route)
                name = sub.strip("/")
                app.include_router(
                    router, prefix=f"{prefix}{sub}", dependencies=list(dependencies),
                    **({"generate_unique_id_function": lambda r, n=name: f"{n}_{r.name}"} if name else {}),
                )
    if sharers:  # a body for a path no dialect serves would never be answered
        raise ValueError(f"no dialect's route owns {', '.join(sharers)}")
    return table
