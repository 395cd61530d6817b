"""The one protocol every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
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
    def collate(cls, encodings: Sequence[Encoded], pad_id: int, length: int | None = None) -> ModelInputs:
        """Pad to the longest input, or to `length` for backends with static shapes."""
        width = length or max(len(e) for e in encodings)
        ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        return cls(ids, mask, types)


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

    @abstractmethod
    def forward(self, inputs: ModelInputs) -> np.ndarray: ...

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (device memory, sessions)."""
