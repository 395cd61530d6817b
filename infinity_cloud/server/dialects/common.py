"""What the dialects share: the request base (nulls, other dialects' unserved fields), the
annotated wire types, the documents rerank three dialects send, and the answer's envelope."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.results import ClassifyResult, RerankResult
from infinity_cloud.engine.asks import RerankAsk
from infinity_cloud.families import input_kinds
from infinity_cloud.server.engine_calls import answer
from infinity_cloud.server.openapi import INPUT_KINDS, Checked, Limit


def _whole_number(value: Any) -> Any:
    """2.0 as 2: JSON Schema's integer admits a whole float (a generated client may send one, and
    the parser reads an integer past 64 bits as one); 2.5, "2" and true are still refused. What
    the number is for then says whether it is too large (a 400 naming it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _known_kind(ranked: bool) -> Callable[[Any], str]:
    def known(value: Any) -> str:
        """A kind of input the families' registry holds now (`families.input_kinds`), refused
        as a Literal of them would be."""
        kinds = input_kinds(ranked=ranked)
        if not isinstance(value, str) or value not in kinds:
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": kinds.expected()})
        return value

    return known


# A kind of input (text, image, audio, or one a family brings: `input_kind.InputKind`), read
# from the registry when a request is; the OpenAPI document lists the kinds the app was built
# with (server/openapi.py). `RankedKind`: of documents to rank (a family's that ranks: ColPali's pages).
Kind = Annotated[str, PlainValidator(_known_kind(False)),
                 WithJsonSchema({"type": "string", INPUT_KINDS: "all"})]
RankedKind = Annotated[str, PlainValidator(_known_kind(True)),
                       WithJsonSchema({"type": "string", INPUT_KINDS: "ranked"})]


# An integer field: a JSON number with no fraction.
Int = Annotated[StrictInt, BeforeValidator(_whole_number)]

# What admission/validation.py checks after parsing, stated for the OpenAPI document (server/openapi.py).
# A text: not empty (400), not longer than the limit (413).
Text = Annotated[StrictStr, Checked(minLength=1, maxLength=Limit("max_chars_per_text"))]
# A string that may be a text or a media URL (modality image or audio): not empty; its length
# is checked only when it is a text.
Item = Annotated[StrictStr, Checked(minLength=1)]
# Inputs of one request: at least one (400), no more than the limit (413).
INPUTS = Checked(minItems=1, maxItems=Limit("max_inputs_per_request"))
Texts = Annotated[list[Text], INPUTS]
Items = Annotated[list[Item], INPUTS]
# A token id outside the vocabulary is a 400; a negative one always is.
TokenId = Annotated[Int, Checked(minimum=0)]
TokenIdList = Annotated[list[TokenId], Checked(minItems=1)]
# dimensions, top_n: 0 means all; a negative one is a 400.
NonNegative = Annotated[Int, Checked(minimum=0)]
# max_tokens_per_doc: 1 or more (400).
Positive = Annotated[Int, Checked(minimum=1)]


def one_list_of(*fields: str) -> dict[str, Any]:
    """A model's JSON-schema rule for its validator: exactly one of `fields` is a list (null
    is the same as absent)."""
    return {"oneOf": [{"required": [field], "properties": {field: {"type": "array"}}} for field in fields]}


def _admits_null(field: dict[str, Any]) -> bool:
    options = [field, *field.get("anyOf", ())]
    return any(option.get("type") == "null" for option in options)


def not_both(*pairs: tuple[str, str]) -> dict[str, Any]:
    """A model's JSON-schema rule for its validator: of each pair, at most one is sent (null is
    the same as absent)."""
    sent = {"not": {"type": "null"}}
    return {"allOf": [{"not": {"required": list(pair), "properties": dict.fromkeys(pair, sent)}}
                      for pair in pairs]}


# Fields of the dialects we speak that no request model serves, the values that mean what
# the server does anyway, and why any other is refused: a 400 naming the field, never an
# answer that silently is not what was asked.
UNSERVED_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "rank_fields": ((), "Cohere's fields of structured documents; send each document's text"),
    "task": ((), "Jina's task adapters; say what texts are for with input_type (the model's "
             "query/document prompts)"),
    "late_chunking": ((False,), "Jina's late chunking is served on /v1/embeddings and "
                      "/v1/embeddings/chunked"),
    "normalized": ((True,), "Jina's normalized=false; embeddings are as the model makes them"),
    "truncate_prompt_tokens": ((), "vLLM's per-input token cap; inputs are cut at the model's limit "
                               "(truncate)"),
}


