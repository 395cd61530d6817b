"""The kinds of input are what the families declare (`families.input_kinds`): the built-in
ones as the closed lists had them, and a family's own kind read by what names kinds (the
images' extras here; the wire, the command line and the bulk job in tests/test_families.py)."""

from __future__ import annotations

import pytest

from infinity_cloud import families
from infinity_cloud.core.input_kind import InputKind, InputKinds
from infinity_cloud.families import Family, input_kinds
from infinity_cloud.targets.container import media_extras


class Smeller(Family):
    name = "smeller"
    kinds = (InputKind("smell", fetched=True, extra="cache", modules=("redis",), needs="redis"),)


def test_the_built_in_kinds_are_those_the_lists_named() -> None:
    assert input_kinds().names == ("text", "image", "audio")
    assert input_kinds(ranked=True).names == ("text", "image")  # rerank's modality
    assert input_kinds().expected() == "'text', 'image' or 'audio'"  # pydantic's Literal message
    assert media_extras() == ("audio", "vision")
    assert input_kinds()["image"].fetched and not input_kinds()["text"].fetched


def test_a_familys_own_kind_is_read_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(families, "FAMILIES", [Smeller(), *families.FAMILIES])
    assert input_kinds().names == ("text", "smell", "image", "audio")
    assert "smell" not in input_kinds(ranked=True)  # its models rank nothing
    assert media_extras() == ("audio", "cache", "vision")


def test_a_kind_declared_twice_differently_is_refused() -> None:
    with pytest.raises(ValueError, match="'image' is declared twice"):
        InputKinds([*input_kinds(), InputKind("image")])
