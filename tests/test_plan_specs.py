"""`infinity-cloud plan --write`: the spec it writes for each target, against golden files (a
change to the planner or the price table shows up as a diff to review), read back as
`deploy --config` reads it, and on Kubernetes rendered by `deploy --dry-run` into objects the
API's schemas accept, with the autoscaler's threshold and replicas the plan chose."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infinity_cloud.cli import build_cli
from infinity_cloud.config import load_spec

GOLDEN = Path(__file__).parent / "golden" / "plan"
# all-MiniLM-L6-v2's shape: plan reads nothing else of a model.
MINILM_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "intermediate_size": 1536,
    "num_attention_heads": 12,
    "max_position_embeddings": 512,
}
LOAD = ["--qps", "40", "--tokens-per-request", "256", "--p95-ms", "400"]
runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shape") / "minilm-shape"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MINILM_CONFIG))
    return folder


def plan(*args: str) -> tuple[int, str]:
    result = runner.invoke(build_cli(), ["plan", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("target", ["modal", "sagemaker", "kubernetes", "aws_lambda"])
def test_the_written_spec_matches_its_golden_file_and_loads(model: Path, target: str, tmp_path: Path) -> None:
    written = tmp_path / "spec.yaml"
    code, output = plan("--model-id", str(model), "--target", target, *LOAD, "--write", str(written))
    assert code == 0, output
    for line in (
        "hardware:",
        "replicas:",
        "batch_tokens:",
        "deadline_s:",
        "expected p95:",
        "monthly cost:",
        "why hardware:",
        "why replicas:",
        "why autoscaling:",
        "why cost:",
    ):
        assert line in output, line
    data = yaml.safe_load(written.read_text())
    assert data["models"][0].pop("model_id") == str(model)
    golden = GOLDEN / f"{target}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(yaml.safe_dump(data, sort_keys=False))
    assert data == yaml.safe_load(golden.read_text()), "the plan changed: review it, then UPDATE_GOLDEN=1"
    spec = load_spec(written)  # as deploy --config reads it
    assert spec.models[0].batch_tokens == data["models"][0]["batch_tokens"]
    assert spec.sections()[target].model_dump(include=set(data[target])) == {
        k: tuple(v) if isinstance(v, list) else v for k, v in data[target].items()
    }


def test_the_kubernetes_plan_deploys_with_its_autoscaler(model: Path, tmp_path: Path) -> None:
    import kubernetes_validate

    written = tmp_path / "spec.yaml"
    code, output = plan("--model-id", str(model), "--target", "kubernetes", *LOAD, "--write", str(written))
    assert code == 0, output
    chosen = yaml.safe_load(written.read_text())["kubernetes"]
    result = runner.invoke(
        build_cli(),
        ["deploy", "kubernetes", "--dry-run", "--config", str(written), "--out", str(tmp_path / "k8s")],
    )
    assert result.exit_code == 0, result.output
    objects = [o for o in yaml.safe_load_all(result.stdout.split("nothing deployed")[0]) if o]
    scaled = next(o for o in objects if o["kind"] == "ScaledObject")
    assert scaled["spec"]["maxReplicaCount"] == chosen["max_replicas"]
    trigger = scaled["spec"]["triggers"][0]["metadata"]
    assert float(trigger["threshold"]) == chosen["target_queued_tokens"]
    for obj in objects:
        if obj["apiVersion"] not in ("keda.sh/v1alpha1", "monitoring.coreos.com/v1", "http.keda.sh/v1beta1"):
            kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_more_load_asks_for_more_replicas_of_the_hardware_named(model: Path) -> None:
    replicas = []
    for qps in ("5", "500", "50000"):
        code, output = plan(
            "--model-id", str(model), "--target", "sagemaker", "--hardware", "ml.g5.xlarge", "--qps", qps
        )
        assert code == 0, output
        assert "hardware: ml.g5.xlarge" in output
        replicas.append(int(output.split("replicas: ")[1].split()[0]))
    assert replicas == sorted(replicas) and replicas[-1] > replicas[0]
    code, output = plan(
        "--model-id", str(model), "--target", "sagemaker", "--hardware", "ml.nope", "--qps", "1"
    )
    assert code == 2 and "ml.g5.xlarge" in output  # the offers it has


def test_interactive_asks_for_what_is_missing(model: Path) -> None:
    result = runner.invoke(build_cli(), ["plan", "--interactive"], input=f"{model}\nmodal\n12\n250\n")
    assert result.exit_code == 0, result.output
    assert "on modal, for 12 requests/s of 256 tokens, p95 within 250 ms" in result.output


def test_refusals(model: Path) -> None:
    code, output = plan("--model-id", str(model), "--target", "nowhere", "--qps", "1")
    assert code == 2 and "--target is one of" in output
    code, output = plan("--model-id", str(model), "--target", "modal")
    assert code == 2 and "--qps" in output
    (model.parent / "clip").mkdir(exist_ok=True)
    (model.parent / "clip" / "config.json").write_text(json.dumps({"model_type": "clip"}))
    code, output = plan("--model-id", str(model.parent / "clip"), "--target", "modal", "--qps", "1")
    assert code == 2 and "--profile" in output


def test_the_modal_plan_deploys_with_its_gpu_and_autoscaler(
    tiny_embedder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rendered and handed to Modal's own App.deploy (the call that would reach Modal's servers
    stands in): the app carries the plan's GPU, container cap and target concurrency."""
    import modal

    written = tmp_path / "spec.yaml"
    code, output = plan(
        "--model-id",
        str(tiny_embedder),
        "--target",
        "modal",
        "--hardware",
        "L4",
        *LOAD,
        "--write",
        str(written),
    )
    assert code == 0, output
    chosen = yaml.safe_load(written.read_text())["modal"]
    deployed: list[str] = []
    monkeypatch.setattr(modal.App, "deploy", lambda self, **kwargs: deployed.append(self.name) or self)
    result = runner.invoke(
        build_cli(),
        ["deploy", "modal", "--config", str(written), "--out", str(tmp_path / "app"), "--no-proxy-auth"],
        env={"MODAL_TOKEN_ID": "ak-test", "MODAL_TOKEN_SECRET": "as-test"},
    )
    assert result.exit_code == 0, result.output
    assert deployed == ["infinity-cloud"]
    app = "\n".join(p.read_text() for p in (tmp_path / "app").glob("*.py"))
    assert "GPU = 'L4'" in app or 'GPU = "L4"' in app or "GPU = ['L4']" in app, app[:2000]
    assert f"max_containers={chosen['max_containers']}," in app
    assert f"TARGET_CONCURRENCY = {chosen['target_concurrency']}" in app


