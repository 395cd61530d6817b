"""Late interaction, a multi-vector model's policy: what an embeddings request may ask of its
matrices (never truncated nor quantised; its texts read through its own query/document
templates, the role their use means), and a rerank answered by MaxSim of the query's matrix
against each document's."""

from __future__ import annotations

from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.results import MultiVectorResult, RankedDocument, RerankResult
from infinity_cloud.tasks.multi_vector import ROLE_FOR_USE, Role
from infinity_cloud.tasks.scores import maxsim, rank


def role_asked(dimensions: int | None, dtype: object, prompt_name: str | None, use: str | None
               ) -> Role | None:
    """The role texts of `use` are read in; a 400 for what a multi-vector model does not do."""
    if dimensions:
        raise UnsupportedError("multi-vector embeddings are not truncated; omit 'dimensions'",
                               param="dimensions")
    if dtype not in (None, "float32"):
        raise UnsupportedError("multi-vector embeddings are float32; omit the embedding type",
                               param="embedding_types")
    if prompt_name:
        raise UnsupportedError("a multi-vector model reads texts through its own query/document "
                               "templates; omit 'prompt_name'", param="prompt_name")
    return ROLE_FOR_USE.get(use or "")


def ranked(model: str, query: MultiVectorResult, documents: MultiVectorResult, top_n: int | None
           ) -> RerankResult:
    """The documents by their MaxSim with the query (sums, not probabilities), best first."""
    scores = maxsim(query.embeddings[0], documents.embeddings)
    results = [RankedDocument(i, float(scores[i])) for i in rank(scores, top_n)]
    return RerankResult(model, results, query.prompt_tokens + documents.prompt_tokens)


__all__ = ["ranked", "role_asked"]
