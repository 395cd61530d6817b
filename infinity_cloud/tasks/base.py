"""A capability as a task: what it checks of a call, which media it needs fetched, how the
call's inputs become model inputs and for which tower, the per-batch head, and how the batch
rows become the caller's result.

The engine runs every task the same way (check on the event loop, fetch and decode media in
their pool or encode text in the tokenizer pool, batch, finish), so a new capability is a new
task here, a registry entry and its routes, and nothing in the backends or the batcher.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import LimitsSpec, ModelSpec
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import GraphOutput, ModelInfo, Tower
from infinity_cloud.numerics.fidelity import PROBES, TRUNCATED_PROBE_TOKENS, Check, truncated_probe
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.text.tokenization import TextTokenizer


class LoadedModel(Protocol):
    """What a task reads of a loaded model (`served_model._Loaded`)."""

    info: ModelInfo
    tokenizer: TextTokenizer
    normalize: bool
    towers: Mapping[Tower, Any]
    # Each tower's input encoder (`ModelFamily.encoders`): a text tower's reads texts; any
    # other's is a `numerics.inputs.InputEncoder`, whatever its inputs are.
    encoders: Mapping[Tower, Any]


class Served(Protocol):
    """What a task reads of the model that serves it (`served_model.Served`, which
    imports the tasks: named here, the tasks import nothing above them)."""

    name: str
    spec: ModelSpec

    @property
    def loaded(self) -> LoadedModel: ...

    def require(self, capability: Capability) -> LoadedModel: ...

Call = TypeVar("Call")
Result = TypeVar("Result")

# What a call holds in memory while it is served, per unit, as measured on MiniLM with 16 MB
# requests (benchmarks/overload.py): each character of text four times (the body, the parsed
# string, its cut copy, the tokenizer's copy); each token as ids in Python lists and the
# tokenizer's intermediates; each number of the answer as a numpy float, a Python float and
# JSON; each media item its fetched bytes and decoded array (a data URI: its text, four times).
MEMORY_PER_CHAR = 4
MEMORY_PER_TOKEN = 160
MEMORY_PER_NUMBER = 48
# The most one number of an answer takes on the wire: as JSON, float32's shortest form with a
# sign, zeros and its comma ("-0.000012345679,": 16; 17 at most); packed (base64 of float32,
# int8, binary), 4/3 of 4 bytes.
JSON_BYTES_PER_NUMBER = 17
PACKED_BYTES_PER_NUMBER = 6
# What an answer's entry adds around its numbers ({"object":"embedding","index":2047,...}).
ANSWER_ITEM_BYTES = 96
MEMORY_PER_MEDIA = 4 * 2**20
# A text listed token by token (/tokenize): never cut, at three characters a token (dense
# text; English is about four); each token its encoding, a Token, the answer's dict and its
# JSON: 750 bytes, measured on MiniLM with 8 texts of 200,000 characters (69 of them JSON).
CHARS_PER_LISTED_TOKEN = 3
MEMORY_PER_LISTED_TOKEN = 750


@dataclass(frozen=True, slots=True)
class Cost:
    """A call as estimated before any work, for admission: the tokens it adds to its tower's
    batches, and the bytes of memory it holds while served."""

    tokens: int
    memory: int
    answer_bytes: int = 0  # at most, on the wire
    inputs: int = 0  # how many (for messages)

    def answering(self, numbers: int, wire_bytes: int = JSON_BYTES_PER_NUMBER, items: int = 0) -> Cost:
        """With an answer of `numbers` floats in `items` entries, each number at most
        `wire_bytes` on the wire."""
        return Cost(self.tokens, self.memory + numbers * MEMORY_PER_NUMBER,
                    self.answer_bytes + numbers * wire_bytes + items * ANSWER_ITEM_BYTES, self.inputs)


class Task(ABC, Generic[Call, Result]):
    capability: ClassVar[Capability]
    # How a reduced precision's outputs are judged against float32's (`numerics.fidelity`).
    fidelity: ClassVar[Check] = "cosine"
    # Whether its rows go through the result cache (not a window's token states: large, and
    # keyed as the same text's pooled row would be).
    cached: ClassVar[bool] = True

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

    def fidelity_probes(self, tokenizer: TextTokenizer) -> list[Encoded]:
        """What a reduced precision is checked on: the fixed probes; a scorer's also one cut at
        the model's limit (at most TRUNCATED_PROBE_TOKENS), where a precision's error grew most
        on a BERT cross-encoder."""
        if self.fidelity == "cosine":
            return self.encode_probes(tokenizer, PROBES)
        limit = min(tokenizer.max_length, TRUNCATED_PROBE_TOKENS)
        text = truncated_probe(limit)
        if limit < tokenizer.max_length:  # a longer limit: cut to TRUNCATED_PROBE_TOKENS instead
            (text,) = tokenizer.cut([text], limit)
        return self.encode_probes(tokenizer, (*PROBES, text))

    def check(self, call: Call, served: Served, limits: LimitsSpec) -> None:
        """Cheap checks on the event loop, before any work is queued."""
        served.require(self.capability)

    def cost(self, call: Call, served: Served) -> Cost:
        """The call as estimated before any work (admission): texts at about four characters
        a token, capped at the model's limit; media at their tower's cost; and its memory."""
        return Cost(0, 0)

    def media(self, call: Call, served: Served) -> Sequence[str]:
        """URLs (and data URIs) the engine fetches and its tower's encoder then opens and
        prepares, instead of `encode`; none for text."""
        return ()

    def tower(self, call: Call) -> Tower:
        """Which of the model's towers the call's inputs go through."""
        return "text"

    @abstractmethod
    def encode(
        self, call: Call, served: Served, limits: LimitsSpec
    ) -> list[Any]:
        """The call's inputs as model inputs, each with a length (its batch cost); runs in the
        tokenizer pool. (A call with `media` has them decoded by its tower's encoder instead,
        in the decoding pool.)"""

    @abstractmethod
    def finish(self, rows: list[Any], call: Call, served: Served, encodings: list[Any]) -> Result:
        """The rows of this call (in input order) as the caller's result."""


