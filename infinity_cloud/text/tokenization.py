"""Text to token ids with the model's own fast tokenizer (the `tokenizers` library).

Every input is tokenized once, without padding; the batcher pads per batch. Counting
tokens here is what makes `usage` real.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from infinity_cloud.core.errors import InputTooLongError, InvalidInputError, ModelLoadError
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.core.results import Token
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.text import pool_cancellation
from infinity_cloud.text.chunking import Chunk, Window, cut, windows


def _load_fast_tokenizer(path: Path) -> Tokenizer:
    if (path / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(path / "tokenizer.json"))
    try:  # slow-tokenizer folders (vocab.txt only) need transformers to convert them
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            f"{path} has no tokenizer.json; converting its tokenizer needs transformers "
            f"({install_command('torch')})"
        ) from exc
    converted = AutoTokenizer.from_pretrained(str(path), use_fast=True)
    if not getattr(converted, "is_fast", False):
        raise ModelLoadError(f"{path}: no fast tokenizer can be built for this model")
    return converted.backend_tokenizer


def _word_end_before(text: str, span: int) -> int | None:
    """The end of the last word that ends within the first `span` characters (and past half
    of them); None if there is none (e.g. unspaced Chinese)."""
    last = None
    for last in _WORD_END.finditer(text, span // 2, span):  # noqa: B007 - the last match is wanted
        pass
    return None if last is None else last.end()


def _too_long(index: int, count: str, limit: int) -> InputTooLongError:
    return InputTooLongError(
        f"input {index} has {count} tokens, more than the model's limit of {limit}; shorten it or "
        + InputTooLongError.REMEDY,
        param="input", index=index,
    )


def _at_space(text: str, at: int) -> bool:
    return text[at - 1].isspace() or text[at].isspace()


def _special_tokens_around(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a single text (e.g. CLS ... SEP)."""
    plain = tokenizer.encode("hello world", add_special_tokens=False).ids
    full = tokenizer.encode("hello world", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    return [], []


# A text longer than this many characters per token of the limit is cut before tokenizing
# (`TextTokenizer._clip`): prose runs 4-5 characters a token, so the cut keeps enough.
CLIP_CHARS_PER_TOKEN = 8
# Texts encoded at a time: each chunk in parallel (the tokenizers library's threads), and a
# request whose caller has gone stops between chunks (a 2,000-text request: 8 checks).
ENCODE_CHUNK = 256
_WORD_END = re.compile(r"\S(?=\s)")


def _splits_on_whitespace(tokenizer: Tokenizer) -> bool:
    """Whether the pre-tokenizer splits text into words at whitespace, so that a text cut at a
    word's end tokenizes, up to that word, exactly as the whole text does."""
    pre = json.loads(tokenizer.to_str()).get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    for part in parts:
        kind = part.get("type")
        if kind in ("BertPreTokenizer", "Whitespace", "WhitespaceSplit"):
            return True
        if kind == "Metaspace" and part.get("split", True):
            return True
        if kind == "ByteLevel" and part.get("use_regex", True):
            return True
        if kind == "Split":
            pattern = part.get("pattern", {})
            if pattern.get("String", "").isspace() or "\\s" in pattern.get("Regex", ""):
                return True
    return False


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
        self._clippable = _splits_on_whitespace(tokenizer)

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
        self, encodings: list[Encoding], truncate: bool, max_length: int | None = None, offset: int = 0
    ) -> list[Encoded]:
        limit = min(self.max_length, max_length or self.max_length)
        out = []
        for index, enc in enumerate(encodings):
            if not truncate and len(enc.ids) > limit:
                raise _too_long(offset + index, str(len(enc.ids)), limit)
            out.append(Encoded(enc.ids, enc.type_ids))
        return out

    def encode(
        self, texts: Sequence[str], truncate: bool = True, special_tokens: bool = True,
        max_length: int | None = None,
    ) -> list[Encoded]:
        """`special_tokens` False: the texts hold the model's special tokens themselves (a
        template's). `max_length`: a shorter limit than the model's (ColBERT's queries).

        In chunks of `ENCODE_CHUNK` texts (each still encoded in parallel), so a request whose
        caller has gone stops at the next chunk (`pool_cancellation`)."""
        out: list[Encoded] = []
        for start in range(0, len(texts), ENCODE_CHUNK):
            pool_cancellation.check()
            out += self._encode(texts[start : start + ENCODE_CHUNK], start, truncate, special_tokens,
                                max_length)
        return out

    def _encode(
        self, texts: Sequence[str], offset: int, truncate: bool, special_tokens: bool, max_length: int | None
    ) -> list[Encoded]:
        limit = min(self.max_length, max_length or self.max_length)
        texts = self._clip(texts, limit, truncate, offset)
        tokenizer = self._truncating_at(max_length) if truncate else self._full
        encodings = tokenizer.encode_batch(texts, add_special_tokens=special_tokens)
        return self._finish(encodings, truncate, max_length, offset)

    def _clip(self, texts: Sequence[str], limit: int, truncate: bool, offset: int = 0) -> list[str]:
        """Texts far longer than `limit` tokens, cut before a word that starts past token
        `limit`, so their truncated encoding is the whole text's. Tokenizing whole 8,000-character
        texts for a 256-token model built ~340 KB of intermediates each (675 MB for 2,000 of
        them) only to drop them. Without `truncate` such a text is too long: refused here."""
        span = limit * CLIP_CHARS_PER_TOKEN
        long = [i for i, text in enumerate(texts) if len(text) > span] if self._clippable else []
        cuts = {i: cut for i in long if (cut := _word_end_before(texts[i], span)) is not None}
        if not cuts:
            return list(texts)
        out = list(texts)
        prefixes = [texts[i][:cut] for i, cut in cuts.items()]
        encodings = self._full.encode_batch(prefixes, add_special_tokens=False)
        for i, prefix, encoding in zip(cuts, prefixes, encodings, strict=True):
            # The first token at or past `limit` that starts a word (after whitespace, or with
            # it: byte-level and metaspace tokens carry their space): all before it is whole words.
            starts = (start for start, _ in encoding.offsets[limit:])
            next_word = next((s for s in starts if s and _at_space(prefix, s)), None)
            if next_word is None:
                continue  # few long tokens: the whole text it is
            if not truncate:
                raise _too_long(offset + i, f"over {len(encoding.ids)}", limit)
            out[i] = prefix[:next_word]
        return out

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
        # Truncating a pair shortens the longer side first, so a document is cut only when it
        # stays longer than the query: with a query under the limit, any cut document is.
        if len(self._full.encode(query, add_special_tokens=False)) < self.max_length:
            documents = self._clip(documents, self.max_length, truncate)
        tokenizer = self._truncating if truncate else self._full
        return self._finish(tokenizer.encode_batch([(query, d) for d in documents]), truncate)

    def cut(self, texts: Sequence[str], tokens: int) -> list[str]:
        """Each text cut to its first `tokens` tokens (special ones not counted), before the
        token that would pass them: Cohere's `max_tokens_per_doc`."""
        clipped = self._clip(texts, tokens, truncate=True)
        encodings = self._full.encode_batch(clipped, add_special_tokens=False)
        return [
            text[: encoding.offsets[tokens][0]].rstrip() if len(encoding.ids) > tokens else text
            for text, encoding in zip(clipped, encodings, strict=True)
        ]

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

    @property
    def room(self) -> int:
        """Tokens of a text that fit the window beside the special ones the model adds."""
        return self.max_length - len(self._prefix) - len(self._suffix)

    def prompt_length(self, prompt: str) -> int:
        """Tokens a prompt put before a text takes (e5's "passage: ")."""
        return len(self._full.encode(prompt, add_special_tokens=False).ids) if prompt else 0

    def chunks(
        self, texts: Sequence[str], chunk_tokens: int, overlap_tokens: int, prompt: str = ""
    ) -> list[list[tuple[Chunk, Encoded]]]:
        """Each text cut into chunks of at most `chunk_tokens` of its own tokens
        (`chunking.cut`), each with its model input: the chunk's own token ids (not the chunk's
        text tokenized again, which can differ at its edges) behind `prompt`'s, framed by the
        model's special tokens. In `ENCODE_CHUNK`s of texts, as `encode`."""
        lead = self._full.encode(prompt, add_special_tokens=False).ids if prompt else []
        out = []
        for start in range(0, len(texts), ENCODE_CHUNK):
            pool_cancellation.check()
            part = list(texts[start : start + ENCODE_CHUNK])
            for text, enc in zip(part, self._full.encode_batch(part, add_special_tokens=False), strict=True):
                out.append([(c, self._framed([*lead, *enc.ids[c.first : c.stop]]))
                            for c in cut(text, enc.offsets, chunk_tokens, overlap_tokens)])
        return out

    def read_whole(
        self, texts: Sequence[str], room: int, overlap: int, prompt: str = ""
    ) -> list[tuple[list[tuple[int, int]], list[tuple[Window, Encoded]]]]:
        """Each text's own tokens' character offsets, and the windows of at most `room` of
        them that read the whole text (`chunking.windows`, consecutive ones sharing
        `overlap`), each with its model input: its tokens behind `prompt`'s, framed by the
        model's special tokens (late chunking). In `ENCODE_CHUNK`s of texts, as `encode`."""
        lead = self._full.encode(prompt, add_special_tokens=False).ids if prompt else []
        out = []
        for start in range(0, len(texts), ENCODE_CHUNK):
            pool_cancellation.check()
            part = list(texts[start : start + ENCODE_CHUNK])
            for enc in self._full.encode_batch(part, add_special_tokens=False):
                out.append((enc.offsets, [(w, self._framed([*lead, *enc.ids[w.first : w.stop]]))
                                          for w in windows(len(enc.ids), room, overlap)]))
        return out

    def lead_length(self, prompt: str = "") -> int:
        """Positions before a text's first own token in its model input: the model's leading
        special tokens and the prompt's."""
        return len(self._prefix) + self.prompt_length(prompt)

    def _framed(self, ids: list[int]) -> Encoded:
        full = [*self._prefix, *ids, *self._suffix]
        return Encoded(full, [0] * len(full))

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
        room = self.room
        self._check_vocabulary(inputs, "input")
        out = []
        for index, ids in enumerate(inputs):
            if len(ids) > room:
                if not truncate:
                    count = len(ids) + len(self._prefix) + len(self._suffix)
                    raise _too_long(index, str(count), self.max_length)
                ids = ids[:room]
            out.append(self._framed(list(ids)))
        return out
