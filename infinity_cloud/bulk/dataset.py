"""A bulk job's output: a Parquet dataset, one file per shard of the input, and a manifest.

Each shard (rows [k x N, (k+1) x N) of the input, in order) is written whole or not at all:
locally to a temporary name and renamed, on S3 as one object (a PUT is atomic). Its bad rows
go to `errors/part-K.jsonl`, written before the shard's own file, so a shard whose file
exists is done, errors and all. A run started again skips those shards and embeds the rest:
every row lands exactly once however often the job is killed. The manifest, written before
the first shard, holds what the answers depend on (the model, its backend and precision, the
options, the input files); a run with other settings refuses to add to the dataset.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from infinity_cloud.bulk.sources import filesystem
from infinity_cloud.errors import ConfigError

MANIFEST = "_manifest.json"
FORMAT_VERSION = 1


def part_name(shard: int) -> str:
    return f"part-{shard:06d}.parquet"


class Dataset:
    """The output folder (local or s3://) of one job, identified by its `fingerprint`."""

    def __init__(self, out: str, fingerprint: Mapping[str, Any]) -> None:
        self.out = out.rstrip("/")
        self.fs, self.root = filesystem(self.out)
        self.fingerprint = dict(fingerprint)
        self.s3 = self.out.startswith("s3://")

    def open(self) -> set[int]:
        """Create the folder and its manifest, or check an existing one says the same job;
        returns the shards already done."""
        from pyarrow import fs

        self.fs.create_dir(self.root, recursive=True)
        manifest = self._read(MANIFEST)
        if manifest is None:
            self._write(
                MANIFEST,
                json.dumps(
                    {"format": FORMAT_VERSION, "job": self.fingerprint, "started": _now()}, indent=1
                ).encode(),
            )
        else:
            before = json.loads(manifest).get("job", {})
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
        listed = self.fs.get_file_info(fs.FileSelector(self.root, allow_not_found=True))
        return {
            int(f.base_name[5:11])
            for f in listed
            if f.type == fs.FileType.File
            and f.base_name.startswith("part-")
            and f.base_name.endswith(".parquet")
        }

    def write_shard(self, shard: int, table: Any, errors: list[dict[str, Any]]) -> None:
        """The shard's bad rows, then its rows: once this returns, the shard is done."""
        import pyarrow.parquet as pq

        if errors:
            lines = "".join(json.dumps(e, default=str) + "\n" for e in errors).encode()
            self._write(f"errors/part-{shard:06d}.jsonl", lines)
        final = f"{self.root}/{part_name(shard)}"
        if self.s3:
            pq.write_table(table, final, filesystem=self.fs)
            return
        temporary = f"{self.root}/.{part_name(shard)}.{uuid.uuid4().hex[:8]}.tmp"
        pq.write_table(table, temporary, filesystem=self.fs)
        self.fs.move(temporary, final)

    def errors(self) -> int:
        """Bad rows set aside so far, over every shard done."""
        from pyarrow import fs

        listed = self.fs.get_file_info(fs.FileSelector(f"{self.root}/errors", allow_not_found=True))
        total = 0
        for info in listed:
            if info.type == fs.FileType.File and info.base_name.endswith(".jsonl"):
                with self.fs.open_input_stream(info.path) as handle:
                    total += handle.read().count(b"\n")
        return total

    def finish(self, summary: Mapping[str, Any]) -> None:
        manifest = json.loads(self._read(MANIFEST) or b"{}")
        manifest.update(finished=_now(), summary=dict(summary))
        self._write(MANIFEST, json.dumps(manifest, indent=1).encode())

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
        self.fs.create_dir(folder, recursive=True)
        if self.s3:
            with self.fs.open_output_stream(path) as handle:
                handle.write(data)
            return
        temporary = f"{folder}/.{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
        with self.fs.open_output_stream(temporary) as handle:
            handle.write(data)
        self.fs.move(temporary, path)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
