"""`infinity-cloud embed --runner modal`, offline, against the real `modal` client and S3 (moto,
run as a server that pyarrow reaches). The app is the one `deploy modal` renders; its job
class runs here through Modal's own local path (`.local()`, which builds the object with its
parameter and runs its enter hooks once), and its exit hook at the end. Faked: only what needs
Modal's servers, `App.run` (the ephemeral app) and `.map` (which hands each input to that
local object instead of to containers)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import modal
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from modal._partial_function import _find_callables_for_obj, _PartialFunctionFlags
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.targets.modal.target import SHARD_RETRIES, SHARD_TIMEOUT_S

pytest.importorskip("moto")
runner = CliRunner()
BUCKET = "corpus"
A_MODAL_TOKEN = {"MODAL_TOKEN_ID": "ak-test", "MODAL_TOKEN_SECRET": "as-test"}
NO_MODAL_TOKEN = {"MODAL_TOKEN_ID": None, "MODAL_TOKEN_SECRET": None}


@pytest.fixture(autouse=True)
def no_modal_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """No token from this machine's environment or ~/.modal.toml reaches a test."""
    for name in NO_MODAL_TOKEN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(modal.config, "_user_config", {})


@pytest.fixture
def s3(fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto as a server (boto3 here, pyarrow in the driver and in the job's "container"), with
    a corpus of 70 rows in two files: row 9 empty, row 40 without its text."""
    import logging

    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    monkeypatch.setattr(logging.getLogger("werkzeug"), "disabled", True)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    httpx.post(f"http://{host}:{port}/moto-api/reset")  # moto's state is the process's: start empty
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))
    client.create_bucket(Bucket=BUCKET)
    for name, part in (("a.jsonl", RECORDS[:30]), ("b.jsonl", RECORDS[30:])):
        client.put_object(Bucket=BUCKET, Key=f"in/{name}", Body="".join(json.dumps(r) + "\n" for r in part))
    try:
        yield client
    finally:
        server.stop()


RECORDS: list[dict[str, Any]] = [
    {"id": f"d{i}", "text": f"passage {i} " + "about shards and containers " * (i % 7)} for i in range(70)
]
RECORDS[9]["text"] = ""
RECORDS[40] = {"id": "d40"}
BAD = {9: "row 9 is an empty string", 40: "no 'text' field"}


class FakeModal:
    """What needs Modal's servers, done here: `App.run` yields the app unhydrated, and `.map`
    calls the bound method's `.local()` for each input (one local object, entered once, for
    the whole map: a container), then the object's exit hooks, as a container's end runs them.
    `stop_after` inputs, it raises as a lost connection would.

    `failures` makes a shard's tries fail as Modal's fail (modal.com/docs/guide/retries and
    /guide/timeouts): each input of a `.map` is retried on its own, up to the class's
    `retries` (SHARD_RETRIES) times after the first try; "error" raises in the worker before
    it writes (the remote exception), "timeout" is a try cut off at the class's `timeout`
    after the shard was written (the write is not undone); once an input's tries are spent,
    its last failure propagates to the caller (a timeout as modal.exception.FunctionTimeoutError)
    and the inputs not yet run are not run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stop_after: int | None = None) -> None:
        self.runs: list[dict[str, Any]] = []
        self.deploys: list[dict[str, Any]] = []
        self.spawns: list[list[int]] = []
        self.maps: list[dict[str, Any]] = []
        self.options: list[dict[str, Any]] = []
        self.stop_after = stop_after
        self.failures: dict[int, list[str]] = {}  # shard -> how its tries fail, in order
        self.tries: dict[int, int] = {}
        self.generators: list[Iterator[Any]] = []
        fake = self

        @contextlib.contextmanager
        def run(app: Any, **kwargs: Any) -> Iterator[Any]:
            fake.runs.append({"app": app.name, **kwargs})
            yield app

        def fake_map(function: Any, *inputs: Any, **kwargs: Any) -> Iterator[Any]:
            generator = outputs(function, list(zip(*inputs, strict=True)), kwargs)
            fake.generators.append(generator)
            return generator

        def outputs(function: Any, plans: list[tuple[Any, ...]], kwargs: dict[str, Any]) -> Iterator[Any]:
            fake.maps.append({"plans": [json.loads(p[0]) for p in plans], **kwargs})
            try:
                for done, args in enumerate(plans):
                    if fake.stop_after is not None and done == fake.stop_after:
                        raise ConnectionResetError("the connection to Modal was lost")
                    yield fake.tried(function, args)
            finally:
                instance = function._get_obj()._cached_user_cls_instance()
                for hook in _find_callables_for_obj(instance, _PartialFunctionFlags.EXIT).values():
                    hook()

        self.tried = self._tried

        def deploy(app: Any, **kwargs: Any) -> Any:
            fake.deploys.append({"app": app.name, **kwargs})
            return app

        def spawn_map(function: Any, *inputs: Any, **kwargs: Any) -> None:
            """The deployed app's containers run the inputs after this returns: here, at once."""
            fake.spawns.append([json.loads(p)["shard"] for p in inputs[0]])
            for _ in outputs(function, list(zip(*inputs, strict=True)), kwargs):
                pass

        real_with_options = modal.Cls.with_options

        def with_options(cls: Any, **kwargs: Any) -> Any:
            fake.options.append(kwargs)
            return real_with_options(cls, **kwargs)

        monkeypatch.setattr(modal.App, "run", run)
        monkeypatch.setattr(modal.Function, "map", fake_map)
        monkeypatch.setattr(modal.App, "deploy", deploy)
        monkeypatch.setattr(modal.Function, "spawn_map", spawn_map)
        monkeypatch.setattr(modal.Cls, "with_options", with_options)


    def _tried(self, function: Any, args: tuple[Any, ...]) -> Any:
        """One input run as Modal runs it: tried again on failure, up to SHARD_RETRIES times."""
        shard = json.loads(args[0])["shard"]
        failing = self.failures.get(shard, [])
        for attempt in range(SHARD_RETRIES + 1):
            self.tries[shard] = self.tries.get(shard, 0) + 1
            how = failing[attempt] if attempt < len(failing) else None
            if how is None:
                return function.local(*args)
            if how == "timeout":
                function.local(*args)  # written, then cut off before its answer came back
                failure: Exception = modal.exception.FunctionTimeoutError(
                    f"Function timed out after {SHARD_TIMEOUT_S} seconds")
            else:
                failure = OSError(f"When reading shard {shard}: AWS Error NETWORK_CONNECTION")
        raise failure


