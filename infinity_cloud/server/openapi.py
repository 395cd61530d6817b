"""The OpenAPI document states the checks `admission/validation.py` makes after parsing (an empty text, too
many inputs): the wire schemas carry them as JSON-schema keywords pydantic does not enforce, so
a broken rule still answers the 400 or 413 the contract names, not pydantic's 422. A keyword
whose value is one of the server's limits names the `LimitsSpec` field, and the app fills in
the value of its own limits when it builds the document."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from infinity_cloud.core.config import LimitsSpec

# Where a schema keeps the limits to fill in: {keyword: {"fields": [LimitsSpec field, ...], "less": n}}.
_LIMITS = "x-limits"
# A schema marked so is a kind of input: its enum is the kinds the app serves (`families.input_kinds`),
# all ("all") or those of documents to rank ("ranked").
INPUT_KINDS = "x-input-kinds"


class Limit:
    """A server limit as a keyword's value: the smallest of these `LimitsSpec` fields, less
    `less` (what the request adds to the same count: /similarity's source sentence)."""

    def __init__(self, *names: str, less: int = 0) -> None:
        unknown = [name for name in names if name not in LimitsSpec.model_fields]
        if unknown or not names:
            raise ValueError(f"not LimitsSpec fields: {unknown or names}")
        self.names = names
        self.less = less


class Checked:
    """`Annotated` metadata: JSON-schema keywords (minLength=1, maxItems=Limit(...)) for a rule
    admission/validation.py checks; the schema states them, pydantic's validation ignores them."""

    def __init__(self, **keywords: Any) -> None:
        self.keywords = keywords

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        for keyword, value in self.keywords.items():
            if isinstance(value, Limit):
                schema.setdefault(_LIMITS, {})[keyword] = {"fields": list(value.names), "less": value.less}
            else:
                schema[keyword] = value
        return schema


def fill_limits(node: Any, limits: LimitsSpec, kinds: Mapping[str, tuple[str, ...]]) -> None:
    """Replace, in place, each schema's named limits with their values in `limits`, and list
    `kinds` as the enum of each kind of input."""
    if isinstance(node, dict):
        for keyword, limit in node.pop(_LIMITS, {}).items():
            node[keyword] = min(getattr(limits, name) for name in limit["fields"]) - limit["less"]
        if INPUT_KINDS in node:
            node["enum"] = list(kinds[node.pop(INPUT_KINDS)])
        for value in node.values():
            fill_limits(value, limits, kinds)
    elif isinstance(node, list):
        for value in node:
            fill_limits(value, limits, kinds)


def with_limits(
    app: FastAPI, limits: LimitsSpec, kinds: Mapping[str, tuple[str, ...]]
) -> Callable[[], dict[str, Any]]:
    """`app.openapi`, its document stating `limits` and the kinds of input served (`kinds`):
    built once, as FastAPI's is."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            fill_limits(build(), limits, kinds)  # build() keeps the document in app.openapi_schema
        return app.openapi_schema  # type: ignore[return-value]

    return openapi
