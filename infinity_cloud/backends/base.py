"""The one protocol every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from infinity_cloud.config import ModelSpec
from infinity_cloud.model_files import ModelInfo
from infinity_cloud.tokenization import Encoded


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """A padded batch: (batch, length) int64 arrays, padding on the right."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

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
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        return cls(ids, mask, types)

    def feed(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """The arrays a graph declares as inputs, by their conventional names."""
        arrays = {
            "input_ids": self.input_ids, "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }
        return {name: arrays[name] for name in names}


class Backend(ABC):
    """Loads a model's weights and runs batches through them.

    `forward` returns, for an embedding model, the token states (batch, length, width);
    for a sequence-classification model, the logits (batch, labels). Pooling, heads,
    normalisation and scoring are the engine's shared code, never a backend's.
    """

    name: ClassVar[str]

    def __init__(self, info: ModelInfo, spec: ModelSpec) -> None:
        self.info = info
        self.spec = spec
        self.device = "cpu"
        self.dtype = "float32"
        # Worst cosine to float32 on the fidelity probes, measured for reduced precisions.
        self.agreement: float | None = None

    @abstractmethod
    def forward(self, inputs: ModelInputs) -> np.ndarray: ...

    def submit(self, inputs: ModelInputs) -> Callable[[], np.ndarray]:
        """Start a batch and return a function that waits for its output.

        Backends that run asynchronously override this so the next batch is started while
        the last one still runs (no idle cores between batches); by default it is `forward`.
        """
        output = self.forward(inputs)
        return lambda: output

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (device memory, sessions)."""
