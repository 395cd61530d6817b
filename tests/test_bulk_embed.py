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
    """Each bad row is set aside with its reason and its place in the input: a blank line is
    one (it was dropped without a word), and a text the model refuses is named by its row, not
    by its place in the shard's call (it said "input 2"). Whether a text can be embedded is the
    engine's one check, the server's: an empty string is refused with its words, a text of
    spaces is embedded, as the server embeds it (the job called it "empty")."""
    good = corpus(20, seed=2)
    lines = [json.dumps(r) for r in good[:5]]
    lines += [
        '{"id": "spaces", "text": "  "}',
        '{"id": "empty", "text": ""}',
        '{"id": "none"}',
        '{"id": "number", "text": 42}',
        "{not json",
        '["a list"]',
        "",
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
        "--max-error-rate",
        "0.5",
    )
    assert result.exit_code == 0, result.output
    errors = [
        json.loads(line)
        for f in sorted((tmp_path / "out" / "errors").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    reasons = {e["id"]: e["error"] for e in errors}
    assert reasons["empty"] == "row 6 is an empty string" and reasons["none"] == "no 'text' field"
    assert reasons["number"] == "'text' is int, not text"
    assert reasons["long"].startswith("row 12 has ") and "more than the model's limit" in reasons["long"]
    assert [e["row"] for e in errors if "not JSON" in e["error"] or "not a JSON object" in e["error"]] == [
        9,
        10,
    ]
    assert [e["error"] for e in errors if e["row"] == 11] == [f"{source} line 12 is a blank line"]
    table = read(tmp_path / "out")
    embedded = [r["id"] for r in good[:5]] + ["spaces"] + [r["id"] for r in good[5:]]
    assert table["id"].to_pylist() == embedded  # every good row, once, in order
    summary = summary_of(result)
    assert summary["bad_rows"] == 7 and summary["embedded"] == 21 and summary["rows"] == 28


def test_a_text_of_spaces_is_embedded_by_the_server_too(tiny_embedder: Path) -> None:
    """The server and the bulk job agree: a text of spaces is a text; an empty one is a 400."""
    import asyncio

    from conftest import serve_in_process, spec_of

    from infinity_cloud.core.config import ModelSpec

    async def check() -> None:
        spec = spec_of(ModelSpec(model_id=str(tiny_embedder), backend="torch"))
        async with serve_in_process(spec) as client:
            spaces = await client.post("/v1/embeddings", json={"input": ["  "]})
            empty = await client.post("/v1/embeddings", json={"input": [""]})
        assert spaces.status_code == 200 and len(spaces.json()["data"]) == 1, spaces.text
        assert empty.status_code == 400 and "empty string" in empty.text, empty.text

    asyncio.run(check())


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
                   "--modality", "image", "--text-field", "image", "--max-error-rate", "0.5")
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
        "--max-error-rate",
        "1",
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
        "--max-error-rate",
        "1",
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
    # Nothing left to do: the summary stays that of the run that did the work (it was all zeros).
    assert again.exit_code == 0 and summary_of(again)["shards_skipped"] == 1, again.output
    assert summary_of(again)["rows"] == 10 and summary_of(again)["this_run"] == "nothing left to do"
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["summary"]["rows"] == 10 and manifest["summary"]["texts_per_s"] > 0
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
    assert len(sequential) == 20 + 2 + 1 + 10 + 10 + 17 + 4  # each blank line is a (bad) row
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


def slow_fake_spec(model: Path, path: Path, delay_s: float = 0.05) -> Path:
    """A spec whose fake backend takes its time, so that a run can be stopped midway."""
    spec = {"models": [{"model_id": str(model), "backend": FAKE, "max_batch_size": 8,
                        "backend_options": {"delay_s": delay_s}}]}
    path.write_text(yaml.safe_dump(spec))
    return path


def start_and_stop(command: list[str], out: Path, shards: int, how: int) -> subprocess.Popen[bytes]:
    """Run `command`, and send it `how` once `shards` shards are written."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list(out.glob("part-*.parquet"))) < shards:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:]
        time.sleep(0.05)
    proc.send_signal(how)
    proc.wait(60)
    return proc


def test_an_input_edited_after_a_kill_is_embedded_again_not_mixed(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """Issue 50, N3: SIGKILL after 4 shards, a line added at the top of the same file, the same
    command again: it ended with exit 0, 4 shards skipped, one id twice and the new row missing.
    The manifest records each input's size and time, each shard a digest of its rows: the
    shards whose rows moved are embedded again."""
    records = corpus(400, seed=9)
    source = write_jsonl(tmp_path / "c.jsonl", records)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "infinity_cloud", "embed", str(source), "--out", str(out), "--config",
               str(slow_fake_spec(tiny_embedder, tmp_path / "spec.yaml")), "--shard-rows", "25"]
    start_and_stop(command, out, 4, signal.SIGKILL)
    assert len(list(out.glob("part-*.parquet"))) < 16, "it finished before the kill: nothing was resumed"
    edited = [{"id": "new", "text": "a line added at the top"}, *records]
    write_jsonl(source, edited)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = read(out)
    assert table["id"].to_pylist() == [r["id"] for r in edited]  # each once, in the file's order
    assert table["row"].to_pylist() == list(range(401))
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["inputs"] == [{"file": str(source), "size": source.stat().st_size,
                                   "modified_ns": source.stat().st_mtime_ns}]
    # Only the file's times changed, not its rows: every shard is kept.
    os.utime(source, ns=(time.time_ns(), time.time_ns() + 10**9))
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout[again.stdout.index("{"):])["shards_skipped"] == 17


def test_an_output_of_an_earlier_format_is_refused_with_the_reason(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """A manifest without the inputs' stamps (format 1) cannot tell whether they changed: the
    job refuses it, saying so, rather than trusting it."""
    source = write_jsonl(tmp_path / "c.jsonl", corpus(10, seed=10))
    out = tmp_path / "out"
    first = embed(str(source), "--out", str(out), *on_torch(tiny_embedder))
    assert first.exit_code == 0, first.output
    manifest = json.loads((out / "_manifest.json").read_text())
    manifest["format"] = 1
    manifest.pop("inputs")
    (out / "_manifest.json").write_text(json.dumps(manifest))
    again = embed(str(source), "--out", str(out), *on_torch(tiny_embedder))
    assert again.exit_code != 0
    assert "written by an earlier infinity-cloud" in " ".join(again.output.split())


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A tmpfs of the size asked (read-only where asked): the faults a full or read-only disk
    really gives. Needs root and a kernel that lets this sandbox mount one."""
    mounted = []

    def mount(size: str, read_only: bool = False) -> Path:
        point = tmp_path / f"disk-{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_an_output_that_cannot_be_written_is_one_clear_line(
    tiny_embedder: Path, tmp_path: Path, small_disk: Any
) -> None:
    """Issue 50, N5: a full disk, a read-only output and a file where the folder should be each
    ended in raw tracebacks (three on a full disk) and "Task exception was never retrieved".
    Each is one line naming the path and the reason; the shards written are kept."""
    source = write_jsonl(tmp_path / "c.jsonl", corpus(3000, seed=11))
    (tmp_path / "a-file").write_text("not a folder")
    outs = {
        "No space left on device": small_disk("96k") / "out",
        "Read-only file system": small_disk("1m", read_only=True) / "out",
        "Not a directory": tmp_path / "a-file" / "out",
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for reason, out in outs.items():
        done = subprocess.run(
            [sys.executable, "-m", "infinity_cloud", "embed", str(source), "--out", str(out), "--config",
             str(slow_fake_spec(tiny_embedder, tmp_path / "spec.yaml", 0.0)), "--shard-rows", "100"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )
        assert done.returncode != 0, done.stdout
        said = [line for line in done.stderr.splitlines() if " INFO " not in line and line.strip()]
        assert len(said) == 1 and said[0].startswith("error: cannot write "), done.stderr[-3000:]
        assert reason in said[0] and "run the same command to resume" in said[0], said
    written = sorted(outs["No space left on device"].glob("part-*.parquet"))
    assert written and pq.read_table(written).num_rows == 100 * len(written)  # each shard there is whole
    assert not list(outs["No space left on device"].glob(".*.tmp"))  # and no half-written one took room


def test_a_job_that_embedded_nothing_fails_and_names_the_cause(tiny_embedder: Path, tmp_path: Path) -> None:
    """Issue 50: `--text-field body` where no row has `body` exited 0, with every row an error
    and texts/s counting them. It fails, naming the field and the fields seen, even allowed
    every row bad; its rates count embedded rows only."""
    source = write_jsonl(tmp_path / "c.jsonl", corpus(50, seed=12))
    out = tmp_path / "out"
    result = embed(str(source), "--out", str(out), *on_torch(tiny_embedder), "--text-field", "body",
                   "--shard-rows", "10", "--max-error-rate", "1")
    assert result.exit_code != 0
    said = " ".join(result.output.split())
    assert "no row has the field 'body'; fields seen: id, lang, text" in said, said
    summary = json.loads((out / "_manifest.json").read_text())["summary"]
    assert summary["bad_rows"] == 50 and summary["embedded"] == 0 and summary["texts_per_s"] == 0
    # With the default --max-error-rate (1 %) it stops after its first shard, for the same reason.
    stopped = embed(str(source), "--out", str(tmp_path / "stopped"), *on_torch(tiny_embedder), "--text-field",
                    "body", "--shard-rows", "10")
    assert stopped.exit_code != 0 and "no row has the field 'body'" in " ".join(stopped.output.split())
    assert len(list((tmp_path / "stopped").glob("part-*.parquet"))) < 5


def test_more_bad_rows_than_max_error_rate_fail_the_job(tiny_embedder: Path, tmp_path: Path) -> None:
    records = corpus(200, seed=13)
    records[7]["text"] = ""  # 1 of 200: within the default 1 %
    source = write_jsonl(tmp_path / "c.jsonl", records)
    fine = embed(str(source), "--out", str(tmp_path / "fine"), *on_torch(tiny_embedder))
    assert fine.exit_code == 0, fine.output
    assert summary_of(fine)["embedded"] == 199 and summary_of(fine)["bad_rows"] == 1
    for i in (20, 40, 60):  # 4 of 200
        records[i]["text"] = ""
    write_jsonl(source, records)
    failed = embed(str(source), "--out", str(tmp_path / "failed"), *on_torch(tiny_embedder))
    assert failed.exit_code != 0
    said = " ".join(failed.output.split())
    assert "4 bad rows, more than --max-error-rate 0.01 of 200" in said and "row 7 is an empty string" in said
    allowed = embed(str(source), "--out", str(tmp_path / "failed"), *on_torch(tiny_embedder),
                    "--max-error-rate", "0.05")
    assert allowed.exit_code == 0, allowed.output


def test_ctrl_c_says_how_to_resume(tiny_embedder: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "c.jsonl", corpus(400, seed=14))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "infinity_cloud", "embed", str(source), "--out", str(out), "--config",
               str(slow_fake_spec(tiny_embedder, tmp_path / "spec.yaml")), "--shard-rows", "25"]
    proc = start_and_stop(command, out, 2, signal.SIGINT)
    stderr = proc.stderr.read().decode()
    assert proc.returncode == 130, stderr[-3000:]
    assert "run the same command to resume" in stderr and "Traceback" not in stderr, stderr[-3000:]


def test_workers_loading_the_model_is_a_step_not_a_bar_at_zero(tmp_path: Path, caplog: Any) -> None:
    """Ray's and Modal's workers load (export) the model before their first shard: the driver
    shows that as a step, and its bar starts with the first shard done."""
    import logging

    from infinity_cloud.bulk.dataset import Dataset
    from infinity_cloud.bulk.job import EmbedJob
    from infinity_cloud.bulk.meter import Meter
    from infinity_cloud.bulk.workers import PlannedJob, collect

    planned = PlannedJob(Dataset(str(tmp_path / "out"), {}), set(), [], Meter(20), [])
    seen = []

    def reports() -> Any:
        seen.append([r.getMessage() for r in caplog.records])
        for _ in range(2):
            yield {"rows": 10, "tokens": 30, "errors": 0, "backend": "torch", "dtype": "float32"}

    with caplog.at_level(logging.INFO, logger="infinity_cloud"):
        collect(planned, reports(), EmbedJob(("x.jsonl",), str(tmp_path / "out")))
    assert any("starting the workers" in line and "export" in line for line in seen[0]), seen
    said = [r.getMessage() for r in caplog.records]
    assert any("starting the workers" in line and "done in" in line for line in said), said
    assert planned.meter.rows == 20


def test_a_changed_input_re_embeds_only_its_changed_shards_on_every_runner(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """One text edited in the middle of a finished job's input: the drivers of Ray, Modal and
    SageMaker (`plan_job`) plan that shard alone again (its file is gone until it is), and
    the local runner embeds that one alone."""
    import asyncio

    from conftest import spec_of

    from infinity_cloud.bulk.job import EmbedJob
    from infinity_cloud.bulk.local_runner import run_local
    from infinity_cloud.bulk.workers import plan_job
    from infinity_cloud.core.config import ModelSpec

    records = corpus(60, seed=15)
    source = write_jsonl(tmp_path / "c.jsonl", records)
    spec = spec_of(ModelSpec(model_id=str(tiny_embedder), backend="torch"))
    job = EmbedJob((str(source),), str(tmp_path / "out"), shard_rows=10)
    asyncio.run(run_local(spec, job))
    records[25]["text"] = "an edited text"
    write_jsonl(source, records)
    planned = plan_job(spec, job)
    assert [p.shard for p in planned.todo] == [2] and planned.done == {0, 1, 3, 4, 5}
    assert not (tmp_path / "out" / "part-000002.parquet").exists()
    summary = asyncio.run(run_local(spec, job))
    assert summary["rows"] == 10 and summary["shards_skipped"] == 5
    table = read(tmp_path / "out")
    assert table["id"].to_pylist() == [r["id"] for r in records]


def documents(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Texts of 1 to 12 sentences (most several chunks of 16 tokens), the sixth empty."""
    rng = np.random.default_rng(seed)
    records = [
        {"id": f"doc-{i}", "lang": "en", "text": " ".join(
            " ".join(rng.choice(WORDS, int(rng.integers(3, 12)))).capitalize() + "."
            for _ in range(int(rng.integers(1, 13))))}
        for i in range(count)
    ]
    if count > 5:
        records[5]["text"] = ""
    return records


def chunk_rows(table: pa.Table) -> pa.Table:
    return table.sort_by([("row", "ascending"), ("chunk", "ascending")])


def test_a_chunked_job_writes_a_row_per_chunk_as_the_chunked_route_cuts_them(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """`--chunk-tokens 16 --overlap-tokens 4`: one row per chunk, with its document's id and
    row, its number, character offsets, tokens and text, and the vector the engine's chunked
    call gives the same document (the route's `/v1/embeddings/chunked`)."""
    import asyncio

    from infinity_cloud.core.config import ModelSpec
    from infinity_cloud.engine import Engine
    from infinity_cloud.engine.asks import ChunkedEmbedAsk

    records = documents(30, seed=3)
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    result = embed(str(source), "--out", str(tmp_path / "out"), *on_torch(tiny_embedder), "--dtype",
                   "float32", "--shard-rows", "7", "--keep-field", "lang", "--chunk-tokens", "16",
                   "--overlap-tokens", "4", "--max-error-rate", "0.1")
    assert result.exit_code == 0, result.output
    table = chunk_rows(read(tmp_path / "out"))
    assert table.column_names == ["id", "row", "chunk", "start", "end", "tokens", "text", "embedding", "lang"]
    good = [r["text"] for i, r in enumerate(records) if i != 5]

    async def chunked() -> Any:
        async with Engine(ModelSpec(model_id=str(tiny_embedder), backend="torch", dtype="float32")) as engine:
            return await engine.chunked_embeddings(ChunkedEmbedAsk(good, chunk_tokens=16, overlap_tokens=4))

    want = asyncio.run(chunked())
    expected = [(row, n, start, end, tokens)
                for row, spans in zip([i for i in range(30) if i != 5], want.spans, strict=True)
                for n, (start, end, tokens) in enumerate(spans)]
    got = list(zip(*(table[c].to_pylist() for c in ("row", "chunk", "start", "end", "tokens")), strict=True))
    assert got == expected and len(got) > 60  # several chunks a document
    assert table["id"].to_pylist() == [records[row]["id"] for row, *_ in expected]
    assert table["text"].to_pylist() == [records[row]["text"][s:e] for row, _, s, e, _ in expected]
    assert set(table["lang"].to_pylist()) == {"en"} and max(table["tokens"].to_pylist()) <= 16
    vectors = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    assert cosines(vectors, want.embeddings).min() > 0.9999
    errors = [json.loads(line) for f in (tmp_path / "out" / "errors").glob("*.jsonl")
              for line in f.read_text().splitlines()]
    assert [e["row"] for e in errors] == [5] and "empty" in errors[0]["error"]
    assert summary_of(result)["rows"] == 30 and summary_of(result)["bad_rows"] == 1


def test_chunk_options_without_chunks_or_that_never_move_on_are_refused(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", documents(3))
    for extra, says in ((["--overlap-tokens", "4"], "give --chunk-tokens"),
                        (["--late-chunking"], "give --chunk-tokens"),
                        (["--chunk-tokens", "8", "--overlap-tokens", "8"], "must be below --chunk-tokens"),
                        (["--chunk-tokens", "100000"], "chunk_tokens"),
                        # a chunk is written as its dense vector: another output asked is not dropped
                        (["--chunk-tokens", "8", "--output", "sparse"], "drop --output")):
        result = embed(str(source), "--out", str(tmp_path / "out"), *on_torch(tiny_embedder), *extra)
        assert result.exit_code == 2 and says in result.output, (extra, result.output)
        assert "Traceback" not in result.output


def test_late_chunking_is_asked_of_the_engine_and_answered(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """`--late-chunking` reaches the engine's chunked call: the rows are the plain chunks'
    (same spans) with other vectors (each read in its document's context)."""
    records = documents(6, seed=4)
    records[5]["text"] = "Another sentence here. " * 20
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    args = [str(source), *on_torch(tiny_embedder), "--dtype", "float32", "--chunk-tokens", "16"]
    plain = embed(*args, "--out", str(tmp_path / "plain"))
    assert plain.exit_code == 0, plain.output
    late = embed(*args, "--out", str(tmp_path / "late"), "--late-chunking")
    assert late.exit_code == 0, late.output
    got, want = chunk_rows(read(tmp_path / "late")), chunk_rows(read(tmp_path / "plain"))
    for column in ("row", "chunk", "start", "end", "text"):
        assert got[column].to_pylist() == want[column].to_pylist()
    vectors = [np.array(t["embedding"].to_pylist(), dtype=np.float32) for t in (got, want)]
    assert cosines(*vectors).min() < 0.9999


def test_a_killed_chunked_run_resumes_and_lands_every_chunk_exactly_once(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """SIGKILL a chunking job midway, then the same command: each document's chunks are
    written once, the same as an uninterrupted run's."""
    records = documents(120, seed=6)
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    spec = slow_fake_spec(tiny_embedder, tmp_path / "spec.yaml")
    command = [sys.executable, "-m", "infinity_cloud", "embed", str(source), "--config", str(spec),
               "--shard-rows", "8", "--chunk-tokens", "12", "--overlap-tokens", "2",
               "--max-error-rate", "0.1"]
    proc = start_and_stop([*command, "--out", str(tmp_path / "out")], tmp_path / "out", 3, signal.SIGKILL)
    killed_with = len(list((tmp_path / "out").glob("part-*.parquet")))
    assert proc.returncode != 0 and killed_with < 15, "it finished before the kill: nothing was resumed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for out in ("out", "whole"):
        done = subprocess.run([*command, "--out", str(tmp_path / out)], cwd=ROOT, env=env,
                              capture_output=True, encoding="utf-8", errors="replace", timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout[done.stdout.index("{"):])["shards_skipped"] == 0
    got, want = chunk_rows(read(tmp_path / "out")), chunk_rows(read(tmp_path / "whole"))
    keys = list(zip(got["row"].to_pylist(), got["chunk"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) and got.select(["row", "chunk", "start", "end", "text"]).equals(
        want.select(["row", "chunk", "start", "end", "text"]))
    vectors = [np.array(t["embedding"].to_pylist()) for t in (got, want)]
    np.testing.assert_allclose(*vectors)


@pytest.mark.parametrize("chunk_tokens", [None, 24])
def test_a_shards_inputs_are_batched_by_length_so_padding_is_near_zero(
    tiny_embedder: Path, chunk_tokens: int | None
) -> None:
    """A shard's texts (or chunks) of mixed lengths in random order: the batches the backend
    is handed hold inputs of nearly one length (their padded tokens within 2 % of the real
    ones; in the order they came, 3 to 5 %), and each row's vector is still its own text's."""
    import asyncio

    from infinity_cloud.batching.worker import BatchReport
    from infinity_cloud.bulk.job import EmbedJob, embed_shard
    from infinity_cloud.bulk.sources import Row
    from infinity_cloud.core.config import ModelSpec
    from infinity_cloud.engine import Engine

    rng = np.random.default_rng(11)
    texts = [" ".join(rng.choice(WORDS, int(rng.integers(1, 100)))) for _ in range(600)]  # within its 128
    rows = [Row(i, f"t{i}", text) for i, text in enumerate(texts)]
    job = EmbedJob(files=(), out="unused", shard_rows=600, chunk_tokens=chunk_tokens)
    reports: list[BatchReport] = []
    spec = ModelSpec(model_id=str(tiny_embedder), backend="torch", dtype="float32", max_batch_size=16)

    async def run() -> tuple[Any, Any]:
        async with Engine(spec, observers=[reports.append]) as engine:
            shard = await embed_shard(engine, job, rows)
            reports_of_shard = list(reports)
            alone = await embed_shard(engine, job, rows[:1] + rows[300:301])  # batches of their own
            return shard, alone, reports_of_shard

    shard, alone, shard_reports = asyncio.run(run())
    real = sum(r.real_tokens for r in shard_reports)
    padded = sum(r.padded_tokens for r in shard_reports)
    assert padded <= 1.02 * real, (padded, real)
    table, pair = shard.table, alone.table
    for first in (0, 300):  # the rows of texts 0 and 300, in the input's order
        got = np.array(table.filter(pa.compute.equal(table["row"], first))["embedding"].to_pylist())
        want = np.array(pair.filter(pa.compute.equal(pair["row"], first))["embedding"].to_pylist())
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert table["row"].to_pylist() == sorted(table["row"].to_pylist())
