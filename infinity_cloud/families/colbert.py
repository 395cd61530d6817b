"""ColBERT-style late interaction (sentence-transformers' MultiVectorEncoder): an encoder's
token states through Dense and Normalize token by token, queries expanded, punctuation
dropped from documents (`LateInteraction`, read by its text tower's `LateInteractionText`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families import sentence_transformers
from infinity_cloud.families.base import TOKEN_STATES, Family, TextFacts, TowerEncoders, graphs_of
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.sentence_transformers import LateInteraction
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.text.input_encoder import TextInputEncoder

if TYPE_CHECKING:
    import numpy as np

    from infinity_cloud.text.tokenization import TextTokenizer


class LateInteractionText(TextInputEncoder):
    """sentence-transformers' MultiVectorEncoder: a text behind its role's prompt ("[Q] ",
    "[D] ") and within its role's length limit; queries expanded with the expansion token to
    `expansion_length`; the skiplist's tokens' vectors dropped from the roles it names. A text
    of no role is read as a document, as sentence-transformers' `encode` does."""

    def __init__(self, tokenizer: TextTokenizer, rules: LateInteraction, prompts: Mapping[str, str]) -> None:
        super().__init__(tokenizer)
        self.rules, self.prompts = rules, prompts

    def encode(self, texts: Sequence[str], truncate: bool = True, role: str | None = None) -> list[Encoded]:
        rules, tokenizer = self.rules, self.tokenizer
        role = role or "document"
        expand = role == "query" and rules.expansion is not None
        limit = rules.query_length if role == "query" else rules.document_length
        if expand and rules.expansion == "fixed":
            limit = rules.expansion_length  # the floor and the ceiling
        if role in self.prompts:
            texts = [self.prompts[role] + text for text in texts]
        encoded = tokenizer.encode(texts, truncate, max_length=limit)
        if not expand:
            return encoded
        token = rules.expansion_token or "[MASK]"
        token_id = tokenizer.token_id(token)
        if token_id is None:
            raise UnsupportedError(f"the model's query expansion token {token!r} is not in its vocabulary")
        out = []
        for item in encoded:
            missing = max(0, rules.expansion_length - len(item))
            out.append(Encoded(
                [*item.ids, *[token_id] * missing], [*item.type_ids, *[0] * missing],
                attended=None if rules.attend_expansion else len(item),
            ))
        return out

    def kept(self, rows: list[np.ndarray], encodings: Sequence[Encoded], role: str) -> list[np.ndarray]:
        rules = self.rules
        if not rules.skiplist or role not in rules.skiplist_roles:
            return rows
        # Punctuation (or whatever the model lists) is not matched on: its vectors go.
        skip = {i for i in map(self.tokenizer.token_id, rules.skiplist) if i is not None}
        return [row[[i not in skip for i in item.ids]] for row, item in zip(rows, encodings, strict=True)]


class ColBert(Family):
    name = "colbert"
    graphs = graphs_of(TOKEN_STATES)

    def recognises(self, folder: ModelFolder) -> bool:
        return not folder.reads_media and sentence_transformers.head(folder).late_interaction is not None

    def read(self, folder: ModelFolder) -> ModelInfo:
        head = sentence_transformers.head(folder)
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.MULTI_VECTOR, normalize=head.normalize, dense=head.dense,
            prompts=head.prompts, own_facts=head.late_interaction,
        )

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        return {"text": LateInteractionText(tokenizer, info.facts(LateInteraction), info.prompts)}
