"""What a media input that cannot be decoded is told: which input, what its bytes look like,
and the decoder's reason in words (without the decoder's name for its in-memory file,
`<_io.BytesIO object at 0x...>`, which says nothing to the caller)."""

from __future__ import annotations

import re

from infinity_cloud.core.errors import InvalidInputError

_FILE_REPR = re.compile(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>:?")


def _looks_like(data: bytes) -> str:
    """What `data` is, in a few words, when it is plainly not media."""
    if not data:
        return "it is empty (0 bytes)"
    head = data[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<?xml", b"<svg")):
        kind = "SVG" if b"<svg" in head else "HTML or XML"
        return f"it is {kind} text ({len(data):,} bytes), not binary media"
    try:
        text = data[:64].decode("utf-8")
    except UnicodeDecodeError:
        return f"its {len(data):,} bytes start with {data[:8].hex(' ')}"
    if text.isprintable() or text.strip().isprintable():
        return f"it is text ({len(data):,} bytes) starting {text[:40]!r}"
    return f"its {len(data):,} bytes start with {data[:8].hex(' ')}"


def decoder_reason(exc: BaseException) -> str:
    """The decoder's message, without its name for the in-memory file."""
    return _FILE_REPR.sub("", str(exc)).strip(" :") or type(exc).__name__


def undecodable(index: int, kind: str, readable: str, data: bytes, exc: BaseException) -> InvalidInputError:
    """A 400 naming input `index`: its bytes are not a `kind` this server decodes (`readable`:
    the formats it does), what they look like, and the decoder's reason."""
    return InvalidInputError(
        f"input {index} is not {kind} that can be decoded ({readable} are): {_looks_like(data)}; "
        f"the decoder says: {decoder_reason(exc)}",
        param="input", index=index,
    )
