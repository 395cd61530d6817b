"""Text to token ids with the model's own fast tokenizer (the `tokenizers` library).

Every input is tokenized once, without padding; the batcher pads per batch. Counting
tokens here is what makes `usage` real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from infinity_cloud.errors import InputTooLongError, InvalidInputError, ModelLoadError
from infinity_cloud.results import Token


@dataclass(eq=False, slots=True)
class Encoded:
    """One input as the model will see it."""

    ids: list[int]
    type_ids: list[int]
    # The encoder attends to the first `attended` positions only (None: all). ColBERT's query
    # expansion appends tokens the encoder does not attend to but whose vectors are scored.
    attended: int | None = None

    def __len__(self) -> int:
        return len(self.ids)


def _load_fast_tokenizer(path: Path) -> Tokenizer:
    if (path / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(path / "tokenizer.json"))
    try:  # slow-tokenizer folders (vocab.txt only) need transformers to convert them
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            f"{path} has no tokenizer.json; converting its tokenizer needs transformers "
            "(pip install 'infinity-cloud[torch]')"
        ) from exc
    converted = AutoTokenizer.from_pretrained(str(path), use_fast=True)
    if not getattr(converted, "is_fast", False):
        raise ModelLoadError(f"{path}: no fast tokenizer can be built for this model")
    return converted.backend_tokenizer


def _special_tokens_around(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a single text (e.g. CLS ... SEP)."""
    plain = tokenizer.encode("hello world", add_special_tokens=False).ids
    full = tokenizer.encode("hello world", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    return [], []


class TextTokenizer:
    """A model's tokenizer with its length limit, vocabulary bound and padding id."""

    def __init__(
        self, tokenizer: Tokenizer, max_length: int, vocab_size: int | None, pad_token: str | None = None
    ) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.max_length = max_length
        self._full = tokenizer
        self._truncating = Tokenizer.from_str(tokenizer.to_str())
        self._truncating.enable_truncation(max_length=max_length, strategy="longest_first")
        self.vocab_size = vocab_size or tokenizer.get_vocab_size(with_added_tokens=True)
        self.pad_id = self._pad_id(tokenizer, pad_token)
        self._prefix, self._suffix = _special_tokens_around(tokenizer)
        self._shorter: dict[int, Tokenizer] = {}  # truncating at limits below max_length

    @classmethod
    def load(
        cls, path: Path, max_length: int, vocab_size: int | None = None, pad_token: str | None = None
    ) -> TextTokenizer:
        return cls(_load_fast_tokenizer(path), max_length, vocab_size, pad_token)

    @staticmethod
    def _pad_id(tokenizer: Tokenizer, pad_token: str | None) -> int:
        for token in (pad_token, "[PAD]", "<pad>", "<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"):
            token_id = tokenizer.token_to_id(token) if token else None
            if token_id is not None:
                return token_id
        return 0  # masked out anyway; any valid id will do

    def _finish(
        self, encodings: list[Encoding], truncate: bool, max_length: int | None = None
    ) -> list[Encoded]:
        limit = min(self.max_length, max_length or self.max_length)
        out = []
        for index, enc in enumerate(encodings):
            if not truncate and len(enc.ids) > limit:
                raise InputTooLongError(
                    f"input {index} has {len(enc.ids)} tokens, more than the model's limit of "
                    f"{limit}; shorten it or send truncate=true",
                    param="input",
                )
            out.append(Encoded(enc.ids, enc.type_ids))
        return out

    def encode(
        self, texts: Sequence[str], truncate: bool = True, special_tokens: bool = True,
        max_length: int | None = None,
    ) -> list[Encoded]:
        """`special_tokens` False: the texts hold the model's special tokens themselves (a
        template's). `max_length`: a shorter limit than the model's (ColBERT's queries)."""
        tokenizer = self._truncating_at(max_length) if truncate else self._full
        encodings = tokenizer.encode_batch(list(texts), add_special_tokens=special_tokens)
        return self._finish(encodings, truncate, max_length)

    def _truncating_at(self, max_length: int | None) -> Tokenizer:
        if max_length is None or max_length >= self.max_length:
            return self._truncating
        if max_length not in self._shorter:
            shorter = Tokenizer.from_str(self._full.to_str())
            shorter.enable_truncation(max_length=max_length, strategy="longest_first")
            self._shorter[max_length] = shorter
        return self._shorter[max_length]

    def token_id(self, token: str) -> int | None:
        return self._full.token_to_id(token)

    def encode_pairs(self, query: str, documents: Sequence[str], truncate: bool = True) -> list[Encoded]:
        tokenizer = self._truncating if truncate else self._full
        return self._finish(tokenizer.encode_batch([(query, d) for d in documents]), truncate)

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[Token]]:
        """Each text's tokens with their character spans (no truncation: what the text is)."""
        encodings = self._full.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [
            [
                Token(token_id, self._full.id_to_token(token_id) or "", True, None, None) if special
                else Token(token_id, text[start:stop], False, start, stop)
                for token_id, special, (start, stop) in zip(
                    enc.ids, enc.special_tokens_mask, enc.offsets, strict=True
                )
            ]
            for text, enc in zip(texts, encodings, strict=True)
        ]

    def decode(self, inputs: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        self._check_vocabulary(inputs, "ids")
        return self._full.decode_batch([list(ids) for ids in inputs], skip_special_tokens=skip_special_tokens)

    def _check_vocabulary(self, inputs: Sequence[Sequence[int]], param: str) -> None:
        for index, ids in enumerate(inputs):
            bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
            if bad is not None:
                raise InvalidInputError(
                    f"input {index} holds token id {bad}, outside the model's vocabulary "
                    f"[0, {self.vocab_size})",
                    param=param,
                )

    def from_token_ids(self, inputs: Sequence[Sequence[int]], truncate: bool = True) -> list[Encoded]:
        """Pre-tokenized inputs (ids without special tokens), checked and wrapped."""
        room = self.max_length - len(self._prefix) - len(self._suffix)
        self._check_vocabulary(inputs, "input")
        out = []
        for index, ids in enumerate(inputs):
            if len(ids) > room:
                if not truncate:
                    raise InputTooLongError(
                        f"input {index} has {len(ids) + len(self._prefix) + len(self._suffix)} "
                        f"tokens, more than the model's limit of {self.max_length}; shorten it "
                        "or send truncate=true",
                        param="input",
                    )
                ids = ids[:room]
            full = [*self._prefix, *ids, *self._suffix]
            out.append(Encoded(full, [0] * len(full)))
        return out