def require_tower(served: Served, capability: Capability, modality: Tower) -> None:
    """The model does `capability` and reads `modality` (a 400 naming what it reads otherwise)."""
    towers = served.require(capability).towers
    if modality not in towers:
        raise UnsupportedError(
            f"model {served.name!r} reads {' and '.join(towers)}; modality {modality!r} is not "
            "supported by it",
            param="modality",
        )


def check_inputs(inputs: Sequence[Any], modality: Tower, served: Served, limits: LimitsSpec) -> None:
    """The inputs of a tower other than text, as its encoder checks them (media: URLs or data
    URIs, not too many)."""
    served.loaded.encoders[modality].check(inputs, limits)


def fetched_inputs(inputs: Sequence[Any], modality: Tower, served: Served) -> Sequence[Any]:
    """The inputs the engine fetches: those of a tower whose encoder reads fetched media."""
    return inputs if served.loaded.encoders[modality].fetched else ()


def text_cost(texts: Sequence[str], limit: int) -> Cost:
    """A list of texts, estimated from their length (no tokenizing)."""
    return length_cost([len(text) for text in texts], limit)


def length_cost(lengths: Sequence[int], limit: int) -> Cost:
    """Texts of these lengths in characters: about four characters a token, up to `limit`."""
    tokens = sum(min(length // 4 + 2, limit) for length in lengths)
    return Cost(tokens, sum(lengths) * MEMORY_PER_CHAR + tokens * MEMORY_PER_TOKEN, inputs=len(lengths))


def listed_tokens_cost(texts: Sequence[str]) -> Cost:
    """Texts tokenized whole and answered token by token, estimated from their length."""
    chars = sum(len(text) for text in texts)
    tokens = chars // CHARS_PER_LISTED_TOKEN + 2 * len(texts)
    return Cost(tokens, chars * MEMORY_PER_CHAR + tokens * MEMORY_PER_LISTED_TOKEN, inputs=len(texts))


def decoded_ids_cost(ids: Sequence[Sequence[int]]) -> Cost:
    """Token ids decoded back to text: each id a Python int in the parsed body, and a token
    of text (a few characters, each held as the answer's string and its JSON)."""
    count = sum(len(row) for row in ids)
    return Cost(count, count * (MEMORY_PER_NUMBER + 8 * MEMORY_PER_CHAR), inputs=len(ids))


def inputs_cost(inputs: Sequence[Any], modality: Tower, served: Served) -> Cost:
    """Texts, token-id lists, or inputs of another tower (media: URLs, data URIs), estimated;
    those at what their tower's encoder says one costs."""
    loaded = served.loaded
    if modality != "text":
        held = sum(len(item) * MEMORY_PER_CHAR + MEMORY_PER_MEDIA for item in inputs)
        return Cost(len(inputs) * loaded.encoders[modality].cost, held, inputs=len(inputs))
    limit = loaded.tokenizer.max_length
    if inputs and not isinstance(inputs[0], str):
        tokens = sum(min(len(ids) + 2, limit) for ids in inputs)
        given = sum(len(ids) for ids in inputs)  # each id a Python int in the parsed body
        return Cost(tokens, given * MEMORY_PER_NUMBER + tokens * MEMORY_PER_TOKEN, inputs=len(inputs))
    return text_cost(inputs, limit)


def prompt_tokens(encodings: Sequence[Any]) -> int:
    """The tokens the model read: text tokens, or an image's patches."""
    return sum(len(e) for e in encodings)
