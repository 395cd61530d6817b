"""Long texts are cut before tokenizing, and the cut never changes what the model reads.

Each pre-tokenizer family real models use is trained here on a few texts (the tokenizers
library, no download); the reference is the tokenizers library truncating the whole text.
"""

from __future__ import annotations

import asyncio
import functools
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors, trainers

from infinity_cloud.core.errors import InputTooLongError
from infinity_cloud.text import pool_cancellation
from infinity_cloud.text.tokenization import CLIP_CHARS_PER_TOKEN, ENCODE_CHUNK, TextTokenizer

LIMIT = 32
WORDS = [
    "the", "tokenizer", "café", "naïve", "résumé", "x", "don't", "(a,", "b)", "3.14", "e-mail", "URL:",
    "https://example.com/a?b=c", "über", "東京", "日本語の", "emoji🙂", "snake_case_name", "CamelCase",
    "def", "f(x):", "return", "x**2", "--flag", "...", "'quoted'", "\u00a0nbsp", "tab\tinside",
]
SPACES = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n ", "   "]
GPT_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SPACES) for _ in range(words)).strip()


def _corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [_text(rng, 200) for _ in range(16)]


PRE_TOKENIZERS = {
    "bert": pre_tokenizers.BertPreTokenizer(),
    "whitespace": pre_tokenizers.Whitespace(),
    "byte_level": pre_tokenizers.ByteLevel(add_prefix_space=True),
    "metaspace": pre_tokenizers.Metaspace(),
    "split_space_merged": pre_tokenizers.Split(" ", behavior="merged_with_previous"),
    "split_regex_then_bytes": pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]),
    "none": None,
}


def _tokenizer(kind: str) -> Tokenizer:
    """A fresh copy of the kind's tokenizer, trained once per test run."""
    return Tokenizer.from_str(_trained(kind))


@functools.cache
def _trained(kind: str) -> str:
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    if PRE_TOKENIZERS[kind] is not None:
        tokenizer.pre_tokenizer = PRE_TOKENIZERS[kind]
    alphabet = pre_tokenizers.ByteLevel.alphabet() if "byte" in kind else []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"], initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(_corpus(1), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))],
    )
    return tokenizer.to_str()


def _reference(tokenizer: Tokenizer, limit: int) -> Tokenizer:
    reference = Tokenizer.from_str(tokenizer.to_str())
    reference.no_padding()
    reference.enable_truncation(max_length=limit, strategy="longest_first")
    return reference


