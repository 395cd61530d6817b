"""A text tower's inputs: texts through the model's tokenizer, as its family reads them. The
family gives it (`ModelFamily.encoders`); families that read texts their own way subclass it
in their module (ColBERT's roles and query expansion, ColPali's query template)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from infinity_cloud.core.errors import UnsupportedError

if TYPE_CHECKING:
    import numpy as np

    from infinity_cloud.numerics.inputs import Encoded
    from infinity_cloud.text.tokenization import TextTokenizer


class TextInputEncoder:
    """`full_length`: every text is padded to the tokenizer's maximum length, which a model
    trained so needs (SigLIP's text tower pools the last position, with no attention mask)."""

    kind = "text"
    fetched = False

    def __init__(self, tokenizer: TextTokenizer, full_length: bool = False) -> None:
        self.tokenizer = tokenizer
        self.full_length = full_length

    def encode(self, texts: Sequence[str], truncate: bool = True, role: str | None = None) -> list[Encoded]:
        """The texts as token ids; `role` ("query", "document"): what they are for, where the
        model reads the two differently."""
        return self.tokenizer.encode(texts, truncate)

    def encode_pairs(
        self, query: str, documents: Sequence[str], truncate: bool = True, instruction: str | None = None
    ) -> list[Encoded]:
        """(query, document) pairs as a reranker reads them; `instruction`: what to rank for,
        which only a model that reads one takes (an LLM reranker's encoder)."""
        if instruction is not None:
            raise UnsupportedError("this model reads no instruction (an LLM reranker does); omit it",
                                   param="instruction")
        return self.tokenizer.encode_pairs(query, documents, truncate)

    def kept(self, rows: list[np.ndarray], encodings: Sequence[Encoded], role: str) -> list[np.ndarray]:
        """Each text's per-token vectors, less those of tokens the model does not match on."""
        return rows