@pytest.fixture
def fake_modal(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModal]:
    fake = FakeModal(monkeypatch)
    yield fake
    for generator in fake.generators:  # a map left early ends its "container" now, not at exit
        generator.close()  # type: ignore[attr-defined]


def model_args(tiny_embedder: Path) -> list[str]:
    # 2 bad rows of 70: more than the default --max-error-rate (1 %)
    return ["--model-id", str(tiny_embedder), "--backend", "torch", "--dtype", "float32",
            "--max-error-rate", "0.1"]


def embed_on_modal(tiny_embedder: Path, *extra: str, env: dict[str, Any] | None = None) -> Any:
    args = ["embed", f"s3://{BUCKET}/in/", "--out", f"s3://{BUCKET}/vectors", *model_args(tiny_embedder),
            "--shard-rows", "16", "--runner", "modal", "--job-secret", "aws-keys", *extra]
    return runner.invoke(cli, args, env=A_MODAL_TOKEN if env is None else env)


def summary_of(result: Any) -> dict[str, Any]:
    return json.loads(result.stdout[result.stdout.index("{"):])


def read_output(s3: Any) -> tuple[pa.Table, list[str]]:
    """The dataset as written to S3 (sorted by row), and its shard files' names."""
    from pyarrow import fs

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/part-")["Contents"])
    s3fs, _ = fs.FileSystem.from_uri(f"s3://{BUCKET}/vectors")
    tables = [pq.read_table(f"{BUCKET}/{key}", filesystem=s3fs) for key in keys]
    return pa.concat_tables(tables).sort_by("row"), [Path(k).name for k in keys]


