"""The rows of a bulk job's input: JSON Lines, Parquet, CSV and plain-text files (compressed
ones too), local or on S3, named by path or glob, read as a stream in a fixed order, so that a
run started again sees the same row at the same place and resumes by position.

A row that cannot be embedded (no text field, a text that is not a string, a line that is
blank or not JSON) is kept with the reason, in its place: it goes to the error file. Every
line of a JSON Lines or text file is a row, so a row's place is its line. Whether a text is
one the model takes (not empty, not too long) is the engine's own check, as for the server.
"""

from __future__ import annotations

import csv
import glob
import io
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.core.errors import ConfigError

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
    fields: tuple[str, ...] = ()  # the record's fields, where the text field is not one of them


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


def media_url(value: str) -> tuple[str | None, str | None]:
    """A row's image (or audio) as the engine takes it: an http(s) URL or data: URI as it is;
    a local path or s3:// URI read into a data: URI. Returns (url, None), or (None, why) for a
    file that cannot be read: a bad row, not a failed job."""
    import base64
    import mimetypes

    if value.startswith(("http://", "https://", "data:")):
        return value, None
    try:
        files, path = filesystem(value)
        with files.open_input_stream(path) as stream:
            data = stream.read()
    except (OSError, ValueError) as exc:  # pyarrow's FileNotFoundError, permissions, a bad URI
        return None, f"cannot read {value!r}: {str(exc).splitlines()[0][:200]}"
    mime = mimetypes.guess_type(value)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}", None


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


def _compression(uri: str) -> str | None:
    suffix = next((s[1:] for s in COMPRESSED if uri.lower().endswith(s)), None)
    return {"gz": "gzip", "zst": "zstd", "lz4": "lz4_frame"}.get(suffix or "", suffix)  # pyarrow's names


def _open_text(uri: str, offset: int | None = None) -> io.TextIOBase:
    """The file as text, split into lines at "\n" only (as `plan` counts them in bytes),
    from `offset` (bytes) where given."""
    filesystem_, path = filesystem(uri)
    if offset is not None:
        handle = filesystem_.open_input_file(path)
        handle.seek(offset)
        return io.TextIOWrapper(handle, encoding="utf-8", errors="strict", newline="\n")
    stream = filesystem_.open_input_stream(path, compression=_compression(uri))
    return io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline="\n")


def count_rows(files: Sequence[str]) -> int | None:
    """How many rows the files hold (Parquet from its footer, the rest by counting lines), for
    the estimated time left; None where counting would mean reading S3 twice."""
    total = 0
    for uri in files:
        if uri.startswith("s3://") and file_format(uri) != "parquet":
            return None
        kind = file_format(uri)
        if kind == "parquet":
            total += _parquet_rows(uri)
        else:
            with _open_text(uri) as handle:
                lines = sum(1 for _ in handle)
            total += lines - (1 if kind == "csv" and lines else 0)
    return total


def _parquet_rows(uri: str) -> int:
    import pyarrow.parquet as pq

    filesystem_, path = filesystem(uri)
    with filesystem_.open_input_file(path) as handle:
        return int(pq.ParquetFile(handle).metadata.num_rows)


def read_rows(
    files: Sequence[str], text_field: str = "text", id_field: str = "id", keep: Sequence[str] = ()
) -> Iterator[Row]:
    """Every row of every file, in order, numbered from 0 across them."""
    number = 0
    for uri in files:
        for record, problem in _records(uri, text_field):
            yield _row(number, record, problem, text_field, id_field, keep)
            number += 1


def _records(
    uri: str, text_field: str, skip: int = 0, offset: int | None = None
) -> Iterator[tuple[dict[str, Any], str | None]]:
    """The file's records from its row `skip` on (entered at byte `offset` where given)."""
    kind = file_format(uri)
    if kind == "parquet":
        yield from _parquet_records(uri, skip)
        return
    with _open_text(uri, offset) as handle:
        if kind == "csv":
            yield from itertools.islice(((r, None) for r in csv.DictReader(handle)), skip, None)
            return
        row = 0 if offset is None else skip
        for line in handle:
            row += 1
            if row <= skip:
                continue
            yield _parse(kind, line, f"{uri} line {row}", text_field)


def _parse(kind: str, line: str, where: str, text_field: str) -> tuple[dict[str, Any], str | None]:
    if kind == "text":
        return {text_field: line.rstrip("\r\n")}, None
    if not line.strip():
        return {}, f"{where} is a blank line"
    try:
        record = json.loads(line)
    except ValueError as exc:
        return {}, f"{where} is not JSON: {exc}"
    if not isinstance(record, dict):
        return {}, f"{where} is not a JSON object"
    return record, None


