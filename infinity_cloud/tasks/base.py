"""A capability as a task: what it checks of a call, which media it needs fetched, how the
call's inputs become model inputs and for which tower, the per-batch head, and how the batch
rows become the caller's result.

The engine runs every task the same way (check on the event loop, fetch media, encode in the
tokenizer pool, batch, finish), so a new capability is a new task here, a registry entry and
its routes, and nothing in the backends or the batcher.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from infinity_cloud.capability import Capability
from infinity_cloud.config import LimitsSpec
from infinity_cloud.errors import UnsupportedError
from infinity_cloud.model_files import GraphOutput, ModelInfo, Tower
from infinity_cloud.tasks.heads import Head
from infinity_cloud.tokenization import Encoded, TextTokenizer

if TYPE_CHECKING:  # the served model holds its task's head: only a type here
    from infinity_cloud.served_model import ServedModel

Call = TypeVar("Call")
Result = TypeVar("Result")


class Task(ABC, Generic[Call, Result]):
    capability: ClassVar[Capability]

    @abstractmethod
    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        """Backend output and attention mask of a batch -> the batch's rows, one per input."""

    def rows(self, batch: np.ndarray, items: Sequence[Any]) -> Sequence[Any]:
        """A head's batch output as the per-input rows the batcher hands back (`items`: the
        batch's model inputs, in its order)."""
        return batch

    def encode_probes(self, tokenizer: TextTokenizer, texts: Sequence[str]) -> list[Encoded]:
        """Fixed texts as this task's inputs (warm-up, precision checks)."""
        return tokenizer.encode(texts)

    def check(self, call: Call, served: ServedModel, limits: LimitsSpec) -> None:
        """Cheap checks on the event loop, before any work is queued."""
        served.require(self.capability)

    def cost(self, call: Call, served: ServedModel) -> int:
        """The call's tokens as estimated before any work (admission): texts at about four
        characters a token, capped at the model's limit; media at their tower's cost."""
        return 0

    def media(self, call: Call) -> Sequence[str]:
        """URLs (and data URIs) the engine fetches before `encode`; none for text."""
        return ()

    def tower(self, call: Call) -> Tower:
        """Which of the model's towers the call's inputs go through."""
        return "text"

    @abstractmethod
    def encode(
        self, call: Call, served: ServedModel, limits: LimitsSpec, media: Sequence[bytes]
    ) -> list[Any]:
        """The call's inputs (with the bytes of its `media`) as model inputs, each with a
        length (its batch cost); runs in the tokenizer pool."""

    @abstractmethod
    def finish(self, rows: list[Any], call: Call, served: ServedModel, encodings: list[Any]) -> Result:
        """The rows of this call (in input order) as the caller's result."""


def require_tower(served: ServedModel, capability: Capability, modality: Tower) -> None:
    """The model does `capability` and reads `modality` (a 400 naming what it reads otherwise)."""
    towers = served.require(capability).towers
    if modality not in towers:
        raise UnsupportedError(
            f"model {served.name!r} reads {' and '.join(towers)}; modality {modality!r} is not "
            "supported by it",
            param="modality",
        )


def text_cost(texts: Sequence[str], limit: int) -> int:
    """Tokens a list of texts will take, estimated from their length (no tokenizing)."""
    return sum(min(len(text) // 4 + 2, limit) for text in texts)


def inputs_cost(inputs: Sequence[Any], modality: Tower, served: ServedModel) -> int:
    """Texts, token-id lists or media inputs, estimated."""
    loaded = served.loaded
    if modality != "text":
        return len(inputs) * loaded.media[modality].cost
    limit = loaded.tokenizer.max_length
    if inputs and not isinstance(inputs[0], str):
        return sum(min(len(ids) + 2, limit) for ids in inputs)
    return text_cost(inputs, limit)


def prompt_tokens(encodings: Sequence[Any]) -> int:
    """The tokens the model read: text tokens, or an image's patches."""
    return sum(len(e) for e in encodings)
