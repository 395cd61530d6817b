"""Token ids sent by OpenAI clients, turned back into the text they stand for.

OpenAI's embedding API takes text as token ids of its own `cl100k_base` vocabulary, and the
most used RAG client, langchain-openai's `OpenAIEmbeddings`, sends exactly that by default
(it counts and chunks with tiktoken). Those ids say nothing in the served model's vocabulary,
so they are decoded here and the text is tokenized by the model like any other. The
vocabulary ships with the package (OpenAI's file, MIT), so no network is needed.
"""

from __future__ import annotations

import base64
import gzip
from collections.abc import Sequence
from functools import cache
from importlib import resources

from infinity_cloud.core.errors import InvalidInputError

VOCABULARY = "cl100k_base"
# cl100k_base's special tokens, by id (tiktoken's own table); text clients do not send them,
# but tiktoken decodes them to their names, so do we.
_SPECIAL = {
    100257: b"<|endoftext|>", 100258: b"<|fim_prefix|>", 100259: b"<|fim_middle|>",
    100260: b"<|fim_suffix|>", 100276: b"<|endofprompt|>",
}


@cache
def _pieces() -> dict[int, bytes]:
    """Id -> the bytes it stands for: about 100k lines of `base64-bytes rank`, read once."""
    data = resources.files("infinity_cloud") / "data" / f"{VOCABULARY}.tiktoken.gz"
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="ascii") as lines:
        pieces = {int(rank): base64.b64decode(token) for token, rank in (line.split() for line in lines)}
    return {**pieces, **_SPECIAL}


def decode(inputs: Sequence[Sequence[int]]) -> list[str]:
    """The texts a list of cl100k_base id lists stands for. An id outside the vocabulary is a
    400 naming the input; a character cut at a chunk's edge becomes U+FFFD, as tiktoken does."""
    pieces = _pieces()
    texts = []
    for index, ids in enumerate(inputs):
        try:
            texts.append(b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace"))
        except KeyError as missing:
            raise InvalidInputError(
                f"input {index} holds token id {missing.args[0]}, which is not in OpenAI's {VOCABULARY} "
                "vocabulary (token ids are read as OpenAI's by default; serve the model with "
                "--token-ids model to send ids of its own vocabulary)",
                param="input",
            ) from None
    return texts