class _Request(BaseModel):
    # Fields no dialect we speak defines are ignored (clients add their own); those some
    # dialect defines are served, or refused (UNSERVED_FIELDS; on a path several dialects
    # share, another dialect's fields: dialects.registry).
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """`null` for a field means its default (litellm sends `encoding_format: null`); a
        required field sent as null is then reported missing. A dialect's field that is not
        served is a 400 naming it."""
        if not isinstance(data, dict):
            return data
        for name, (harmless, reason) in UNSERVED_FIELDS.items():
            value = data.get(name)
            if value is not None and name not in cls.model_fields and value not in harmless:
                raise UnsupportedError(f"'{name}' is not served: {reason}", param=name)
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
                                     ) -> JsonSchemaValue:
        """Each optional field may be null (it means the default), as `_null_is_default` reads it."""
        reference = handler(core_schema)
        schema = handler.resolve_ref_schema(reference)
        required = set(schema.get("required", ()))
        for name, field in schema.get("properties", {}).items():
            if name not in required and not _admits_null(field):
                rest = {k: v for k, v in field.items() if k in ("title", "description", "default")}
                kept = {k: v for k, v in field.items() if k not in rest}
                schema["properties"][name] = {**rest, "anyOf": [kept, {"type": "null"}]}
        return reference

    model: str | None = Field(None, description="served model name; optional with one model")


class TextDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: Item


class _DocumentsRerank(_Request):
    """What every rerank that sends `documents` has (Infinity, Jina, Cohere, Voyage)."""

    query: Text
    documents: Annotated[list[Item | TextDocument], INPUTS]
    return_documents: StrictBool = False
    raw_scores: StrictBool = Field(False, description="logits instead of sigmoid scores")
    modality: RankedKind = Field(
        "text", description="what the documents are: image URLs or data URIs for a multi-vector model "
        "(ColPali)"
    )

    def docs(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankRequest(_DocumentsRerank):
    """Infinity's, Jina's and Cohere's rerank: the same fields (Jina and Cohere may send each
    document as `{"text": ...}`); each answers in its own shape."""

    top_n: NonNegative | None = Field(None, description="how many results; absent or 0 = all")
    truncate: StrictBool = True
    max_tokens_per_doc: Positive | None = Field(
        None, description="each document cut to this many tokens first (Cohere's; the model's own limit "
        "still holds)",
    )
    instruction: Text | None = Field(
        None, description="what to rank for, for an LLM reranker (Qwen3-Reranker's <Instruct>); absent: the "
        "model's own. A model that reads no instruction answers 400",
    )


async def ranked(
    request: Request, model: str | None, query: str, documents: list[str], *, top_n: int | None,
    raw_scores: bool, truncate: bool, modality: str = "text", max_tokens_per_doc: int | None = None,
    any_name: bool = False, instruction: str | None = None,
) -> RerankResult:
    """Every dialect's ranking: the engine's one call, with the route's metrics (`any_name`:
    TEI's, whose clients send a name of their own)."""
    ask = RerankAsk(query, documents, model, top_n=top_n, raw_scores=raw_scores, truncate=truncate,
                    modality=modality, max_tokens_per_doc=max_tokens_per_doc,  # type: ignore[arg-type]
                    any_name=any_name, instruction=instruction)
    return await answer(request, model, len(documents), request.app.state.engine.rerank(ask),
                        (Capability.RERANK, Capability.MULTI_VECTOR), any_name=any_name)


def envelope(kind: str, model: str, tokens: int) -> dict[str, Any]:
    """The fields OpenAI's and Infinity's answers carry around their data."""
    return {
        "object": kind,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "id": f"infinity-{uuid.uuid4()}",
        "created": int(time.time()),
    }


def label_rows(result: ClassifyResult) -> list[list[dict[str, Any]]]:
    """Per input, its labels best first as {label, score}: Infinity's and TEI's row shape."""
    return [[{"label": label, "score": score} for label, score in row] for row in result.labels]
