"""The benchmarks' texts: the built-in corpus of `infinity_cloud.sizing.corpus` (queries and
passages made from the running Python's standard library's docstrings, the same texts
`infinity-cloud bench` sends), or a file of your own.

    python benchmarks/corpus.py                     # its size and lengths
    python benchmarks/corpus.py --write corpus.jsonl  # the same texts as JSON lines

Every benchmark's --corpus is optional: without it, these texts; with it, a file of JSON lines
`{"text", "kind"}`, `kind` being "query" or "passage".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from infinity_cloud.sizing.corpus import generated_corpus, load_corpus, load_texts

__all__ = ["add_corpus_argument", "describe", "generated_corpus", "load_corpus", "load_texts", "stats"]


def describe(path: Path | None) -> str:
    """What a report says the corpus was."""
    if path is not None:
        return str(path)
    python = sys.version.split()[0]
    return f"generated from the standard library of Python {python} (infinity_cloud.sizing.corpus)"


def add_corpus_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help='JSON lines {"text", "kind": "query"|"passage"} (default: made from the standard '
        "library's docstrings, benchmarks/corpus.py)",
    )


def stats(rows: tuple[dict[str, str], ...], tokenizer: Path | None = None) -> dict[str, dict[str, float]]:
    """Per kind: how many texts, and their lengths in characters (and in tokens of the
    tokenizer.json in the model folder `tokenizer`, untruncated)."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("query", "passage"):
        texts = [r["text"] for r in rows if r.get("kind") == kind]
        lengths = {"chars": [len(t) for t in texts]}
        if tokenizer is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
            tok.no_truncation()
            tok.no_padding()
            lengths["tokens"] = [len(e.ids) for e in tok.encode_batch(texts)]
        out[kind] = {"count": len(texts)}
        for unit, values in lengths.items():
            deciles = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
            out[kind] |= {
                f"{unit}_min": min(values),
                f"{unit}_p10": deciles[0],
                f"{unit}_p50": statistics.median(values),
                f"{unit}_p90": deciles[-1],
                f"{unit}_max": max(values),
                f"{unit}_mean": round(statistics.fmean(values), 1),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_corpus_argument(parser)
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="a model folder: lengths in its tokens too"
    )
    parser.add_argument("--write", type=Path, default=None, help="write the corpus here as JSON lines")
    args = parser.parse_args()
    rows = load_corpus(args.corpus)
    if args.write:
        args.write.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(json.dumps({"corpus": describe(args.corpus), **stats(rows, args.tokenizer)}, indent=2))


if __name__ == "__main__":
    main()