@pytest.mark.parametrize("kind", sorted(PRE_TOKENIZERS))
def test_cut_texts_read_as_the_whole_texts_do(kind: str) -> None:
    tokenizer = _tokenizer(kind)
    ours, reference = TextTokenizer(tokenizer, LIMIT, None), _reference(tokenizer, LIMIT)
    texts = _corpus(2)
    assert all(len(t) > LIMIT * CLIP_CHARS_PER_TOKEN for t in texts)

    got = [e.ids for e in ours.encode(texts)]
    assert got == [e.ids for e in reference.encode_batch(texts)]
    # Short, near half the limit (the documents are cut: they stay the longer side), and over
    # the limit (nothing is cut). A query over the limit takes the same path however long it is,
    # and the library's pair truncation costs in proportion to its length: the whole text (200
    # to 600 tokens) as a query was 90% of this test's time and checked nothing more.
    short, half, over = "the naïve tokenizer", texts[0][:60], texts[0][:150]
    if kind != "none":  # one piece of BPE: nothing is ever cut, whatever the query
        lengths = [len(tokenizer.encode(q, add_special_tokens=False).ids) for q in (short, half, over)]
        assert lengths[0] < lengths[1] < LIMIT < lengths[2], lengths
    for query in (short, half, over):
        pairs = ours.encode_pairs(query, texts[1:])
        want = reference.encode_batch([(query, t) for t in texts[1:]])
        assert [e.ids for e in pairs] == [e.ids for e in want]
    # A limit below the model's (ColBERT's queries) is cut for just the same.
    shorter = [e.ids for e in ours.encode(texts, max_length=LIMIT // 2)]
    assert shorter == [e.ids for e in _reference(tokenizer, LIMIT // 2).encode_batch(texts)]

    cut = ours._clip(texts, LIMIT, truncate=True)
    if kind == "none":  # one piece of BPE over the whole text: no safe place to cut
        assert cut == texts
    else:
        assert sum(map(len, cut)) < sum(map(len, texts)) / 2, "the long texts were not cut"


def test_a_text_too_long_without_truncation_is_refused_either_way() -> None:
    ours = TextTokenizer(_tokenizer("bert"), LIMIT, None)
    long, short = _corpus(3)[0], "a short one"
    with pytest.raises(InputTooLongError, match=r"input 1 has over [0-9]+ tokens, more than .* limit of 32"):
        ours.encode([short, long], truncate=False)
    with pytest.raises(InputTooLongError, match=r"input 1 has (3[3-9]|[4-9][0-9]) tokens"):
        ours.encode([short, long[: LIMIT * CLIP_CHARS_PER_TOKEN]], truncate=False)
    assert len(ours.encode([short], truncate=False)[0]) < LIMIT


def test_texts_of_few_long_tokens_are_read_whole() -> None:
    """Mostly whitespace: a prefix of many characters still holds few tokens, so it is not cut."""
    tokenizer = _tokenizer("bert")
    ours, reference = TextTokenizer(tokenizer, LIMIT, None), _reference(tokenizer, LIMIT)
    sparse = (" " * 40).join(["the"] * 60)
    assert ours._clip([sparse], LIMIT, truncate=True) == [sparse]
    assert ours.encode([sparse])[0].ids == reference.encode(sparse).ids


def test_real_minilm_tokenizer(minilm_dir: Path) -> None:
    ours = TextTokenizer.load(minilm_dir, 256)
    reference = _reference(Tokenizer.from_file(str(minilm_dir / "tokenizer.json")), 256)
    rng = random.Random(4)
    texts = [_text(rng, 3000) for _ in range(8)]
    assert [e.ids for e in ours.encode(texts)] == [e.ids for e in reference.encode_batch(texts)]
    assert max(map(len, ours._clip(texts, 256, truncate=True))) < 3000


def test_an_index_past_the_first_chunk_is_named_as_sent() -> None:
    """Encoded in chunks, an input is still named by its place in the request."""
    ours = TextTokenizer(_tokenizer("bert"), LIMIT, None)
    texts = ["a short one"] * (ENCODE_CHUNK + 5) + [_corpus(3)[0]]
    with pytest.raises(InputTooLongError, match=rf"input {ENCODE_CHUNK + 5} has over"):
        ours.encode(texts, truncate=False)


async def test_tokenizing_stops_at_the_next_chunk_when_its_caller_goes() -> None:
    """A caller that goes (its task cancelled) stops the thread's tokenizing at the next chunk
    of `ENCODE_CHUNK` texts, not after all of them: the pool's one worker is free for the next
    job with most chunks never encoded."""
    ours = TextTokenizer(_tokenizer("bert"), LIMIT, None)
    texts = [" ".join(_corpus(1)[:3])] * (40 * ENCODE_CHUNK)
    chunks: list[int] = []
    encode = ours._encode

    def counted(*args: Any) -> list[Any]:  # the real encoding, counted
        chunks.append(1)
        return encode(*args)

    ours._encode = counted  # type: ignore[method-assign]
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        work = asyncio.ensure_future(pool_cancellation.in_pool(pool, ours.encode, texts))
        while not chunks:
            await asyncio.sleep(0.001)
        work.cancel()
        with pytest.raises(asyncio.CancelledError):
            await work
        seen = len(chunks)
        await asyncio.get_running_loop().run_in_executor(pool, lambda: None)  # after encode has stopped
        assert len(chunks) <= seen + 1 < 40, f"{len(chunks)} of 40 chunks were encoded after the caller went"
    finally:
        pool.shutdown()
