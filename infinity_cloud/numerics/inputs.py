"""What a model takes in: one input as the model will see it (`Encoded`, its token ids), a
batch of them as named arrays (`ModelInputs`), the types the tokenizers, media, tasks and
backends share; and how a tower's inputs become them (`InputEncoder`), which its family says."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from infinity_cloud.core.config import LimitsSpec


@dataclass(eq=False, slots=True)
class Encoded:
    """One input as the model will see it."""

    ids: list[int]
    type_ids: list[int]
    # The encoder attends to the first `attended` positions only (None: all). ColBERT's query
    # expansion appends tokens the encoder does not attend to but whose vectors are scored.
    attended: int | None = None

    def __len__(self) -> int:
        return len(self.ids)


# Every array a graph may take, by its conventional name.
INPUT_NAMES = (
    "input_ids", "attention_mask", "token_type_ids", "pixel_values", "input_features", "image_grid_thw",
)


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """A batch as named arrays: for text, padded (batch, length) int64 token arrays (padding
    on the right); for images, (batch, channels, height, width) float32 `pixel_values`."""

    arrays: dict[str, np.ndarray]
    # Positions holding input per row, where some are not attended to (ColBERT's query
    # expansion); None: the attention mask says.
    lengths: np.ndarray | None = None

    @property
    def input_ids(self) -> np.ndarray:
        return self.arrays["input_ids"]

    @property
    def attention_mask(self) -> np.ndarray | None:
        """None for inputs without positions to mask (images)."""
        return self.arrays.get("attention_mask")

    @property
    def token_type_ids(self) -> np.ndarray:
        return self.arrays["token_type_ids"]

    @property
    def rows(self) -> int:
        return len(next(iter(self.arrays.values())))

    @classmethod
    def stack(cls, name: str, items: Sequence[np.ndarray], rows: int | None = None) -> ModelInputs:
        """Equal-shaped inputs (preprocessed images) as one array; filler rows repeat the first."""
        filled = [*items, *[items[0]] * (max(rows or 0, len(items)) - len(items))]
        return cls({name: np.stack(filled)})

    @classmethod
    def collate(
        cls, encodings: Sequence[Encoded], pad_id: int, length: int | None = None, rows: int | None = None
    ) -> ModelInputs:
        """Pad to the longest input, or to `length` x `rows` for static shapes.

        Filler rows repeat the first input rather than being all padding: a row with no
        attended token can turn attention into NaNs on some kernels. Callers drop them.
        """
        width = length or max(len(e) for e in encodings)
        count = max(rows or 0, len(encodings))
        ids = np.full((count, width), pad_id, dtype=np.int64)
        mask = np.zeros((count, width), dtype=np.int64)
        types = np.zeros((count, width), dtype=np.int64)
        filled = [*encodings, *[encodings[0]] * (count - len(encodings))]
        for row, enc in enumerate(filled):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, : enc.attended if enc.attended is not None else n] = 1
            types[row, :n] = enc.type_ids
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        if all(e.attended is None for e in filled):
            return cls(arrays)
        return cls(arrays, np.array([len(e.ids) for e in filled], dtype=np.int64))

    def feed(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """The arrays a graph declares as inputs, by their conventional names, in that order."""
        return {name: self.arrays[name] for name in names}


class InputEncoder(Protocol):
    """How the inputs of a tower that reads something other than text (images, audio, pages,
    or a kind a family defines itself) become model inputs. Its family gives one per tower
    (`ModelFamily.encoders`; a text tower's is `text.input_encoder.TextInputEncoder`); the
    engine, the tasks and the served model call it without knowing which kind it is.

    `fetched`: its inputs are URLs or data URIs, which the engine fetches; each is then opened
    (`open`: its size checked against `limits`, with what decoding it takes at its peak, in
    bytes) and prepared (`prepare`) in the decoding pool. Otherwise the inputs are encoded
    (`encode`) in the tokenizer pool. A model input's length is its batch cost; `cost` is what
    one input costs, as estimated before it is read (admission); `probes` are fixed inputs
    for warm-up and fidelity checks."""

    kind: str  # what its inputs are, for messages: "image", "audio", "page", ...
    fetched: bool
    cost: int

    def check(self, inputs: Sequence[Any], limits: LimitsSpec) -> None: ...

    def encode(self, inputs: Sequence[Any], truncate: bool = True) -> list[Any]: ...

    def open(self, data: bytes, index: int, limits: LimitsSpec) -> tuple[Any, int]: ...

    def prepare(self, data: Any, index: int) -> Any: ...

    def collate(self, items: Sequence[Any], rows: int | None = None) -> ModelInputs: ...

    def probes(self) -> list[Any]: ...
