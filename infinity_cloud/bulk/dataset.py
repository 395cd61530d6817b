"""A bulk job's output: a Parquet dataset, one file per shard of the input, and a manifest.

Each shard (rows [k x N, (k+1) x N) of the input, in order) is written whole or not at all:
locally to a temporary name and renamed, on S3 as one object (a PUT is atomic). Its bad rows
go to `errors/part-K.jsonl`, written before the shard's own file, so a shard whose file
exists is done, errors and all. A run started again skips those shards and embeds the rest:
every row lands exactly once however often the job is killed. The manifest, written before
the first shard, holds what the answers depend on (the model, its backend and precision, the
options, the input files); a run with other settings refuses to add to the dataset.

A file's name is not its content: the manifest also records each input's size and
modification time, and each shard's file carries a digest of the rows it was made from (in
its Parquet metadata, so it is written whole with the shard, by whichever worker wrote it).
A run that finds an input's stamp changed compares each shard written with the rows now at
its place, and embeds again those that differ (`drop_changed`): the output never mixes two
versions of an input.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Set
from contextlib import contextmanager
from typing import Any

from infinity_cloud.bulk.sources import filesystem
from infinity_cloud.core.errors import ConfigError, InfinityCloudError

MANIFEST = "_manifest.json"
# 2: the inputs' stamps in the manifest and a digest of its rows in each shard's file.
FORMAT_VERSION = 2
DIGEST_KEY = b"infinity_cloud.rows_digest"


class OutputError(InfinityCloudError):
    """The output cannot be written (disk full, read-only, a file where a folder should be)."""


def part_name(shard: int) -> str:
    return f"part-{shard:06d}.parquet"


class Dataset:
    """The output folder (local or s3://) of one job, identified by its `fingerprint`."""

    def __init__(self, out: str, fingerprint: Mapping[str, Any]) -> None:
        self.out = out.rstrip("/")
        self.fs, self.root = filesystem(self.out)
        self.fingerprint = dict(fingerprint)
        self.s3 = self.out.startswith("s3://")

    def open(self, inputs: list[dict[str, Any]] | None = None) -> set[int]:
        """Create the folder and its manifest, or check an existing one says the same job;
        returns the shards already done. `inputs`: the input files' `sources.stamps`; those
        that differ from the manifest's are left in `changed` (the caller then checks the
        shards done with `drop_changed`)."""
        from pyarrow import fs

        self.changed: list[str] = []
        with self._writing(self.root):
            self.fs.create_dir(self.root, recursive=True)
        manifest = self._read(MANIFEST)
        if manifest is None:
            self._write(
                MANIFEST,
                json.dumps(
                    {"format": FORMAT_VERSION, "job": self.fingerprint, "inputs": inputs or [],
                     "started": _now()}, indent=1
                ).encode(),
            )
        else:
            recorded = json.loads(manifest)
            if recorded.get("format", 1) < FORMAT_VERSION:
                raise ConfigError(
                    f"{self.out} was written by an earlier infinity-cloud, which did not record what its "
                    "input files held: a resume could not tell whether they changed since. Write to a new "
                    "folder, or delete this one to start again"
                )
            before = recorded.get("job", {})
            changed = sorted(
                k for k in {*before, *self.fingerprint} if before.get(k) != self.fingerprint.get(k)
            )
            if changed:
                shown = "; ".join(
                    f"{k}: {before.get(k)!r} then, {self.fingerprint.get(k)!r} now" for k in changed
                )
                raise ConfigError(
                    f"{self.out} holds the output of another job ({shown}): its vectors would not mix with "
                    "these. Write to a new folder, or delete this one to start again"
                )
            then = {stamp["file"]: stamp for stamp in recorded.get("inputs", [])}
            self.changed = [s["file"] for s in inputs or [] if then.get(s["file"]) != s]
        listed = self.fs.get_file_info(fs.FileSelector(self.root, allow_not_found=True))
        return {
            int(f.base_name[5:11])
            for f in listed
            if f.type == fs.FileType.File
            and f.base_name.startswith("part-")
            and f.base_name.endswith(".parquet")
        }

    def write_shard(self, shard: int, table: Any, errors: list[dict[str, Any]], digest: str) -> None:
        """The shard's bad rows, then its rows, with `digest` (`job.rows_digest` of the rows it
        was made from): once this returns, the shard is done."""
        import pyarrow.parquet as pq

        if errors:
            lines = "".join(json.dumps(e, default=str) + "\n" for e in errors).encode()
            self._write(error_name(shard), lines)
        else:  # one a killed run left for rows that have changed since
            _remove(self.fs, f"{self.root}/{error_name(shard)}")
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), DIGEST_KEY: digest.encode()})
        final = f"{self.root}/{part_name(shard)}"
        with self._writing(final):
            if self.s3:
                pq.write_table(table, final, filesystem=self.fs)
                return
            temporary = f"{self.root}/.{part_name(shard)}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                pq.write_table(table, temporary, filesystem=self.fs)
                self.fs.move(temporary, final)
            except BaseException:
                _remove(self.fs, temporary)  # a half-written file is no shard, and takes room
                raise

    def drop_changed(self, done: Set[int], current: Mapping[int, str]) -> set[int]:
        """Of the shards `done`, those whose rows' digest is `current`'s (the rows now at their
        place in the input; absent: the input no longer reaches that far); each other shard
        is deleted, its bad rows too, to be embedded again."""
        import pyarrow.parquet as pq

        kept = set()
        for shard in sorted(done):
            path = f"{self.root}/{part_name(shard)}"
            with self.fs.open_input_file(path) as handle:
                metadata = pq.read_schema(handle).metadata or {}
            recorded = metadata.get(DIGEST_KEY, b"").decode()
            if recorded and recorded == current.get(shard):
                kept.add(shard)
                continue
            with self._writing(path):
                _remove(self.fs, f"{self.root}/{error_name(shard)}")
                self.fs.delete_file(path)
        return kept

    def errors(self, done: Set[int]) -> int:
        """Bad rows set aside so far, over the shards `done`."""
        from pyarrow import fs

        listed = self.fs.get_file_info(fs.FileSelector(f"{self.root}/errors", allow_not_found=True))
        names = {error_name(shard).removeprefix("errors/") for shard in done}
        total = 0
        for info in listed:
            if info.type == fs.FileType.File and info.base_name in names:
                with self.fs.open_input_stream(info.path) as handle:
                    total += handle.read().count(b"\n")
        return total

    def summary(self) -> dict[str, Any] | None:
        """The summary of the last run that embedded something, where one finished."""
        manifest = json.loads(self._read(MANIFEST) or b"{}")
        return manifest.get("summary")

    def finish(self, summary: Mapping[str, Any] | None, inputs: list[dict[str, Any]] | None = None) -> None:
        """The summary into the manifest (None: the one there stays), and the inputs' stamps as
        this run found them: every shard now matches them."""
        manifest = json.loads(self._read(MANIFEST) or b"{}")
        if summary is not None:
            manifest.update(finished=_now(), summary=dict(summary))
        if inputs is not None:
            manifest["inputs"] = inputs
        self._write(MANIFEST, json.dumps(manifest, indent=1).encode())

    @contextmanager
    def _writing(self, path: str) -> Iterator[None]:
        """An OSError writing the output (no space, read-only, a file where a folder should be)
        as one line naming it; the shards written before it are kept."""
        try:
            yield
        except OSError as exc:
            reason = (exc.strerror or str(exc).splitlines()[0]).rstrip(".")
            shown = self.out + path.removeprefix(self.root)  # s3:// as the caller wrote it
            raise OutputError(
                f"cannot write {shown}: {reason}. The shards written are kept: fix that and run the same "
                "command to resume"
            ) from None

    def _read(self, name: str) -> bytes | None:
        from pyarrow import fs

        path = f"{self.root}/{name}"
        if self.fs.get_file_info(path).type != fs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as handle:
            return handle.read()

    def _write(self, name: str, data: bytes) -> None:
        path = f"{self.root}/{name}"
        folder = path.rsplit("/", 1)[0]
        with self._writing(path):
            self.fs.create_dir(folder, recursive=True)
            if self.s3:
                with self.fs.open_output_stream(path) as handle:
                    handle.write(data)
                return
            temporary = f"{folder}/.{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                with self.fs.open_output_stream(temporary) as handle:
                    handle.write(data)
                self.fs.move(temporary, path)
            except BaseException:
                _remove(self.fs, temporary)
                raise


def error_name(shard: int) -> str:
    return f"errors/part-{shard:06d}.jsonl"


def _remove(files: Any, path: str) -> None:
    from pyarrow import fs

    try:
        if files.get_file_info(path).type == fs.FileType.File:
            files.delete_file(path)
    except OSError:
        pass  # what could not be removed is no shard either way (a .tmp name, or rewritten later)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
