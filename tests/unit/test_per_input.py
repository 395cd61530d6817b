"""`setting_aside`: each input the engine refuses on its own is set aside with the engine's
reason, naming the input by its place among the items given, not in the retried call."""

from __future__ import annotations

import asyncio

from infinity_cloud.core.errors import InvalidInputError
from infinity_cloud.core.per_input import setting_aside


async def refusing_empty(texts: list[str]) -> list[str]:
    for index, text in enumerate(texts):
        if not text:
            raise InvalidInputError(f"'input' item {index} is an empty string", param="input", index=index)
    return texts


def test_a_refused_item_is_named_by_its_place_among_the_items() -> None:
    items = ["a", "", "b", ""]
    result, kept, refused = asyncio.run(setting_aside(refusing_empty, items))
    assert result == ["a", "b"] and kept == [0, 2]
    # The second refusal came from a call of ["a", "b", ""], where it was item 2; it is item 3.
    assert refused == {1: "'input' item 1 is an empty string", 3: "'input' item 3 is an empty string"}


def test_a_caller_names_the_items_its_own_way() -> None:
    _, _, refused = asyncio.run(setting_aside(refusing_empty, ["a", "", ""], name=lambda i: f"row {100 + i}"))
    assert refused == {1: "row 101 is an empty string", 2: "row 102 is an empty string"}
