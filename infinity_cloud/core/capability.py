"""What a served model does for a caller. The engine, its tasks and the routes speak of
capabilities; backends never do (they run graphs, see `ModelInfo.towers`)."""

from __future__ import annotations

import enum


class Capability(str, enum.Enum):
    EMBED = "embed"
    RERANK = "rerank"
    CLASSIFY = "classify"
    SPARSE = "sparse"  # SPLADE: one weight per vocabulary term
    MULTI_VECTOR = "multi_vector"  # ColPali: one vector per token, scored by late interaction

    @property
    def noun(self) -> str:
        return {
            "embed": "embedding", "rerank": "reranking", "classify": "classification",
            "sparse": "sparse embedding", "multi_vector": "multi-vector embedding",
        }[self.value]


# The route names a single-entry endpoint takes (SageMaker's /invocations, `infinity-cloud
# invoke --route`), by the capability each serves.
ROUTE_NAMES = {Capability.EMBED: "embeddings", Capability.RERANK: "rerank", Capability.CLASSIFY: "classify"}
