"""The rows of a bulk job's input: JSON Lines, Parquet, CSV and plain-text files (compressed
ones too), local or on S3, named by path or glob, read as a stream in a fixed order, so that a
run started again sees the same row at the same place and resumes by position.

A row that cannot be embedded (no text field, a text that is not a string, an empty text, a
line that is not JSON) is kept with the reason, in its place: it goes to the error file.
"""

from __future__ import annotations

import csv
import glob
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.errors import ConfigError

FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
}
COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")


@dataclass(frozen=True)
class Row:
    number: int  # its place in the whole input, from 0
    id: Any  # the id field's value, else the row's number
    text: str | None  # None: the row cannot be embedded (`problem` says why)
    problem: str | None = None
    kept: dict[str, Any] = field(default_factory=dict)  # the other fields asked for


def file_format(path: str) -> str:
    name = path.lower()
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    for suffix, kind in FORMATS.items():
        if name.endswith(suffix):
            return kind
    raise ConfigError(
        f"{path}: not a file a bulk job reads (JSON Lines .jsonl, Parquet .parquet, CSV .csv, plain "
        "text .txt, optionally .gz/.bz2/.zst compressed)"
    )


def filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's filesystem for a local path or an s3:// URI, and the path within it."""
    from pyarrow import fs

    if "://" in uri:
        return fs.FileSystem.from_uri(uri)
    import os

    return fs.LocalFileSystem(), os.path.abspath(uri)


def expand(inputs: Sequence[str]) -> list[str]:
    """Each input path, glob or S3 prefix as the files it names, sorted, each once."""
    found: list[str] = []
    for given in inputs:
        if given.startswith("s3://"):
            found += _s3_files(given)
            continue
        matches = sorted(glob.glob(given, recursive=True)) if glob.has_magic(given) else [given]
        files = [m for m in matches if not _is_dir(m)]
        if not files:
            raise ConfigError(
                f"{given}: no such file" if not glob.has_magic(given) else f"{given}: no file matches"
            )
        found += files
    for path in found:
        file_format(path)  # an unknown kind is said before anything runs
    return list(dict.fromkeys(found))


def _is_dir(path: str) -> bool:
    import os

    return os.path.isdir(path)


def _s3_files(uri: str) -> list[str]:
    from pyarrow import fs

    filesystem_, path = fs.FileSystem.from_uri(uri)
    info = filesystem_.get_file_info(path)
    if info.type == fs.FileType.File:
        return [uri]
    if info.type == fs.FileType.NotFound:
        raise ConfigError(f"{uri}: no such object or prefix")
    listed = filesystem_.get_file_info(fs.FileSelector(path, recursive=True))
    bucket = uri.split("/", 3)[2]
    return sorted(
        f"s3://{bucket}/{f.path.split('/', 1)[1]}"
        for f in listed
        if f.type == fs.FileType.File and _known(f.path)
    )


def _known(path: str) -> bool:
    try:
        file_format(path)
    except ConfigError:
        return False
    return True


def _open_text(uri: str) -> io.TextIOBase:
    filesystem_, path = filesystem(uri)
    compression = next((s[1:] for s in COMPRESSED if uri.lower().endswith(s)), None)
    names = {"gz": "gzip", "zst": "zstd", "lz4": "lz4_frame"}  # pyarrow's codec names
    stream = filesystem_.open_input_stream(path, compression=names.get(compression, compression))
    return io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline="")


def count_rows(files: Sequence[str]) -> int | None:
    """How many rows the files hold (Parquet from its footer, the rest by counting lines), for
    the estimated time left; None where counting would mean reading S3 twice."""
    total = 0
    for uri in files:
        if uri.startswith("s3://") and file_format(uri) != "parquet":
            return None
        kind = file_format(uri)
        if kind == "parquet":
            import pyarrow.parquet as pq

            filesystem_, path = filesystem(uri)
            with filesystem_.open_input_file(path) as handle:
                total += pq.ParquetFile(handle).metadata.num_rows
        else:
            with _open_text(uri) as handle:
                lines = sum(1 for line in handle if line.strip() or kind == "text")
            total += lines - (1 if kind == "csv" and lines else 0)
    return total


def read_rows(
    files: Sequence[str], text_field: str = "text", id_field: str = "id", keep: Sequence[str] = ()
) -> Iterator[Row]:
    """Every row of every file, in order, numbered from 0 across them."""
    number = 0
    for uri in files:
        for record, problem in _records(uri, text_field):
            yield _row(number, record, problem, text_field, id_field, keep)
            number += 1


def _records(uri: str, text_field: str) -> Iterator[tuple[dict[str, Any], str | None]]:
    kind = file_format(uri)
    if kind == "parquet":
        import pyarrow.parquet as pq

        filesystem_, path = filesystem(uri)
        with filesystem_.open_input_file(path) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(batch_size=4096):
                for record in batch.to_pylist():
                    yield record, None
        return
    with _open_text(uri) as handle:
        if kind == "csv":
            for record in csv.DictReader(handle):
                yield record, None
            return
        for line_number, line in enumerate(handle, 1):
            if kind == "text":
                yield {text_field: line.rstrip("\r\n")}, None
                continue
            if not line.strip():
                continue  # blank lines between JSON records are no rows
            try:
                record = json.loads(line)
            except ValueError as exc:
                yield {}, f"{uri} line {line_number} is not JSON: {exc}"
                continue
            if not isinstance(record, dict):
                yield {}, f"{uri} line {line_number} is not a JSON object"
                continue
            yield record, None


def _row(
    number: int,
    record: dict[str, Any],
    problem: str | None,
    text_field: str,
    id_field: str,
    keep: Sequence[str],
) -> Row:
    given = record.get(id_field)
    row_id = number if given is None else given
    kept = {name: record.get(name) for name in keep}
    if problem is not None:
        return Row(number, row_id, None, problem, kept)
    if text_field not in record:
        return Row(number, row_id, None, f"no {text_field!r} field", kept)
    text = record[text_field]
    if not isinstance(text, str):
        return Row(number, row_id, None, f"{text_field!r} is {type(text).__name__}, not text", kept)
    if not text.strip():
        return Row(number, row_id, None, "empty text", kept)
    return Row(number, row_id, text, None, kept)