def errors_written(s3: Any) -> dict[int, str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/errors/").get("Contents", [])
    lines = [line for o in listed
             for line in s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read().decode().splitlines()]
    return {json.loads(line)["row"]: json.loads(line)["error"] for line in lines}


def local_vectors(tiny_embedder: Path, tmp_path: Path) -> np.ndarray:
    """The same corpus through the local runner: what the Modal job must write."""
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    args = ["embed", str(source), "--out", str(tmp_path / "local"), *model_args(tiny_embedder)]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    table = pq.read_table(sorted((tmp_path / "local").glob("part-*.parquet"))).sort_by("row")
    return np.array(table["embedding"].to_pylist())


GOOD_ROWS = [i for i in range(70) if i not in BAD]


def test_a_job_maps_its_shards_over_the_apps_class_and_lands_every_row_once(
    tiny_embedder: Path, tmp_path: Path, s3: Any, fake_modal: FakeModal
) -> None:
    fake = fake_modal
    result = embed_on_modal(tiny_embedder)
    assert result.exit_code == 0, result.output
    # The job app ran, not the deployment's, and mapped all five 16-row shards, unordered.
    assert fake.runs == [{"app": "infinity-cloud-embed", "environment_name": None}]
    (mapped,) = fake.maps
    assert [p["shard"] for p in mapped["plans"]] == [0, 1, 2, 3, 4] and mapped["order_outputs"] is False
    # The workers read their rows from S3 by their plans: the job they get has no file list.
    assert all(s["file"].startswith(f"s3://{BUCKET}/in/") for p in mapped["plans"] for s in p["segments"])
    (options,) = fake.options
    assert [repr(s) for s in options["secrets"]] == ["modal.Secret.from_name('aws-keys')"]
    assert options["max_containers"] == 2  # the app's own --max-containers
    summary = summary_of(result)
    assert summary["runner"] == "modal" and summary["rows"] == 70 and summary["bad_rows"] == 2
    assert summary["engines"] == ["torch float32"] and summary["shards_skipped"] == 0
    table, names = read_output(s3)
    assert names == [f"part-{k:06d}.parquet" for k in range(5)]
    assert table["row"].to_pylist() == GOOD_ROWS  # each row once, in order
    assert table["id"].to_pylist() == [RECORDS[i]["id"] for i in GOOD_ROWS]
    assert errors_written(s3) == BAD
    got = np.array(table["embedding"].to_pylist())
    np.testing.assert_allclose(got, local_vectors(tiny_embedder, tmp_path), atol=1e-5)
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key="vectors/_manifest.json")["Body"].read())
    assert manifest["summary"]["runner"] == "modal" and manifest["job"]["shard_rows"] == 16


def test_a_job_cut_off_midway_resumes_with_only_the_shards_not_written(
    tiny_embedder: Path, s3: Any, fake_modal: FakeModal
) -> None:
    """The connection lost after two shards: the command fails in one line, keeps what was
    written; the same command again maps only the other three, and every row lands once."""
    fake = fake_modal
    fake.stop_after = 2
    cut = embed_on_modal(tiny_embedder)
    assert cut.exit_code == 2, cut.output
    assert "ConnectionResetError: the connection to Modal was lost" in cut.output
    assert "Traceback" not in cut.output
    _, names = read_output(s3)
    assert names == ["part-000000.parquet", "part-000001.parquet"]
    fake.stop_after = None
    again = embed_on_modal(tiny_embedder)
    assert again.exit_code == 0, again.output
    assert [p["shard"] for p in fake.maps[-1]["plans"]] == [2, 3, 4]
    summary = summary_of(again)
    assert summary["shards_skipped"] == 2 and summary["rows"] == 70 - 32 and summary["rows_before"] == 32
    table, names = read_output(s3)
    assert len(names) == 5 and table["row"].to_pylist() == GOOD_ROWS
    assert errors_written(s3) == BAD
    finished = embed_on_modal(tiny_embedder)  # all done: nothing to map, no app to run
    assert finished.exit_code == 0 and summary_of(finished)["shards_skipped"] == 5
    assert len(fake.runs) == 2


def test_a_detached_job_is_spawned_on_the_deployed_job_app_and_finished_by_the_same_command(
    tiny_embedder: Path, s3: Any, fake_modal: FakeModal
) -> None:
    """--detach: the job app is deployed (an ephemeral app's calls would end with this
    process), every shard not written is spawned (`spawn_map`), and the command returns with
    what it started and what to run next; run again without --detach once the containers are
    done, it finds every shard written, maps nothing and writes the summary."""
    fake = fake_modal
    started = embed_on_modal(tiny_embedder, "--detach")
    assert started.exit_code == 0, started.output
    assert fake.deploys == [{"app": "infinity-cloud-embed", "environment_name": None}] and fake.runs == []
    assert fake.spawns == [[0, 1, 2, 3, 4]] and fake.maps[-1]["plans"][0]["shard"] == 0
    detached = summary_of(started)
    assert detached["detached"] is True and detached["shards_started"] == 5
    assert "without --detach" in detached["next"]
    finished = embed_on_modal(tiny_embedder)
    assert finished.exit_code == 0, finished.output
    assert fake.runs == [] and summary_of(finished)["shards_skipped"] == 5
    table, names = read_output(s3)
    assert len(names) == 5 and table["row"].to_pylist() == GOOD_ROWS
    assert errors_written(s3) == BAD
    local = runner.invoke(cli, ["embed", "x.jsonl", "--out", "o", "--detach"])
    assert local.exit_code == 2, local.output
    refused = " ".join(local.output.split())
    assert "a local job runs until it ends here; --runner modal can start one" in refused