def _parquet_records(uri: str, skip: int) -> Iterator[tuple[dict[str, Any], None]]:
    """From row `skip` on, reading only the row groups from the one that holds it."""
    import pyarrow.parquet as pq

    filesystem_, path = filesystem(uri)
    with filesystem_.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        first, seen = 0, 0
        while first < parquet.num_row_groups and seen + parquet.metadata.row_group(first).num_rows <= skip:
            seen += parquet.metadata.row_group(first).num_rows
            first += 1
        groups = list(range(first, parquet.num_row_groups))
        if not groups:
            return
        for batch in parquet.iter_batches(batch_size=4096, row_groups=groups):
            records = batch.to_pylist()
            start = max(0, skip - seen)
            seen += len(records)
            for record in records[start:]:
                yield record, None


# -- shards that a worker reads on its own ------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """Rows `skip` to `skip + count` of one file; `offset`: the byte where the first begins,
    where the file can be entered there (uncompressed JSON Lines and text)."""

    file: str
    skip: int
    count: int
    offset: int | None = None


@dataclass(frozen=True)
class ShardPlan:
    """Where a shard's rows are, so that a worker reads them itself: the driver holds only
    this, never the rows."""

    shard: int
    first: int  # the number of its first row in the whole input
    segments: tuple[Segment, ...]


def plan(files: Sequence[str], shard_rows: int) -> Iterator[ShardPlan]:
    """The input's shards, found in one pass over it (Parquet from its footer)."""
    shard, first, segments = 0, 0, []
    number = 0
    for uri in files:
        start: tuple[int, int | None] | None = None  # (row in file, offset) where the open segment began
        for row, offset in _row_starts(uri):
            if number and number % shard_rows == 0:
                if start is not None:
                    segments.append(Segment(uri, start[0], row - start[0], start[1]))
                    start = None
                yield ShardPlan(shard, first, tuple(segments))
                shard, first, segments = shard + 1, number, []
            if start is None:
                start = (row, offset)
            number += 1
            last = row
        if start is not None:
            segments.append(Segment(uri, start[0], last + 1 - start[0], start[1]))
    if segments:
        yield ShardPlan(shard, first, tuple(segments))


def _row_starts(uri: str) -> Iterator[tuple[int, int | None]]:
    """Each row of the file: its index, and its byte offset where the file can be entered there."""
    kind = file_format(uri)
    if kind == "parquet":
        yield from ((row, None) for row in range(_parquet_rows(uri)))
        return
    if kind == "csv" or _compression(uri):
        with _open_text(uri) as handle:
            rows = sum(1 for _ in csv.DictReader(handle)) if kind == "csv" else sum(1 for _ in handle)
        yield from ((row, None) for row in range(rows))
        return
    filesystem_, path = filesystem(uri)
    with filesystem_.open_input_file(path) as raw:
        handle, offset = io.BufferedReader(raw, 1 << 20), 0
        for row, line in enumerate(handle):
            yield row, offset
            offset += len(line)


def read_shard(
    shard: ShardPlan, text_field: str = "text", id_field: str = "id", keep: Sequence[str] = ()
) -> list[Row]:
    """The shard's rows, read by whoever runs it, the same as `read_rows` reads them."""
    rows, number = [], shard.first
    for segment in shard.segments:
        records = _records(segment.file, text_field, segment.skip, segment.offset)
        for record, problem in itertools.islice(records, segment.count):
            rows.append(_row(number, record, problem, text_field, id_field, keep))
            number += 1
    return rows


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
        return Row(number, row_id, None, f"no {text_field!r} field", kept, tuple(record))
    text = record[text_field]
    if not isinstance(text, str):
        return Row(number, row_id, None, f"{text_field!r} is {type(text).__name__}, not text", kept)
    return Row(number, row_id, text, None, kept)


def stamps(files: Sequence[str]) -> list[dict[str, Any]]:
    """Each input file's size and modification time, as its filesystem says: a file whose
    stamp differs from the one a dataset's manifest recorded may have changed since."""
    found = []
    for uri in files:
        filesystem_, path = filesystem(uri)
        info = filesystem_.get_file_info(path)
        found.append({"file": uri, "size": info.size, "modified_ns": info.mtime_ns})
    return found
