"""Running a call over many inputs where one bad input must not fail the others (a bulk job's
shard, a Batch Transform mini-batch): each input the model refuses on its own is set aside
with the reason, and the rest run."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from infinity_cloud.core.errors import InvalidInputError, PayloadTooLargeError

T = TypeVar("T")
R = TypeVar("R")


async def setting_aside(
    run: Callable[[list[T]], Awaitable[R]], items: Sequence[T], name: Callable[[int], str] | None = None,
) -> tuple[R | None, list[int], dict[int, str]]:
    """`run` on the items, again without each one refused on its own (an error that names its
    index: too long with truncation off, past the character limit, empty), until the rest go
    through. Returns `run`'s result over the kept items (None when none are left), their
    indices in `items`, and each refused item's reason, naming the item by its index in
    `items`, or as `name` does with that index (the engine's message numbers it within the
    call that refused it, a call of the items still kept). An error about the whole call (an
    option the model lacks) is raised."""
    kept = list(range(len(items)))
    refused: dict[int, str] = {}
    while kept:
        try:
            return await run([items[i] for i in kept]), kept, refused
        except (InvalidInputError, PayloadTooLargeError) as exc:
            if exc.index is None or not 0 <= exc.index < len(kept):
                raise
            item = kept.pop(exc.index)
            refused[item] = _renamed(exc.message, exc.index, item, name)
    return None, kept, refused


def _renamed(message: str, index: int, item: int, name: Callable[[int], str] | None) -> str:
    """The engine's words for input `index` of a call ("input 3", "'input' item 3") naming
    `item` instead: its number, or `name(item)`."""
    return re.sub(rf"((?:'\w+' item|input) ){index}\b",
                  lambda m: name(item) if name else f"{m.group(1)}{item}", message, count=1)