def test_max_errors_stops_a_modal_job_with_its_own_message(
    tiny_embedder: Path, s3: Any, fake_modal: FakeModal
) -> None:
    """Row 9, in the first shard, is bad: the job stops after it, in the runners' own words."""
    result = embed_on_modal(tiny_embedder, "--max-errors", "0")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "error: 1 bad rows, more than --max-errors 0" in said and "could not run" not in said


def must_not_run(*_: Any, **__: Any) -> Any:
    raise AssertionError("the job app was run")


@pytest.mark.parametrize(
    ("inputs", "out", "extra", "env", "message"),
    [
        ("local", f"s3://{BUCKET}/vectors", [], A_MODAL_TOKEN, "is on this machine, which Modal's"),
        (f"s3://{BUCKET}/in/", "local", [], A_MODAL_TOKEN, "where Modal's containers cannot write"),
        (f"s3://{BUCKET}/in/", f"s3://{BUCKET}/vectors", ["--job-secret", ""], A_MODAL_TOKEN,
         "--runner modal needs --job-secret NAME"),
        (f"s3://{BUCKET}/in/", f"s3://{BUCKET}/vectors", [], NO_MODAL_TOKEN, "no Modal credentials"),
        (f"s3://{BUCKET}/in/", "s3://no-such-bucket/vectors", [], A_MODAL_TOKEN,
         "cannot write s3://no-such-bucket/vectors: Bucket 'no-such-bucket' not found"),
    ],
    ids=["local-input", "local-output", "no-secret", "no-modal-token", "no-output-bucket"],
)
def test_what_modal_cannot_reach_is_refused_in_one_line_before_anything_runs(
    inputs: str, out: str, extra: list[str], env: dict[str, Any], message: str, tiny_embedder: Path,
    tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(modal.App, "run", must_not_run)
    local = tmp_path / "corpus.jsonl"
    local.write_text(json.dumps(RECORDS[0]) + "\n")
    inputs = str(local) if inputs == "local" else inputs
    out = str(tmp_path / "out") if out == "local" else out
    args = ["embed", inputs, "--out", out, *model_args(tiny_embedder), "--runner", "modal",
            "--job-secret", "aws-keys", *extra]
    result = runner.invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([ln for ln in result.output.splitlines() if ln.startswith("error:")]) == 1
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="vectors/")  # no manifest either


