"""Targets are plugins: a class and a spec model, registered, give the CLI their verbs with
flags made from the model's fields (help, defaults, variables), and the deployment spec a
section of their own; the core names no target."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from conftest import ROOT, server_process
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from infinity_cloud.cli import build_cli
from infinity_cloud.core.config import DeploymentSpec, load_spec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.targets import registry
from infinity_cloud.targets.base import Target

runner = CliRunner()


class ToySpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    region: str = Field("eu-west", description="Where it runs.")
    replicas: int = Field(1, ge=1, le=9, description="How many copies.")
    fast: bool = Field(False, description="Go fast.")
    zones: tuple[str, ...] = Field((), description="Zones, repeatable.")
    budget_usd: float | None = Field(None, description="Spend cap.", json_schema_extra={"flag": "--budget"})


class ToyTarget(Target[ToySpec]):
    name = "toy"
    spec_class = ToySpec
    verbs = ("build", "status")

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """Write the toy's settings and models."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "toy.json"
        settings = self.settings(spec).model_dump(mode="json")
        path.write_text(json.dumps({**settings, "models": [m.name for m in spec.models]}))
        return [path]

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        return {"region": self.settings(spec).region, "state": "imaginary"}


@pytest.fixture
def toy() -> Iterator[Any]:
    registry.register_target(ToyTarget)
    try:
        yield build_cli()
    finally:
        registry.unregister_target("toy")


def test_a_registered_target_gets_its_verbs_and_flags(toy: Any, tmp_path: Path) -> None:
    args = ["build", "toy", "--out", str(tmp_path), "--region", "us-east", "--replicas", "3", "--fast",
            "--zones", "a", "--zones", "b", "--budget", "12.5", "--model-id", "some/model"]
    result = runner.invoke(toy, args)
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "toy.json").read_text())
    assert written == {
        "region": "us-east", "replicas": 3, "fast": True, "zones": ["a", "b"], "budget_usd": 12.5,
        "models": ["some/model"],
    }
    status = runner.invoke(toy, ["status", "toy", "--region", "ap-south"])
    assert status.exit_code == 0, status.output
    assert "region: ap-south" in status.output and "state: imaginary" in status.output
    # Verbs it does not offer are not there.
    assert runner.invoke(toy, ["deploy", "toy"]).exit_code != 0


def test_its_help_comes_from_the_field_descriptions_and_defaults(toy: Any) -> None:
    text = runner.invoke(toy, ["build", "toy", "--help"], env={"COLUMNS": "250"}).output
    assert "Where it runs. (default: eu-west)" in text
    assert "How many copies. (default: 1)" in text
    assert "--fast" in text and "--no-fast" in text and "(default: off)" in text
    assert "--budget" in text and "INFINITY_CLOUD_TOY_BUDGET_USD" in text
    assert "Write the toy's settings and models." in text  # the verb's own docstring


def test_its_section_comes_from_variables_and_files_with_flags_winning(toy: Any, tmp_path: Path) -> None:
    config = tmp_path / "infinity-cloud.yaml"
    config.write_text("toy:\n  region: from-file\n  replicas: 2\n")
    out = tmp_path / "out"
    env = {"INFINITY_CLOUD_TOY_REPLICAS": "5", "INFINITY_CLOUD_TOY_ZONES": "z1"}
    result = runner.invoke(toy, ["build", "toy", "--out", str(out), "--config", str(config)], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "toy.json").read_text())["region"] == "from-file"
    assert json.loads((out / "toy.json").read_text())["replicas"] == 5
    flag = ["--replicas", "7"]
    result = runner.invoke(toy, ["build", "toy", "--out", str(out), "--config", str(config), *flag], env=env)
    assert json.loads((out / "toy.json").read_text())["replicas"] == 7
    shown = runner.invoke(toy, ["config", "show", "--config", str(config)])
    section = yaml.safe_load(shown.output)["toy"]
    assert (section["region"], section["replicas"], section["fast"]) == ("from-file", 2, False)


