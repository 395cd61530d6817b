"""`infinity-cloud embed`: a corpus into a Parquet dataset, on this machine. Vectors against
sentence-transformers on the same model; every input format; bad rows set aside with their
reason; a run killed with SIGKILL and started again lands every row exactly once; a run with
other settings refuses to add to the output."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import FAKE, ROOT, cosines
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli

runner = CliRunner()
WORDS = [
    "the",
    "server",
    "batches",
    "passages",
    "by",
    "length",
    "so",
    "every",
    "core",
    "stays",
    "busy",
    "while",
    "a",
    "corpus",
    "streams",
    "through",
    "an",
    "embedding",
    "model",
    "and",
    "lands",
    "in",
    "parquet",
    "shards",
]


def corpus(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {"id": f"doc-{i}", "text": " ".join(rng.choice(WORDS, int(rng.integers(2, 40)))), "lang": "en"}
        for i in range(count)
    ]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def on_torch(model: Path) -> list[str]:
    """The model options the tests run the tiny model with: torch, its own float32."""
    return ["--model-id", str(model), "--backend", "torch"]


def embed(*argv: str) -> Any:
    result = runner.invoke(cli, ["embed", *argv])
    return result


def read(out: Path) -> pa.Table:
    table = pq.read_table(sorted(out.glob("part-*.parquet")))
    return table.sort_by("row")


def summary_of(result: Any) -> dict[str, Any]:
    return json.loads(result.stdout[result.stdout.index("{") :])


def test_a_corpus_is_embedded_as_sentence_transformers_embeds_it(minilm_dir: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    records = corpus(300)
    source = write_jsonl(tmp_path / "corpus.jsonl", records)
    result = embed(
        str(source),
        "--out",
        str(tmp_path / "out"),
        "--model-id",
        str(minilm_dir),
        "--backend",
        "torch",
        "--dtype",
        "float32",
        "--keep-field",
        "lang",
        "--shard-rows",
        "128",
    )
    assert result.exit_code == 0, result.output
    table = read(tmp_path / "out")
    assert table.column_names == ["id", "row", "embedding", "lang"]
    assert table["id"].to_pylist() == [r["id"] for r in records]
    assert table["row"].to_pylist() == list(range(300)) and set(table["lang"].to_pylist()) == {"en"}
    assert pa.types.is_fixed_size_list(table.schema.field("embedding").type)
    assert table.schema.field("embedding").type.value_type == pa.float32()
    got = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    want = SentenceTransformer(str(minilm_dir), device="cpu").encode([r["text"] for r in records])
    assert cosines(got, want).min() > 0.9999
    summary = summary_of(result)
    assert summary["rows"] == 300 and summary["bad_rows"] == 0 and summary["tokens"] > 300
    assert len(list((tmp_path / "out").glob("part-*.parquet"))) == 3  # 128-row shards
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["summary"]["rows"] == 300 and manifest["job"]["model"]["dtype"] == "float32"


def test_every_input_format_gives_the_same_rows(tiny_embedder: Path, tmp_path: Path) -> None:
    records = corpus(40, seed=1)
    texts = [r["text"] for r in records]
    write_jsonl(tmp_path / "a.jsonl", records)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))
    with (tmp_path / "c.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["id", "text", "lang"])
        writer.writeheader()
        writer.writerows(records)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    (tmp_path / "e.txt").write_text("".join(t + "\n" for t in texts))
    vectors = {}
    for name in ("a.jsonl", "b.jsonl.gz", "c.csv", "d.parquet", "e.txt"):
        out = tmp_path / f"out-{name}"
        result = embed(
            str(tmp_path / name),
            "--out",
            str(out),
            *on_torch(tiny_embedder),
            "--dtype",
            "float32",
        )
        assert result.exit_code == 0, f"{name}: {result.output}"
        table = read(out)
        expected = [r["id"] for r in records] if name != "e.txt" else [str(i) for i in range(40)]
        assert table["id"].to_pylist() == expected, name
        vectors[name] = np.array(table["embedding"].to_pylist())
    for name, got in vectors.items():
        np.testing.assert_allclose(got, vectors["a.jsonl"], atol=1e-5, err_msg=name)
    # A glob takes every file it matches, in order, as one input.
    both = embed(
        str(tmp_path / "[ad].*"),
        "--out",
        str(tmp_path / "glob"),
        *on_torch(tiny_embedder),
    )
    assert both.exit_code == 0, both.output
    assert read(tmp_path / "glob")["row"].to_pylist() == list(range(80))


def test_bad_rows_go_to_the_error_file_and_the_job_goes_on(tiny_embedder: Path, tmp_path: Path) -> None:
    good = corpus(20, seed=2)
    lines = [json.dumps(r) for r in good[:5]]
    lines += [
        '{"id": "empty", "text": "  "}',
        '{"id": "none"}',
        '{"id": "number", "text": 42}',
        "{not json",
        '["a list"]',
    ]
    lines += [json.dumps({"id": "long", "text": "word " * 5000})]
    lines += [json.dumps(r) for r in good[5:]]
    source = tmp_path / "mixed.jsonl"
    source.write_text("\n".join(lines) + "\n")
    result = embed(
        str(source),
        "--out",
        str(tmp_path / "out"),
        *on_torch(tiny_embedder),
        "--no-truncate",
        "--shard-rows",
        "8",
    )
    assert result.exit_code == 0, result.output
    errors = [
        json.loads(line)
        for f in sorted((tmp_path / "out" / "errors").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    reasons = {e["id"]: e["error"] for e in errors}
    assert reasons["empty"] == "empty text" and reasons["none"] == "no 'text' field"
    assert reasons["number"] == "'text' is int, not text"
    assert "more than the model's limit" in reasons["long"]
    assert [e["row"] for e in errors if "not JSON" in e["error"] or "not a JSON object" in e["error"]] == [
        8,
        9,
    ]
    table = read(tmp_path / "out")
    assert table["id"].to_pylist() == [r["id"] for r in good]  # every good row, once, in order
    assert summary_of(result)["bad_rows"] == 6


def test_images_by_path_or_url_are_embedded_as_transformers_embeds_them(
    build_model: Any, tmp_path: Path
) -> None:
    """--modality image: the field holds each image's path (or a data: URI, or an http(s)
    URL); CLIP's image vectors as transformers' CLIPModel and its image processor make them.
    A file that is not there and one that is no picture are bad rows with their reason."""
    from test_images import data_uri, picture, reference

    clip = build_model("clip")
    names = ("a.png", "b.png", "c.png")
    pictures = {name: picture(40 + 7 * i, 30 + 5 * i, i) for i, name in enumerate(names)}
    for name, data in pictures.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "text.png").write_bytes(b"this is not a picture")
    rows = [{"id": "a", "image": str(tmp_path / "a.png")},
            {"id": "missing", "image": str(tmp_path / "no.png")},
            {"id": "b", "image": data_uri(pictures["b.png"])},
            {"id": "broken", "image": str(tmp_path / "text.png")},
            {"id": "c", "image": str(tmp_path / "c.png")}]
    source = write_jsonl(tmp_path / "images.jsonl", rows)
    out = tmp_path / "out"
    result = embed(str(source), "--out", str(out), "--model-id", str(clip), "--backend", "torch",
                   "--modality", "image", "--text-field", "image")
    assert result.exit_code == 0, result.output
    table = read(out)
    assert table["id"].to_pylist() == ["a", "b", "c"]
    _, want = reference(clip, [], [pictures[n] for n in names])
    got = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    assert cosines(got, want).min() > 0.9999
    errors = {json.loads(line)["id"]: json.loads(line)["error"]
              for f in (out / "errors").glob("*.jsonl") for line in f.read_text().splitlines()}
    assert set(errors) == {"missing", "broken"} and "cannot read" in errors["missing"], errors
    assert summary_of(result)["bad_rows"] == 2


def test_max_errors_stops_the_job_and_keeps_what_was_done(tiny_embedder: Path, tmp_path: Path) -> None:
    records = corpus(30, seed=3)
    for record in records[10:]:
        record["text"] = ""
    source = write_jsonl(tmp_path / "bad.jsonl", records)
    result = embed(
        str(source),
        "--out",
        str(tmp_path / "out"),
        *on_torch(tiny_embedder),
        "--shard-rows",
        "10",
        "--max-errors",
        "5",
    )
    assert result.exit_code != 0
    assert "more than --max-errors 5" in " ".join(result.output.split())
    written = {p.name for p in (tmp_path / "out").glob("part-*.parquet")}
    assert len(written) < 3
    # Allowed more, the same job goes on from the shards it wrote.
    more = embed(
        str(source),
        "--out",
        str(tmp_path / "out"),
        *on_torch(tiny_embedder),
        "--shard-rows",
        "10",
        "--max-errors",
        "50",
    )
    assert more.exit_code == 0, more.output
    assert summary_of(more)["shards_skipped"] == len(written)
    assert read(tmp_path / "out")["row"].to_pylist() == list(range(10))


def test_a_run_with_other_settings_refuses_to_add_to_the_output(tiny_embedder: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "c.jsonl", corpus(10, seed=4))
    first = embed(
        str(source), "--out", str(tmp_path / "out"), "--model-id", str(tiny_embedder), "--backend", "torch"
    )
    assert first.exit_code == 0, first.output
    again = embed(
        str(source), "--out", str(tmp_path / "out"), "--model-id", str(tiny_embedder), "--backend", "torch"
    )
    assert (
        again.exit_code == 0 and summary_of(again)["shards_skipped"] == 1 and summary_of(again)["rows"] == 0
    )
    other = embed(
        str(source),
        "--out",
        str(tmp_path / "out"),
        *on_torch(tiny_embedder),
        "--no-truncate",
    )
    assert other.exit_code != 0
    said = " ".join(other.output.split())
    assert "holds the output of another job" in said and "truncate: True then, False now" in said


def test_a_killed_run_resumes_and_lands_every_row_exactly_once(tiny_embedder: Path, tmp_path: Path) -> None:
    """SIGKILL in the middle (shards written, others in flight), then the same command: the
    rest is embedded, nothing twice, nothing lost."""
    records = corpus(400, seed=5)
    records[123]["text"] = ""
    source = write_jsonl(tmp_path / "c.jsonl", records)
    config = tmp_path / "spec.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "model_id": str(tiny_embedder),
                        "backend": FAKE,
                        "max_batch_size": 8,
                        "backend_options": {"delay_s": 0.05},
                    }
                ]
            }
        )
    )
    command = [
        sys.executable,
        "-m",
        "infinity_cloud",
        "embed",
        str(source),
        "--out",
        str(tmp_path / "out"),
        "--config",
        str(config),
        "--shard-rows",
        "25",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "out").glob("part-*.parquet"))) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    killed_with = len(list((tmp_path / "out").glob("part-*.parquet")))
    assert killed_with < 16, "it finished before the kill: nothing was resumed"
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, encoding="utf-8", errors="replace", timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["shards_skipped"] >= killed_with >= 4
    table = read(tmp_path / "out")
    assert table["row"].to_pylist() == [i for i in range(400) if i != 123]  # each once, in order
    assert table["id"].to_pylist() == [r["id"] for i, r in enumerate(records) if i != 123]
    errors = (tmp_path / "out" / "errors").glob("*.jsonl")
    assert [json.loads(line)["row"] for f in errors for line in f.read_text().splitlines()] == [123]
    assert not list((tmp_path / "out").glob(".*.tmp"))  # a half-written shard never shows as one


def test_shards_read_by_a_worker_are_the_rows_read_in_order(tmp_path: Path) -> None:
    """`plan` + `read_shard` (what a Ray actor reads on its own, from byte offsets and row
    groups) give exactly the rows that one sequential read gives, shard by shard, in every
    format: blank lines, CRLF, a line that is not JSON, compressed files, several row groups."""
    from infinity_cloud.bulk import sources
    from infinity_cloud.bulk.job import shards

    records = corpus(57, seed=7)
    lines = [json.dumps(r) for r in records[:20]]
    crlf = "\r\n".join(lines[:10]) + "\r\n\n\n"
    (tmp_path / "a.jsonl").write_text(crlf + "\n".join(lines[10:]) + "\n{oops\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records[20:30]))
    with (tmp_path / "c.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["id", "text", "lang"])
        writer.writeheader()
        writer.writerows([{**r, "text": r["text"] + "\nsecond line"} for r in records[30:40]])
    pq.write_table(pa.Table.from_pylist(records[40:]), tmp_path / "d.parquet", row_group_size=4)
    (tmp_path / "e.txt").write_text("one\n\ntwo\r\nthree")
    files = sources.expand([str(tmp_path / "*")])
    sequential = list(sources.read_rows(files, keep=("lang",)))
    assert len(sequential) == 20 + 1 + 10 + 10 + 17 + 4
    for size in (1, 3, 8, 1000):
        planned = list(sources.plan(files, size))
        assert [p.shard for p in planned] == list(range(len(planned)))
        read = {p.shard: sources.read_shard(p, keep=("lang",)) for p in planned}
        assert read == dict(shards(sequential, size)), size


def test_ray_finishes_a_job_the_local_runner_was_killed_in(tiny_embedder: Path, tmp_path: Path) -> None:
    """A real local Ray cluster (two actors, one engine each) takes up a job whose local run
    was killed: the shards already written are skipped, the rest land once, and the vectors
    are the local runner's."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    records = corpus(300, seed=8)
    source = write_jsonl(tmp_path / "c.jsonl", records)
    model = [
        "--model-id",
        str(tiny_embedder),
        "--backend",
        "torch",
        "--dtype",
        "float32",
        "--shard-rows",
        "20",
    ]
    whole = embed(str(source), "--out", str(tmp_path / "whole"), *model)
    assert whole.exit_code == 0, whole.output
    out = Path(shutil.copytree(tmp_path / "whole", tmp_path / "out"))
    for shard in range(15):  # what a killed run leaves: its manifest and some shards, not in order
        if shard not in (0, 3, 4):
            (out / f"part-{shard:06d}.parquet").unlink()
    command = [
        sys.executable,
        "-m",
        "infinity_cloud",
        "embed",
        str(source),
        "--out",
        str(out),
        *model,
        "--runner",
        "ray",
        "--actors",
        "2",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, encoding="utf-8", errors="replace", timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["runner"] == "ray" and summary["workers"] == 2 and summary["shards_skipped"] == 3
    assert summary["rows"] == 240 and summary["engines"] == ["torch float32"]
    got, want = read(out), read(tmp_path / "whole")
    assert got["row"].to_pylist() == list(range(300)) and got["id"].to_pylist() == want["id"].to_pylist()
    vectors = [np.array(table["embedding"].to_pylist()) for table in (got, want)]
    np.testing.assert_allclose(*vectors, atol=1e-5)
