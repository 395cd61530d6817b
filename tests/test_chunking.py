"""Chunks cut by the model's own tokenizer: never over the limit, overlapping by exactly the
overlap asked, covering every character a token came from, cut at a sentence or word edge
where one lies in a chunk's last tenth. Checked with real all-MiniLM-L6-v2's WordPiece
tokenizer and a byte-level BPE with Qwen2's pre-tokenizer (whose tokens carry their space).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, pre_tokenizers
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from infinity_cloud.text.chunking import SNAP_SHARE, Chunk, cut, windows
from infinity_cloud.text.tokenization import TextTokenizer
from tests.model_factory import _train_byte_level_bpe

SENTENCES = [
    "Late chunking embeds each chunk in the context of its whole document.",
    "Character splitters overflow the window, or waste most of it.",
    "The café's naïve résumé was 3.14 pages long!",
    "Is a chunk cut mid-word?",
    "東京は日本の首都です。",
    "snake_case_names and CamelCaseNames and https://example.com/a?b=c are tokens too;",
]


def _document(seed: int, sentences: int) -> str:
    rng = random.Random(seed)
    parts = []
    for _ in range(sentences):
        parts.append(rng.choice(SENTENCES))
        parts.append(rng.choice([" ", " ", "  ", "\n", "\n\n", "\t"]))
    return "".join(parts).strip()


@pytest.fixture(scope="module", params=["wordpiece", "byte_level"])
def tokenizer(request: pytest.FixtureRequest, minilm_dir: Path) -> Tokenizer:
    if request.param == "wordpiece":
        return _minilm(minilm_dir)
    bpe = _train_byte_level_bpe([], vocab_size=400)
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return bpe


def _minilm(minilm_dir: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()  # its tokenizer.json pads and truncates to 128, as TextTokenizer undoes
    tokenizer.no_truncation()
    return tokenizer


def _chunks(tokenizer: Tokenizer, text: str, size: int, overlap: int) -> tuple[list[Chunk], list]:
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    return cut(text, offsets, size, overlap), offsets


@pytest.mark.parametrize(("size", "overlap"), [(16, 0), (32, 8), (50, 49), (1, 0), (7, 3)])
def test_chunks_fit_overlap_and_cover_the_document(tokenizer: Tokenizer, size: int, overlap: int) -> None:
    text = _document(size, 40)
    chunks, offsets = _chunks(tokenizer, text, size, overlap)

    assert chunks[0].first == 0 and chunks[-1].stop == len(offsets)
    assert all(0 < c.tokens <= size for c in chunks)
    for before, after in itertools.pairwise(chunks):
        assert after.first == before.stop - overlap, "consecutive chunks share exactly the overlap"
        assert after.first > before.first
    covered = [False] * len(text)
    for chunk in chunks:
        assert text[offsets[chunk.first][0]:chunk.start].strip() == "", "only a token's leading space skipped"
        assert chunk.end == offsets[chunk.stop - 1][1]
        # A chunk starts on a non-space, unless all it holds is space (a byte-level "\n\n" token).
        assert chunk.start == chunk.end or not text[chunk.start].isspace()
        for at in range(chunk.start, chunk.end):
            covered[at] = True
    missed = [text[i] for i in range(len(text)) if not covered[i] and not text[i].isspace()]
    assert missed == [], "every non-space character is in a chunk"


def _sentence_edge(text: str, offsets: list, at: int) -> bool:
    """A sentence ends before token `at`: punctuation then space, or a line break between."""
    end, start = offsets[at - 1][1], offsets[at][0]
    spaced = text[end:start] != "" or text[start].isspace()
    return (text[end - 1] in ".!?;。" and spaced) or "\n" in text[end:start]


def test_a_cut_snaps_to_the_sentence_end_in_the_last_tenth(tokenizer: Tokenizer) -> None:
    text = _document(3, 60)
    size = 40
    chunks, offsets = _chunks(tokenizer, text, size, 0)
    snapped = 0
    for chunk in chunks[:-1]:
        limit = chunk.first + size
        tenth = range(limit - int(size * SNAP_SHARE), limit + 1)
        ends = [at for at in tenth if _sentence_edge(text, offsets, at)]
        if ends:
            what = text[chunk.start:chunk.end]
            assert chunk.stop == max(ends), f"a sentence ended in its last tenth: {what!r}"
            snapped += 1
        else:
            next_start = offsets[chunk.stop][0]
            at_space = text[chunk.end:next_start] != "" or text[next_start].isspace()
            assert chunk.stop == limit or at_space, "else at a space, or at the limit"
    assert snapped, "the document has sentence ends near some cuts: the test must see a snap"


def test_a_cut_never_lands_mid_word_when_a_space_is_near(minilm_dir: Path) -> None:
    tokenizer = _minilm(minilm_dir)
    text = " ".join(["antidisestablishmentarianism internationalization"] * 30)
    chunks, _ = _chunks(tokenizer, text, 20, 0)
    assert len(chunks) > 3
    for chunk in chunks[:-1]:
        assert text[chunk.end] == " ", f"cut mid-word: {text[chunk.start:chunk.end]!r}"


def test_unspaced_text_is_cut_at_the_limit_and_still_covered(minilm_dir: Path) -> None:
    tokenizer = _minilm(minilm_dir)
    text = "東京日本語" * 40  # WordPiece: one token a character, no space anywhere
    chunks, _ = _chunks(tokenizer, text, 16, 4)
    assert [c.tokens for c in chunks[:-1]] == [16] * (len(chunks) - 1)
    assert chunks[-1].end == len(text) and chunks[0].start == 0


def test_empty_text_has_no_chunks_and_bad_sizes_are_refused() -> None:
    assert cut("", [], 8, 2) == []
    with pytest.raises(ValueError, match=r"overlap_tokens \(8\) must be at least 0 and below chunk_tokens"):
        cut("a b", [(0, 1), (2, 3)], 8, 8)
    with pytest.raises(ValueError, match="chunk_tokens must be at least 1"):
        cut("a b", [(0, 1), (2, 3)], 0, 0)


def test_the_served_tokenizer_cuts_whole_documents_to_its_room(minilm_dir: Path) -> None:
    served = TextTokenizer.load(minilm_dir, 256)  # as the server loads it: its padding undone
    assert served.room == 254  # [CLS] and [SEP] take two of the 256
    texts = [_document(7, 120), "one short text"]
    chunks = served.chunks(texts, served.room, 16)
    assert len(chunks[0]) > 2 and len(chunks[1]) == 1
    for text, pairs in zip(texts, chunks, strict=True):
        ids = served._full.encode(text, add_special_tokens=False).ids
        for chunk, encoded in pairs:
            # [CLS] the chunk's own token ids [SEP]: within the window, never tokenized again.
            assert len(encoded) == chunk.tokens + 2 <= 256
            assert encoded.ids[1:-1] == ids[chunk.first:chunk.stop]


@pytest.mark.parametrize(
    ("count", "room", "overlap"),
    [(0, 8, 2), (5, 8, 2), (8, 8, 0), (100, 8, 0), (100, 8, 4), (8193, 510, 128), (33, 7, 6)],
)
def test_windows_read_every_token_once_with_context(count: int, room: int, overlap: int) -> None:
    read = windows(count, room, overlap)
    assert (read == []) == (count == 0)
    kept = [t for w in read for t in range(w.keep_first, w.keep_stop)]
    assert kept == list(range(count)), "each token's state is kept from exactly one window, in order"
    for w in read:
        assert w.stop - w.first <= room and w.first <= w.keep_first <= w.keep_stop <= w.stop
    for before, after in itertools.pairwise(read):
        assert before.stop - after.first == overlap
        # A kept token sits at least overlap // 2 tokens from the edge its window shares.
        assert before.stop - before.keep_stop >= overlap // 2
        assert after.keep_first - after.first >= overlap // 2
