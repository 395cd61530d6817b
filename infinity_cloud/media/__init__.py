"""Images and audio: fetching them for a request (`fetch.py`), turning them into a tower's
inputs (`images.py`, `audio.py`, `pages.py`; which a model's towers use, its family says)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from infinity_cloud.config import LimitsSpec
from infinity_cloud.numerics.inputs import ModelInputs


class MediaPreprocessor(Protocol):
    """What a tower that reads media needs: one input's bytes opened (its header read, its
    size checked against `limits`) with what decoding it takes at its peak in bytes, an opened
    input (or bytes) to a model input (whose length is its batch cost), a batch of them as
    arrays, and fixed probes for warm-up and fidelity; `cost`: what one input costs, as
    estimated before it is fetched (admission)."""

    cost: int

    def open(self, data: bytes, index: int, limits: LimitsSpec) -> tuple[Any, int]: ...

    def prepare(self, data: Any, index: int) -> Any: ...

    def collate(self, items: Sequence[Any], rows: int | None = None) -> ModelInputs: ...

    def probes(self) -> list[Any]: ...