def test_a_secret_modal_does_not_have_is_named(
    tiny_embedder: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(app: Any, **_: Any) -> Any:
        raise modal.exception.NotFoundError("Secret 'aws-keys' not found in environment 'main'")

    monkeypatch.setattr(modal.App, "run", run)
    result = embed_on_modal(tiny_embedder)
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "Modal has no secret 'aws-keys' for --job-secret" in said and "no Modal app named" not in said


def test_the_job_class_is_built_from_the_deployments_image_and_settings(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    from infinity_cloud.targets.modal.target import load_app_module

    args = ["build", "modal", "--out", str(tmp_path), "--model-id", str(tiny_embedder), "--gpu", "L4",
            "--startup-timeout", "700", "--max-containers", "6", "--secret", "hf-token"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    module = load_app_module(tmp_path / "modal_app.py")
    assert module.job_app is not module.app and module.job_app.name == "infinity-cloud-embed"
    info = module.ShardEmbedder._get_class_service_function().info()
    assert info.gpus == [("L4", 1)] and info.startup_timeout == 700 and info.max_retries == 2
    assert info.timeout == module.SHARD_TIMEOUT and info.method_names == ["embed"]
    assert "modal.Secret.from_name('hf-token')" in info.secrets
    assert "max_containers=6," in (tmp_path / "modal_app.py").read_text()
    assert module.job_app._get_default_image() is module.app._get_default_image()  # the same layers
    assert '"pyarrow==' in (tmp_path / "modal_app.py").read_text()  # the workers write Parquet


def test_a_shard_that_fails_is_retried_on_its_own_and_every_row_lands_once(
    tiny_embedder: Path, s3: Any, fake_modal: FakeModal
) -> None:
    """Shard 1's first try fails reading S3, shard 3's first try is cut off by the timeout
    after it wrote the shard: Modal tries each again on its own; the job ends well, each
    shard's report counted once and each row written once."""
    fake = fake_modal
    fake.failures = {1: ["error"], 3: ["timeout", "timeout"]}
    result = embed_on_modal(tiny_embedder)
    assert result.exit_code == 0, result.output
    assert fake.tries == {0: 1, 1: 2, 2: 1, 3: 3, 4: 1}
    summary = summary_of(result)
    assert summary["rows"] == 70 and summary["bad_rows"] == 2 and summary["shards_skipped"] == 0
    table, names = read_output(s3)
    assert names == [f"part-{k:06d}.parquet" for k in range(5)]
    assert table["row"].to_pylist() == GOOD_ROWS
    assert errors_written(s3) == BAD


@pytest.mark.parametrize(("how", "said"), [
    ("timeout", f"a shard ran past the job's timeout ({SHARD_TIMEOUT_S} s) on each of its "
                f"{SHARD_RETRIES + 1} tries"),
    ("error", "OSError: When reading shard 2: AWS Error NETWORK_CONNECTION"),
])
def test_a_shard_that_fails_every_try_fails_the_job_and_its_resume_does_only_the_rest(
    how: str, said: str, tiny_embedder: Path, s3: Any, fake_modal: FakeModal
) -> None:
    """Shard 2 fails on each of its tries (a timeout, or an error): the job fails in one
    line that says why and that the shards written are kept; the same command again maps
    only the shards not written, and every row lands once."""
    fake = fake_modal
    fake.failures = {2: [how] * (SHARD_RETRIES + 1)}
    failed = embed_on_modal(tiny_embedder)
    assert failed.exit_code == 2, failed.output
    message = " ".join(failed.output.split())
    assert said in message and "Traceback" not in failed.output
    assert "the shards written are kept: the same command again embeds only the rest" in message
    assert fake.tries[2] == SHARD_RETRIES + 1 and 3 not in fake.tries  # the rest were not run
    _, names = read_output(s3)
    # A timed-out try had written its shard before it was cut off: it is kept too.
    assert names == [f"part-{k:06d}.parquet" for k in ((0, 1, 2) if how == "timeout" else (0, 1))]
    fake.failures = {}
    again = embed_on_modal(tiny_embedder)
    assert again.exit_code == 0, again.output
    assert [p["shard"] for p in fake.maps[-1]["plans"]] == ([3, 4] if how == "timeout" else [2, 3, 4])
    table, names = read_output(s3)
    assert len(names) == 5 and table["row"].to_pylist() == GOOD_ROWS
    assert errors_written(s3) == BAD


def test_a_chunked_job_runs_the_same_shard_code_in_the_containers(
    tiny_embedder: Path, tmp_path: Path, s3: Any, fake_modal: FakeModal
) -> None:
    """`--chunk-tokens` travels with the job to the containers: the rows written to S3 are a
    row per chunk, the local runner's."""
    chunks = ["--chunk-tokens", "6", "--overlap-tokens", "1"]
    result = embed_on_modal(tiny_embedder, *chunks)
    assert result.exit_code == 0, result.output
    table, names = read_output(s3)
    assert len(names) == 5 and errors_written(s3) == BAD
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    local = runner.invoke(cli, ["embed", str(source), "--out", str(tmp_path / "local"),
                                *model_args(tiny_embedder), *chunks])
    assert local.exit_code == 0, local.output
    want = pq.read_table(sorted((tmp_path / "local").glob("part-*.parquet")))
    order = [("row", "ascending"), ("chunk", "ascending")]
    got, want = table.sort_by(order), want.sort_by(order)
    columns = ["id", "row", "chunk", "start", "end", "tokens", "text"]
    assert got.select(columns).equals(want.select(columns)) and got.num_rows > 100
    vectors = [np.array(t["embedding"].to_pylist()) for t in (got, want)]
    np.testing.assert_allclose(*vectors, atol=1e-5)
