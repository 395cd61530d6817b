"""Embedding: texts (behind a model's named prompt) or token ids, to vectors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from infinity_cloud.admission.validation import (
    check_dimensions,
    check_texts,
    check_token_ids,
    is_token_ids,
)
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError, UnsupportedError
from infinity_cloud.core.family import GraphOutput, ModelInfo, Tower
from infinity_cloud.core.results import EmbeddingResult
from infinity_cloud.numerics import hybrid
from infinity_cloud.numerics.heads import FINAL, Head
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.numerics.pooling import l2_normalize, truncate_dimensions
from infinity_cloud.tasks.base import (
    JSON_BYTES_PER_NUMBER,
    PACKED_BYTES_PER_NUMBER,
    Cost,
    Task,
    check_inputs,
    fetched_inputs,
    inputs_cost,
    prompt_tokens,
    require_tower,
)
from infinity_cloud.text import openai_tokens

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served

Modality = Tower


@dataclass(frozen=True)
class EmbedCall:
    inputs: Sequence[str] | Sequence[Sequence[int]]
    dimensions: int | None = None
    truncate: bool = True
    modality: Modality = "text"
    # From an OpenAI SDK client: its token ids are cl100k_base's whatever the model reads.
    openai_sender: bool = False
    prompt_name: str | None = None
    # The answer goes out packed (base64, int8, binary): fewer bytes a number on the wire.
    packed: bool = False
    # False: the vectors before the model's Normalize module (TEI's normalize=false).
    normalize: bool = True


# What a caller says its texts are for (Cohere's and Voyage's input_type), and the
# sentence-transformers prompt names that mean the same, in order of preference.
PROMPTS_FOR_USE = {
    "search_query": ("query", "search_query"),
    "query": ("query", "search_query"),
    "search_document": ("document", "passage", "search_document"),
    "document": ("document", "passage", "search_document"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def prompt_for_use(use: str | None, declared: Mapping[str, str]) -> str | None:
    """The model's prompt for texts used as `use` (e5's "query: ", ...); None: the model
    declares none for it, and its texts are read as they are, as sentence-transformers would."""
    return next((name for name in PROMPTS_FOR_USE.get(use or "", ()) if name in declared), None)


def prompted(served: Served, texts: Sequence[str], name: str | None) -> list[str]:
    """The texts behind the model's prompt `name` (none: as they are)."""
    if name is None:
        return list(texts)
    prompts = served.loaded.info.prompts
    if name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise InvalidInputError(
            f"model {served.name!r} has no prompt named {name!r} (its prompts: {known})",
            param="prompt_name",
        )
    return [prompts[name] + text for text in texts]


def dense_vectors(rows: Sequence[np.ndarray]) -> np.ndarray:
    """The dense vectors of a tower's rows: as they are, or a hybrid graph's dense output."""
    return np.stack([hybrid.dense(row) if row.ndim == 2 else row for row in rows])


class EmbedTask(Task[EmbedCall, EmbeddingResult]):
    capability = Capability.EMBED

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        # Rows (and cached rows) are the vectors before the model's Normalize module: `finish`
        # normalises per call, since a call may ask for them as they are (TEI's normalize=false).
        returns = info.family.graph(graph).returns
        if returns == "token_states":
            return Head("pool", pooling, info.dense)
        if returns == "hybrid":  # bge-m3's three outputs, final per position (`numerics/hybrid.py`)
            return FINAL
        return Head("vectors")  # pooled inside the graph (CLIP's towers)

    def rows(self, batch: np.ndarray, items: Sequence[Any]) -> Sequence[Any]:
        if batch.ndim == 3:  # a hybrid graph's: each input's own positions, all three outputs in them
            return [np.ascontiguousarray(row[: len(item)]) for row, item in zip(batch, items, strict=True)]
        return batch

    def check(self, call: EmbedCall, served: Served, limits: LimitsSpec) -> None:
        if served.loaded.info.capability is Capability.SPARSE:
            raise UnsupportedError(
                f"model {served.name!r} gives sparse embeddings (SPLADE): send encoding_format "
                "'sparse' to /embeddings or use /embed_sparse (Python: Engine.embed_sparse)",
                param="encoding_format",
            )
        require_tower(served, self.capability, call.modality)
        check_dimensions(call.dimensions, served.loaded.info.dimensions)
        if call.modality != "text":
            check_inputs(call.inputs, call.modality, served, limits)
        elif is_token_ids(call.inputs):
            check_token_ids(call.inputs, limits)  # type: ignore[arg-type]
        else:
            check_texts(call.inputs, limits)  # type: ignore[arg-type]

    def cost(self, call: EmbedCall, served: Served) -> Cost:
        width = call.dimensions or served.loaded.info.dimensions or 0
        wire = PACKED_BYTES_PER_NUMBER if call.packed else JSON_BYTES_PER_NUMBER
        n = len(call.inputs)
        return inputs_cost(call.inputs, call.modality, served).answering(n * width, wire, items=n)

    def media(self, call: EmbedCall, served: Served) -> Sequence[str]:
        return fetched_inputs(call.inputs, call.modality, served)

    def tower(self, call: EmbedCall) -> Tower:
        return call.modality

    def encode(
        self, call: EmbedCall, served: Served, limits: LimitsSpec
    ) -> list[Any]:
        if call.modality != "text":  # a tower's own kind of input, which its encoder reads
            return served.loaded.encoders[call.modality].encode(call.inputs, call.truncate)
        if is_token_ids(call.inputs):
            return self._token_ids(call, served, limits)
        texts = prompted(served, call.inputs, call.prompt_name)  # type: ignore[arg-type]
        return served.loaded.encoders["text"].encode(texts, call.truncate)

    @staticmethod
    def _token_ids(call: EmbedCall, served: Served, limits: LimitsSpec) -> list[Encoded]:
        """Token ids read as the model's spec says (`ModelSpec.token_ids`)."""
        ids: Sequence[Sequence[int]] = call.inputs  # type: ignore[assignment]
        tokenizer, meaning = served.loaded.tokenizer, served.spec.token_ids
        if meaning == "refuse":
            raise InvalidInputError(
                f"model {served.name!r} takes text, not token ids (it is served with --token-ids refuse)",
                param="input",
            )
        if meaning == "model":
            if call.openai_sender:  # its ids are cl100k_base's: read as ours they would be other text
                raise InvalidInputError(
                    f"token ids from an OpenAI SDK client are OpenAI's cl100k_base ids, but model "
                    f"{served.name!r} reads ids as its own vocabulary (--token-ids model); send text "
                    "(langchain-openai: check_embedding_ctx_length=False) or serve it with "
                    "--token-ids openai",
                    param="input",
                )
            return tokenizer.from_token_ids(ids, call.truncate)
        texts = openai_tokens.decode(ids)
        check_texts(texts, limits)
        return tokenizer.encode(texts, call.truncate)

    def finish(
        self, rows: list[np.ndarray], call: EmbedCall, served: Served, encodings: list[Any]
    ) -> EmbeddingResult:
        vectors = truncate_dimensions(dense_vectors(rows), call.dimensions, renormalize=False)
        if served.loaded.normalize and call.normalize:  # the Normalize module, after any Matryoshka cut
            vectors = l2_normalize(vectors)
        return EmbeddingResult(served.name, vectors, prompt_tokens(encodings))