def test_its_section_is_validated_by_its_own_model(toy: Any, tmp_path: Path) -> None:
    result = runner.invoke(toy, ["build", "toy", "--out", str(tmp_path / "o"), "--replicas", "0"])
    assert result.exit_code == 2 and "toy.replicas" in result.output
    assert not (tmp_path / "o").exists()
    config = tmp_path / "bad.yaml"
    config.write_text("toy:\n  colour: red\n")
    with pytest.raises(ConfigError, match=r"toy\.colour"):
        load_spec(config, targets=registry)


def test_an_unknown_section_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("lambda_:\n  memory: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'lambda_'.*local, modal"):
        load_spec(config, targets=registry)
    # Without the registry (a container's own spec, which holds no section) any section is refused.
    with pytest.raises(ConfigError, match=r"unknown key 'lambda_'.*load_spec\(targets=\.\.\.\)"):
        load_spec(config)


def test_a_spec_without_a_section_reads_its_defaults() -> None:
    spec = DeploymentSpec()
    assert spec.section("modal", registry.section_class("modal")).max_containers == 2
    assert spec.sections() == {}


def test_the_core_names_no_target() -> None:
    """Adding a target adds no line to the CLI or the core spec."""
    for module in (*sorted((ROOT / "infinity_cloud/cli").glob("*.py")),
                   ROOT / "infinity_cloud/core/config.py"):
        text = module.read_text().lower()
        # as words: `--modality` (text, image, audio) names no target
        assert not re.search(r"\b(modal|sagemaker)\b", text), module


def test_invoke_local_calls_a_running_server(tiny_embedder: Path) -> None:
    from conftest import FAKE

    cli = build_cli()
    with server_process("--model-id", str(tiny_embedder), "--backend", FAKE, "--api-key", "k1") as url:
        port = url.rsplit(":", 1)[1]
        result = runner.invoke(cli, ["invoke", "local", "--port", port, "--input", "hello", "--key", "k1"])
        assert result.exit_code == 0, result.output
        answer = json.loads(result.output)
        assert answer["object"] == "list" and len(answer["data"]) == 1
        refused = runner.invoke(cli, ["invoke", "local", "--port", port, "--key", "wrong"])
        assert refused.exit_code == 2 and "answered 401" in refused.output
        # Every target has the same verbs: status says what answers there, and what it serves.
        keyed = {"INFINITY_CLOUD_ENDPOINT_KEY": "k1"}
        status = runner.invoke(cli, ["status", "local", "--port", port], env=keyed)
        assert status.exit_code == 0, status.output
        assert f"url: {url}" in status.output and "status: ok" in status.output
        assert f"models: {tiny_embedder}" in status.output
    gone = runner.invoke(cli, ["status", "local", "--port", port])
    assert gone.exit_code == 2 and "nothing answers at" in gone.output
    assert "infinity-cloud serve" in gone.output


class NotJson(BaseHTTPRequestHandler):
    """What answers at the port is not the API: a proxy's HTML page, or plain text."""

    content_type, body = "", b""

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = _answer

    def log_message(self, *_: Any) -> None:
        pass


