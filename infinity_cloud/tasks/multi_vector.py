"""Multi-vector embedding: a query's or a document's tokens (ColBERT), or a page image's
(ColPali), each to a vector, for late-interaction scoring (`scores.maxsim`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from infinity_cloud.admission.validation import check_media, check_no_token_ids, check_texts
from infinity_cloud.capability import Capability
from infinity_cloud.config import LimitsSpec
from infinity_cloud.errors import UnsupportedError
from infinity_cloud.family import GraphOutput, ModelInfo, Tower
from infinity_cloud.numerics.heads import FINAL, Head
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.results import MultiVectorResult
from infinity_cloud.tasks.base import Cost, Task, inputs_cost, prompt_tokens, require_tower
from infinity_cloud.tasks.embed import prompted

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served


Role = Literal["query", "document"]


@dataclass(frozen=True)
class MultiVectorCall:
    inputs: Sequence[str]  # texts, or image URLs / data URIs (pages)
    modality: Tower = "text"
    truncate: bool = True
    # How a text is read: a ColBERT query is expanded, a document loses its punctuation. None:
    # ColPali's texts are queries (its documents are images), ColBERT's documents (as
    # sentence-transformers' `encode`).
    role: Role | None = None


def templated(info: ModelInfo, name: str, texts: Sequence[str]) -> list[str]:
    """Each text inside the model's template `name` ("{}" marks the text); as is without one."""
    template = info.templates.get(name)
    return list(texts) if template is None else [template.replace("{}", text) for text in texts]


class MultiVectorTask(Task[MultiVectorCall, MultiVectorResult]):
    capability = Capability.MULTI_VECTOR

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        if info.family.graph(graph).returns == "token_states":  # ColBERT: states through Dense, Normalize
            return Head("tokens", dense=info.dense, normalize=normalize)
        return FINAL  # ColPali's graph normalises each token and zeroes the padding

    def rows(self, batch: np.ndarray, items: Sequence[Any]) -> list[np.ndarray]:
        """Each input's vectors, one per position it holds (padding dropped)."""
        return [np.ascontiguousarray(row[: len(item)]) for row, item in zip(batch, items, strict=True)]

    def check(self, call: MultiVectorCall, served: Served, limits: LimitsSpec) -> None:
        require_tower(served, self.capability, call.modality)
        if call.modality == "text":
            check_no_token_ids(call.inputs, "multi-vector embeddings")  # the [Q]/[D] prompts are text
            check_texts(call.inputs, limits)
        else:
            check_media(call.inputs, limits)

    def cost(self, call: MultiVectorCall, served: Served) -> Cost:
        cost = inputs_cost(call.inputs, call.modality, served)  # answered: a vector per token or patch
        return cost.answering(cost.tokens * (served.loaded.info.dimensions or 0), items=len(call.inputs))

    def media(self, call: MultiVectorCall) -> Sequence[str]:
        return () if call.modality == "text" else call.inputs

    def tower(self, call: MultiVectorCall) -> Tower:
        return call.modality

    def encode(
        self, call: MultiVectorCall, served: Served, limits: LimitsSpec
    ) -> list[Any]:
        loaded = served.loaded
        if loaded.info.late_interaction is not None:
            return self._colbert(call, served)
        texts = templated(loaded.info, "query", call.inputs)
        own_specials = "query" not in loaded.info.templates  # a template writes them itself
        return loaded.tokenizer.encode(texts, call.truncate, special_tokens=own_specials)

    @staticmethod
    def _colbert(call: MultiVectorCall, served: Served) -> list[Encoded]:
        """sentence-transformers' MultiVectorEncoder: the role's prompt ("[Q] ", "[D] ") and
        length limit; queries expanded with the expansion token to `expansion_length`."""
        loaded = served.loaded
        rules, tokenizer = loaded.info.late_interaction, loaded.tokenizer
        assert rules is not None
        role = call.role or "document"
        expand = role == "query" and rules.expansion is not None
        limit = rules.query_length if role == "query" else rules.document_length
        if expand and rules.expansion == "fixed":
            limit = rules.expansion_length  # the floor and the ceiling
        texts = prompted(served, call.inputs, role if role in loaded.info.prompts else None)
        encoded = tokenizer.encode(texts, call.truncate, max_length=limit)
        if not expand:
            return encoded
        token = rules.expansion_token or "[MASK]"
        token_id = tokenizer.token_id(token)
        if token_id is None:
            raise UnsupportedError(
                f"model {served.name!r}: its query expansion token {token!r} is not in its vocabulary"
            )
        out = []
        for item in encoded:
            missing = max(0, rules.expansion_length - len(item))
            out.append(Encoded(
                [*item.ids, *[token_id] * missing], [*item.type_ids, *[0] * missing],
                attended=None if rules.attend_expansion else len(item),
            ))
        return out

    def finish(
        self, rows: list[np.ndarray], call: MultiVectorCall, served: Served, encodings: list[Any]
    ) -> MultiVectorResult:
        rules = served.loaded.info.late_interaction
        role = call.role or "document"
        if rules is not None and rules.skiplist and role in rules.skiplist_roles and call.modality == "text":
            # Punctuation (or whatever the model lists) is not matched on: its vectors go.
            skip = {i for i in map(served.loaded.tokenizer.token_id, rules.skiplist) if i is not None}
            rows = [row[[i not in skip for i in item.ids]] for row, item in zip(rows, encodings, strict=True)]
        return MultiVectorResult(served.name, rows, prompt_tokens(encodings))
