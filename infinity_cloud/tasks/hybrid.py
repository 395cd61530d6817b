"""Several outputs of one pass: a model whose graph gives a dense, a sparse and a multi-vector
output at once (bge-m3's, `numerics/hybrid.py`) answers any of them from the same batch rows,
so a request for all three runs the model once. Its rows are its text tower's (the embed
task's head and rows: `EmbedTask`), so the cache and the batch queue are the model's one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from infinity_cloud.admission.validation import check_no_token_ids, check_texts
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import ModelInfo, Tower
from infinity_cloud.core.results import HybridEmbeddingResult
from infinity_cloud.numerics import hybrid
from infinity_cloud.numerics.pooling import l2_normalize, truncate_dimensions
from infinity_cloud.tasks.base import Cost, text_cost
from infinity_cloud.tasks.embed import EmbedTask, prompted
from infinity_cloud.tasks.sparse import SPARSE_TERMS

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served

# The outputs besides dense vectors a request may ask such a model for, by their wire names.
OUTPUTS = ("sparse", "multi_vector")


def makes_several(info: ModelInfo) -> bool:
    """Whether the model's text graph gives several outputs in one pass (bge-m3)."""
    graph = info.towers.get("text")
    return graph is not None and info.family.graph(graph).returns == "hybrid"


@dataclass(frozen=True)
class HybridCall:
    inputs: Sequence[str]
    outputs: tuple[str, ...]  # "dense", "sparse", "multi_vector": those asked
    truncate: bool = True
    prompt_name: str | None = None
    dimensions: int | None = None  # the dense vectors' Matryoshka cut


class HybridEmbedTask(EmbedTask):
    """Each asked output of texts, from one run of the model's rows."""

    def check(self, call: HybridCall, served: Served, limits: LimitsSpec) -> None:  # type: ignore[override]
        info = served.loaded.info  # not ready: a 503 here
        if not makes_several(info):
            raise UnsupportedError(
                f"model {served.name!r} makes one kind of embedding; {' and '.join(OUTPUTS)} beside dense "
                "vectors in one request need a model with all three (bge-m3)", param="embedding_types",
            )
        check_no_token_ids(call.inputs, "sparse and multi-vector embeddings")
        check_texts(call.inputs, limits)

    def cost(self, call: HybridCall, served: Served) -> Cost:  # type: ignore[override]
        cost = text_cost(call.inputs, served.loaded.tokenizer.max_length)
        width = served.loaded.info.hidden_size
        numbers = len(call.inputs) * width * ("dense" in call.outputs)
        numbers += len(call.inputs) * 2 * SPARSE_TERMS * ("sparse" in call.outputs)
        numbers += cost.tokens * width * ("multi_vector" in call.outputs)
        return cost.answering(numbers, items=len(call.inputs))

    def media(self, call: HybridCall, served: Served) -> Sequence[str]:  # type: ignore[override]
        return ()

    def tower(self, call: HybridCall) -> Tower:  # type: ignore[override]
        return "text"

    def encode(self, call: HybridCall, served: Served, limits: LimitsSpec) -> list[Any]:  # type: ignore[override]
        texts = prompted(served, call.inputs, call.prompt_name)
        return served.loaded.encoders["text"].encode(texts, call.truncate)

    def finish(  # type: ignore[override]
        self, rows: list[np.ndarray], call: HybridCall, served: Served, encodings: list[Any]
    ) -> HybridEmbeddingResult:
        dense = sparse = multi_vector = None
        if "dense" in call.outputs:
            dense = truncate_dimensions(np.stack([hybrid.dense(row) for row in rows]), call.dimensions,
                                        renormalize=False)
            dense = l2_normalize(dense) if served.loaded.normalize else dense
        if "sparse" in call.outputs:
            unused = served.loaded.encoders["text"].unused
            sparse = [hybrid.sparse(row, item.ids, unused) for row, item in zip(rows, encodings, strict=True)]
        if "multi_vector" in call.outputs:
            multi_vector = [hybrid.multi_vector(row) for row in rows]
        tokens = sum(len(item) for item in encodings)
        return HybridEmbeddingResult(served.name, dense, sparse, multi_vector, tokens)


HYBRID = HybridEmbedTask()