@pytest.mark.parametrize(("content_type", "body"), [
    ("text/html", b"<!DOCTYPE html>\n<html><title>502 Bad Gateway</title><body>" + b"y" * 999 + b"</body>"),
    ("text/plain", b"upstream connect error or disconnect/reset before headers"),
])
@pytest.mark.parametrize("verb", ["invoke", "status"])
def test_an_answer_that_is_not_json_says_what_came_back(content_type: str, body: bytes, verb: str) -> None:
    """Modal's and the local server's calls (plain HTTP): the status, the content type and
    the start of what came back, exit 2, no JSONDecodeError traceback."""
    handler = type("Handler", (NotJson,), {"content_type": content_type, "body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = runner.invoke(build_cli(), [verb, "local", "--port", str(server.server_address[1])])
    finally:
        server.shutdown()
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    start = " ".join(body.decode().split())[:100]
    assert f"answered 200 ({content_type}), not JSON: '{start}" in message
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output


def test_a_local_gpu_image_refuses_to_serve_on_the_cpu(tmp_path: Path, tiny_embedder: Path) -> None:
    """`build local --gpu` names the image's device after its build steps (which run without
    a GPU); `serve` in it then stops, saying why, on a machine without a usable GPU (this one)."""
    from infinity_cloud.targets.base import IMAGE_DEVICE_ENV

    cli = build_cli()
    for gpu, out in (([], tmp_path / "cpu"), (["--gpu"], tmp_path / "gpu")):
        args = ["build", "local", "--out", str(out), "--model-id", str(tiny_embedder), *gpu]
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
    gpu_image = (tmp_path / "gpu" / "Dockerfile").read_text()
    assert gpu_image.index("infinity_cloud download") < gpu_image.index(f"{IMAGE_DEVICE_ENV}=cuda")
    assert IMAGE_DEVICE_ENV not in (tmp_path / "cpu" / "Dockerfile").read_text()
    served = runner.invoke(cli, ["serve", "--model-id", str(tiny_embedder), "--port", "0"],
                           env={IMAGE_DEVICE_ENV: "cuda"})
    assert served.exit_code == 2, served.output
    assert "this is a GPU image, but no NVIDIA driver is visible" in " ".join(served.output.split())


def test_delete_asks_no_one_when_not_interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's delete (no terminal to ask) is refused with the flag to say so, not aborted."""
    result = runner.invoke(build_cli(), ["delete", "sagemaker", "--region", "us-east-1"])
    assert result.exit_code == 2 and "not interactive" in result.output and "--yes" in result.output


@pytest.mark.parametrize(("deadline", "capped"), [(10.0, 10.0), (100.0, 30.0), (None, 30.0)])
def test_a_platform_time_out_is_the_request_limit_caps_the_deadline_and_its_memory_sets_the_budget(
    deadline, capped
) -> None:
    from infinity_cloud.core.config import ModelSpec
    from infinity_cloud.targets.container import within_platform

    spec = DeploymentSpec(models=(ModelSpec(deadline_s=deadline),))
    fitted = within_platform(spec, request_limit_s=60, memory_mb=3000)
    assert fitted.models[0].deadline_s == capped
    assert fitted.models[0].request_limit_s == 60  # a 413 only for what could not finish within it
    assert fitted.server.limits.memory_budget_mb == 2700
    declared = DeploymentSpec(models=spec.models, server={"limits": {"memory_budget_mb": 1000}})
    assert within_platform(declared, None, 3000).server.limits.memory_budget_mb == 1000
    assert within_platform(spec, None, None) == spec


class ToyJobs(Target[ToySpec]):
    """A new runner, as a change adds one: a target that runs bulk jobs (here on this machine,
    with the local runner's code), and its registration. No other file changes."""

    name = "toyjobs"
    spec_class = ToySpec
    verbs = ()
    runs_jobs = True
    ran: ClassVar[list[str]] = []

    def embed_job(self, spec: DeploymentSpec, job: Any, options: Any) -> dict[str, Any]:
        import asyncio

        from infinity_cloud.bulk.local_runner import run_local

        ToyJobs.ran.append(self.settings(spec).region)
        return asyncio.run(run_local(spec, job))


def test_a_registered_runner_runs_embed_jobs(tiny_embedder: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    registry.register_target(ToyJobs)
    try:
        source = tmp_path / "corpus.jsonl"
        source.write_text('{"id": "a", "text": "hello"}\n{"id": "b", "text": "world"}\n')
        argv = ["embed", str(source), "--out", str(tmp_path / "out"), "--model-id", str(tiny_embedder),
                "--backend", "torch", "--runner", "toyjobs"]
        result = runner.invoke(build_cli(), argv)
        assert result.exit_code == 0, result.output
        assert ToyJobs.ran == ["eu-west"]  # its own section's defaults, as any target reads them
        assert pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet"))).num_rows == 2
    finally:
        registry.unregister_target("toyjobs")
