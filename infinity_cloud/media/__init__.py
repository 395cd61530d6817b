"""Images and audio: fetching them for a request (`fetch.py`), turning them into a tower's
inputs (`images.py`, `audio.py`, `pages.py`; which a model's towers use, its family says,
`ModelFamily.encoders`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infinity_cloud.admission.validation import check_media
from infinity_cloud.core.config import LimitsSpec


class MediaEncoder:
    """What the input encoders of media towers share (`numerics.inputs.InputEncoder`): their
    inputs are URLs or data URIs, which the engine fetches and they then open and prepare."""

    kind: str
    fetched = True

    def check(self, inputs: Sequence[Any], limits: LimitsSpec) -> None:
        check_media(inputs, limits)

    def encode(self, inputs: Sequence[Any], truncate: bool = True) -> list[Any]:
        raise TypeError(f"{self.kind} inputs are fetched, opened and prepared; none is encoded from a call")
