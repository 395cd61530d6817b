"""Images and audio: fetching them for a request (`fetch.py`), turning them into a tower's
inputs (`images.py`, `audio.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from infinity_cloud.backends.base import ModelInputs
from infinity_cloud.config import LimitsSpec
from infinity_cloud.model_files import ModelInfo, Tower
from infinity_cloud.tokenization import TextTokenizer


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


def preprocessors(info: ModelInfo, tokenizer: TextTokenizer) -> dict[Tower, MediaPreprocessor]:
    """The preprocessor of each tower that reads images or audio (imported only then: Pillow,
    soundfile)."""
    media: dict[Tower, MediaPreprocessor] = {}
    if info.model_type == "colqwen2":  # pages of any shape, each behind its own prompt
        from infinity_cloud.media.pages import PagePreprocessor

        def tokenize(text: str) -> list[int]:
            return tokenizer.encode([text], truncate=False, special_tokens=False)[0].ids

        media["image"] = PagePreprocessor(info, tokenize, tokenizer.pad_id)
    elif "image" in info.towers:
        from infinity_cloud.media.images import ImagePreprocessor

        # A model that reads each page behind a prompt (ColPali) gets its ids once, here.
        prompt = info.templates.get("image")
        ids = tokenizer.encode([prompt], truncate=False, special_tokens=False)[0].ids if prompt else None
        media["image"] = ImagePreprocessor.load(info, ids)
    if "audio" in info.towers:
        from infinity_cloud.media.audio import AudioPreprocessor

        media["audio"] = AudioPreprocessor.load(info)
    return media
