"""What a kind of input is (text, image, audio, or one a family brings): declared once by the
family module that introduces it (`families.base.Family.kinds`), and read from the families'
registry (`families.input_kinds`) by everything that names kinds: the wire models and the
OpenAPI document, the command line, the bulk job, preflight and the images' extras. How a
tower's inputs of a kind are decoded and encoded is the tower's input encoder, which the
family gives (`ModelFamily.encoders`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class InputKind:
    """One kind of input: `fetched`: its inputs are URLs or data URIs the engine fetches (a
    bulk job reads a local path or s3:// URI into a data URI), else they are sent inline, as
    they are; `extra`: the package extra that installs `modules`, which decoding it imports
    (`needs` names them for a person), for install hints, preflight and every image."""

    name: str
    fetched: bool = False
    extra: str | None = None
    modules: tuple[str, ...] = ()
    needs: str = ""


TEXT = InputKind("text")


class InputKinds:
    """The kinds served, in the order first declared, text first; looked up by name."""

    def __init__(self, kinds: Iterable[InputKind]) -> None:
        self._kinds: dict[str, InputKind] = {TEXT.name: TEXT}
        for kind in kinds:
            known = self._kinds.setdefault(kind.name, kind)
            if known != kind:
                raise ValueError(f"input kind {kind.name!r} is declared twice, differently: {known}, {kind}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def __iter__(self) -> Iterator[InputKind]:
        return iter(self._kinds.values())

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def __getitem__(self, name: str) -> InputKind:
        return self._kinds[name]

    def expected(self) -> str:
        """The names as pydantic's Literal error lists them: 'text', 'image' or 'audio'."""
        quoted = [f"'{name}'" for name in self._kinds]
        return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def extras(self) -> tuple[str, ...]:
        """The extras decoding every kind needs, sorted."""
        return tuple(sorted({kind.extra for kind in self if kind.extra}))
