"""Running a call over many inputs where one bad input must not fail the others (a bulk job's
shard, a Batch Transform mini-batch): each input the model refuses on its own is set aside
with the reason, and the rest run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from infinity_cloud.errors import InvalidInputError, PayloadTooLargeError

T = TypeVar("T")
R = TypeVar("R")


async def setting_aside(
    run: Callable[[list[T]], Awaitable[R]], items: Sequence[T]
) -> tuple[R | None, list[int], dict[int, str]]:
    """`run` on the items, again without each one refused on its own (an error that names its
    index: too long with truncation off, past the character limit, empty), until the rest go
    through. Returns `run`'s result over the kept items (None when none are left), their
    indices in `items`, and each refused item's reason. An error about the whole call (an
    option the model lacks) is raised."""
    kept = list(range(len(items)))
    refused: dict[int, str] = {}
    while kept:
        try:
            return await run([items[i] for i in kept]), kept, refused
        except (InvalidInputError, PayloadTooLargeError) as exc:
            if exc.index is None or not 0 <= exc.index < len(kept):
                raise
            refused[kept.pop(exc.index)] = exc.message
    return None, kept, refused
