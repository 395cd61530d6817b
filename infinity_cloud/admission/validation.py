"""Checks on what a caller sent, made once for the Python API and every HTTP route."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError, PayloadTooLargeError

ANSWER_OVERHEAD_BYTES = 4096


def check_answer_size(answer_bytes: int, limits: LimitsSpec) -> None:
    """An answer that could pass the platform's response limit (`answer_bytes`: its numbers
    at the most each takes on the wire) is refused before any work: it would be computed,
    then dropped by the platform with an error of its own."""
    limit = limits.max_response_bytes
    if limit is None:
        return
    size = answer_bytes + ANSWER_OVERHEAD_BYTES
    if size > limit:
        parts = -(-size // limit)
        raise PayloadTooLargeError(
            f"the answer could take {size / 1e6:.1f} MB, more than this deployment's response limit of "
            f"{limit / 1e6:.1f} MB (the platform refuses larger answers): split the request into at "
            f"least {parts} (or ask for fewer dimensions, or encoding_format base64)",
            param="input",
        )


def check_count(n: int, limits: LimitsSpec, param: str = "input") -> None:
    if n == 0:
        raise InvalidInputError(f"'{param}' is empty: send at least one item", param=param)
    if n > limits.max_inputs_per_request:
        raise PayloadTooLargeError(
            f"'{param}' holds {n} items, more than the limit of "
            f"{limits.max_inputs_per_request} per request; split the request",
            param=param,
        )


def check_texts(
    texts: Sequence[str], limits: LimitsSpec, param: str = "input", *, documents: bool = False
) -> None:
    """Not empty, well-formed, not too many; each within the characters a text may have, unless
    they are `documents` to be cut into chunks (bounded by the body's size alone)."""
    check_count(len(texts), limits, param)
    for index, text in enumerate(texts):
        if not text or (documents and text.isspace()):
            what = "an empty string" if not text else "only whitespace: nothing to embed"
            raise InvalidInputError(f"'{param}' item {index} is {what}", param=param, index=index)
        if not documents and len(text) > limits.max_chars_per_text:
            raise PayloadTooLargeError(
                f"'{param}' item {index} has {len(text)} characters, more than the limit of "
                f"{limits.max_chars_per_text}",
                param=param, index=index,
            )
        if not text.isascii():  # HTTP bodies are checked as they are parsed; Python callers here
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidInputError(
                    f"'{param}' item {index} is not well-formed Unicode (a lone surrogate at character "
                    f"{exc.start})",
                    param=param, index=index,
                ) from None


def check_media(inputs: Sequence[Any], limits: LimitsSpec) -> None:
    """Image or audio inputs: URLs or data URIs, each a non-empty string, and not too many."""
    check_count(len(inputs), limits)
    if len(inputs) > limits.max_media_per_request:
        raise PayloadTooLargeError(
            f"'input' holds {len(inputs)} media items, more than the limit of "
            f"{limits.max_media_per_request} per request; split the request",
            param="input",
        )
    for index, item in enumerate(inputs):
        if not isinstance(item, str) or not item:
            raise InvalidInputError(
                f"'input' item {index} must be an http(s) URL or a data: URI for image and audio inputs",
                param="input",
            )


def check_token_ids(inputs: Sequence[Sequence[int]], limits: LimitsSpec) -> None:
    check_count(len(inputs), limits)
    for index, ids in enumerate(inputs):
        if not ids:
            raise InvalidInputError(f"'input' item {index} is an empty list of token ids", param="input")


def check_no_token_ids(inputs: Sequence[Any], what: str) -> None:
    """For a capability that reads text only (`what`: "sparse embeddings"): token ids are a 400."""
    if is_token_ids(inputs):
        raise InvalidInputError(f"{what} take text, not token ids", param="input")


def check_dimensions(dimensions: int | None, width: int | None) -> None:
    """Matryoshka truncation: 0 or None is the full vector (api.md), as in every dialect's name
    for it (Voyage's and Cohere's output_dimension, TEI's dimensions)."""
    if dimensions is None or dimensions == 0:
        return
    if dimensions < 0:
        raise InvalidInputError(f"'dimensions' must be 0 or absent (the full vector) or a positive count, "
                                f"got {dimensions}", param="dimensions")
    if width is not None and dimensions > width:
        raise InvalidInputError(
            f"'dimensions' is {dimensions} but the model's embeddings have {width}",
            param="dimensions",
        )


def check_embedding_types(kinds: Sequence[str], served: Sequence[str]) -> None:
    """Quantised output types asked for, each one the server makes."""
    unserved = [kind for kind in kinds if kind not in served]
    if unserved:
        raise InvalidInputError(
            f"embedding type {unserved[0]!r} is not served; ask for {', '.join(served)}",
            param="embedding_types",
        )


def check_top_n(top_n: int | None) -> None:
    if top_n is not None and top_n < 0:
        raise InvalidInputError(f"'top_n' must be 0 (all) or positive, got {top_n}", param="top_n")


def check_max_tokens_per_doc(tokens: int | None) -> None:
    if tokens is not None and tokens < 1:
        raise InvalidInputError(f"'max_tokens_per_doc' must be 1 or more, got {tokens}",
                                param="max_tokens_per_doc")


def is_token_ids(inputs: Sequence[Any]) -> bool:
    """True for a list of token-id lists (the text/ids split is made by the schema)."""
    return bool(inputs) and not isinstance(inputs[0], str)
