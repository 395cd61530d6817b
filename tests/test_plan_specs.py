"""`infinity-cloud plan --write`: the spec it writes for each target, against golden files (a
change to the planner or the price table shows up as a diff to review), read back as
`deploy --config` reads it, and on Kubernetes rendered by `deploy --dry-run` into objects the
API's schemas accept, with the autoscaler's threshold and replicas the plan chose."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infinity_cloud.cli import build_cli
from infinity_cloud.core.config import load_spec
from infinity_cloud.targets import registry

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
    # wide enough that the table of offers prints whole
    result = runner.invoke(build_cli(), ["plan", *args], env={"COLUMNS": "250"})
    return result.exit_code, result.output


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("$", ""))


def figures(output: str) -> dict[str, object]:
    """The plan's figures as printed: the headline, the 'why' lines' results, the chosen row."""
    head = {
        k: m.group(1)
        for k in ("hardware", "replicas", "expected p95", "monthly cost")
        if (m := re.search(rf"^  {k}: (\S+)", output, re.M))
    }
    why = {
        k: m.group(1)
        for k in ("replicas", "p95", "cost")
        if (m := re.search(rf"^  why {k}: .*?([$\d,.]+)(?: ms| a month)?(?: \(|,? by use|$)", output, re.M))
    }
    row = next(line for line in output.splitlines() if line.startswith(f"│ {head['hardware']} "))
    cells = [c.strip() for c in row.strip("│").split("│")]
    return {"head": head, "why": why, "row": cells}


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
    spec = load_spec(written, targets=registry)  # as deploy --config reads it
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


@pytest.mark.parametrize("target", ["modal", "sagemaker", "kubernetes", "aws-lambda", "local"])
@pytest.mark.parametrize(
    "load",
    [
        ["--qps", "1"],
        ["--qps", "50"],
        ["--qps", "500", "--p95-ms", "300"],
        ["--qps", "20", "--tokens-per-request", "2048"],
    ],
)
def test_the_printed_figures_agree_with_one_another(model: Path, target: str, load: list[str]) -> None:
    """Issue 51: `--target aws-lambda --qps 50` printed `replicas: 16` and `why replicas: ... so 22`,
    and a cost of 16 instances beside a 'why' of 22. The headline, each 'why' line and the
    chosen offer's row of the table are one computation: they agree, for every target and load."""
    code, output = plan("--model-id", str(model), "--target", target, *load)
    assert code == 0, output
    found = figures(output)
    head, why, row = found["head"], found["why"], found["row"]
    replicas, p95, cost = head["replicas"], head["expected p95"], head["monthly cost"]  # type: ignore[index]
    assert why["replicas"] == replicas, output  # type: ignore[index]
    assert _number(why["cost"]) == _number(cost), output  # type: ignore[index]
    assert why.get("p95") == p95 or p95 == "unbounded", output  # type: ignore[index]
    assert row[3] == replicas and row[5] == p95 and _number(row[6]) == _number(cost), output  # type: ignore[index]
    expected_p95 = float(load[load.index("--p95-ms") + 1]) if "--p95-ms" in load else 1000.0
    meets = p95 != "unbounded" and _number(p95) <= expected_p95  # type: ignore[arg-type]
    assert row[7] == ("yes" if meets else "no"), output  # type: ignore[index]
    if "--p95-ms" not in load:
        assert "p95 within 1,000 ms (the default: no --p95-ms given)" in output


def test_local_sizes_this_host_and_errors_spell_targets_as_deploy(model: Path) -> None:
    code, output = plan("--model-id", str(model), "--target", "local", "--qps", "5")
    assert code == 0, output
    assert "hardware: this host" in output and "replicas: 1" in output
    for word in ("batch_tokens:", "expected p95:", "one server process", "memory budget"):
        assert word in output, word
    code, output = plan("--model-id", str(model), "--target", "aws_nowhere", "--qps", "1")
    assert code == 2 and "aws-lambda" in output and "aws_lambda" not in output and "local" in output


def test_a_profile_of_a_class_no_offer_has_is_refused(model: Path, tmp_path: Path) -> None:
    profile = {
        "created": "2026-12-04T00:00:00+00:00",
        "package_version": "0",
        "url": "http://x",
        "model": "m",
        "corpus": "built-in",
        "hardware": {
            "device": "cpu",
            "cpu": "AMD EPYC",
            "cores": 2,
            "kernel_flags": ["avx2", "avx512f", "avx512_bf16"],
        },
        "tokens_per_text": {"passage": 150.0},
        "points": [
            {"kind": "passage", "per_request": 32, "concurrency": 4, "tokens_per_s": 9000, "requests": 40}
        ],
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    code, output = plan("--model-id", str(model), "--target", "modal", "--qps", "5", "--profile", str(path))
    assert code == 2 and "cpu/avx512_bf16" in output and "cpu/avx2" in output, output
    path.write_text(json.dumps({**profile, "contended": True, "conditions": {"load_avg_before": 11.0}}))
    code, output = plan(
        "--model-id", str(model), "--target", "kubernetes", "--qps", "5", "--profile", str(path)
    )
    assert code == 2 and "--accept-contended" in output, output
    code, output = plan(
        "--model-id",
        str(model),
        "--target",
        "kubernetes",
        "--qps",
        "5",
        "--profile",
        str(path),
        "--accept-contended",
    )
    assert code == 0 and "measured" in output, output


def test_a_replica_is_bounded_by_its_own_tokenizer_timed_by_plan(tiny_embedder: Path, tmp_path: Path) -> None:
    """plan times the model's own tokenizer (its tokenizer.json) and shows the bound; a spec
    for this host is served, not deployed."""
    assert (tiny_embedder / "tokenizer.json").is_file()
    written = tmp_path / "spec.yaml"
    code, output = plan(
        "--model-id", str(tiny_embedder), "--target", "local", "--qps", "2", "--write", str(written)
    )
    assert code == 0, output
    assert re.search(r"tokenizer [\d,]+ \(measured on this model's tokenizer here\)", output), output
    assert f"infinity-cloud serve --config {written}" in output
    load_spec(written, targets=registry)