def test_the_lambda_plan_deploys_with_its_memory(
    tiny_embedder: Path, tmp_path: Path, fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against moto: the function gets the memory (and so the vCPUs) the plan sized it by."""
    import boto3
    from moto import mock_aws

    from infinity_cloud.targets.aws_lambda import lambda_api

    monkeypatch.setattr(lambda_api, "POLL_S", 0.0)  # no waiting between polls

    written = tmp_path / "spec.yaml"
    code, output = plan(
        "--model-id", str(tiny_embedder), "--target", "aws_lambda", *LOAD, "--write", str(written)
    )
    assert code == 0, output
    chosen = yaml.safe_load(written.read_text())["aws_lambda"]
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "lambda.amazonaws.com"}}
        ],
    }
    with mock_aws():
        role = boto3.client("iam", region_name="us-east-1").create_role(
            RoleName="lambda-exec", AssumeRolePolicyDocument=json.dumps(trust)
        )["Role"]["Arn"]
        result = runner.invoke(
            build_cli(),
            [
                "deploy",
                "aws-lambda",
                "--config",
                str(written),
                "--out",
                str(tmp_path / "build"),
                "--image-uri",
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/emb:1",
                "--role",
                role,
                "--region",
                "us-east-1",
                "--function-name",
                "planned",
            ],
        )
        assert result.exit_code == 0, result.output
        config = boto3.client("lambda", region_name="us-east-1").get_function(FunctionName="planned")[
            "Configuration"
        ]
    assert config["MemorySize"] == chosen["memory_mb"]
