"""A built-in corpus of queries and passages, made from the docstrings of the running Python's
standard library: what `infinity-cloud bench` sends when given no `--corpus`, and what the
project's benchmarks (benchmarks/corpus.py) measure on, so every number can be reproduced
from a clone with no download.

Passages are runs of consecutive docstring paragraphs of one source file, joined until a
length drawn between 50 and 1,350 characters (1,750 at most); queries are single sentences of
those passages (12 to 90 characters, the final full stop dropped), like a search for something
a passage says. 3,000 queries and 1,300 passages (MiniLM tokens, untruncated: queries 14 on
average, passages 169). The library's source files are walked in sorted order (test suites and
the generated codecs of `encodings` left out) and every choice is made by a generator with a
fixed seed, so one Python gives the same corpus every time. A corpus file is JSON lines
`{"text", "kind"}`, `kind` being "query" or "passage".
"""

from __future__ import annotations

import functools
import json
import random
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from infinity_cloud.tasks.quantization import docstring_paragraphs

KINDS = ("query", "passage")
QUERIES = 3000
PASSAGES = 1300
SEED = 14
PASSAGE_CHARS = (50, 1350)  # the length a passage is joined up to is drawn here
PASSAGE_MAX = 1750
QUERY_CHARS = (12, 90)
# Test suites, and encodings' codecs, which are generated and share one docstring.
_LEFT_OUT = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "encodings"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def stdlib_sources() -> list[Path]:
    """The standard library's Python source files, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        path for path in root.rglob("*.py") if not _LEFT_OUT & set(path.relative_to(root).parts[:-1])
    )


def _passages(paragraphs: list[str], rng: random.Random) -> Iterator[str]:
    """Consecutive paragraphs joined up to a length drawn for each passage; doctest examples,
    whose lines folded into one read as noise, and paragraphs too long alone are passed over."""
    low, high = PASSAGE_CHARS
    run: list[str] = []
    target = rng.uniform(low, high)
    for paragraph in paragraphs:
        if ">>>" in paragraph or len(paragraph) > PASSAGE_MAX:
            continue
        if run and len(" ".join([*run, paragraph])) > PASSAGE_MAX:
            yield " ".join(run)
            run, target = [], rng.uniform(low, high)
        run.append(paragraph)
        if len(" ".join(run)) >= target:
            yield " ".join(run)
            run, target = [], rng.uniform(low, high)
    if run and len(" ".join(run)) >= low:
        yield " ".join(run)


def _queries(passage: str) -> Iterator[str]:
    """The passage's sentences that read as a query: prose (mostly letters), three words or
    more, of QUERY_CHARS, without their final full stop."""
    for sentence in _SENTENCE_END.split(passage):
        text = sentence.rstrip(".")
        letters = sum(c.isalpha() or c.isspace() for c in text)
        if (
            QUERY_CHARS[0] <= len(text) <= QUERY_CHARS[1]
            and text[0].isupper()
            and len(text.split()) >= 3
            and letters >= 0.85 * len(text)
        ):
            yield text


@functools.cache
def generated_corpus() -> tuple[dict[str, str], ...]:
    """QUERIES queries and PASSAGES passages, kinds interleaved in a fixed shuffled order, so
    that any prefix of one kind spreads over the whole library."""
    rng = random.Random(SEED)
    candidates: dict[str, None] = {}
    for source in stdlib_sources():
        try:
            paragraphs = docstring_paragraphs(source)
        except (SyntaxError, ValueError, OSError):  # a file for another Python, or unreadable
            continue
        candidates.update(dict.fromkeys(_passages(paragraphs, rng)))
    passages = rng.sample(sorted(candidates), min(PASSAGES, len(candidates)))
    sentences = list(dict.fromkeys(q for p in passages for q in _queries(p)))
    queries = rng.sample(sentences, min(QUERIES, len(sentences)))
    rows = [{"text": t, "kind": "query"} for t in queries]
    rows += [{"text": t, "kind": "passage"} for t in passages]
    rng.shuffle(rows)
    return tuple(rows)


@functools.cache
def load_corpus(path: Path | None = None) -> tuple[dict[str, str], ...]:
    """The rows {"text", "kind"} of the JSON lines file `path`, or, without one, the generated
    corpus; either is made once per process."""
    if path is None:
        return generated_corpus()
    return tuple(json.loads(line) for line in path.read_text().splitlines() if line.strip())


def load_texts(path: Path | None, kind: str) -> list[str]:
    """The corpus's texts of one kind ("query" or "passage")."""
    return [r["text"] for r in load_corpus(path) if r.get("kind") == kind]
