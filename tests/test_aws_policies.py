"""The IAM policies `infinity-cloud policy TARGET` prints are what a first deployment needs:
valid documents (IAM, as moto checks them, takes them for a role), and a deploying user
holding the deployer policy may make every call the CLI makes, read off the real boto3
calls of a deploy, status, invoke and delete against moto."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from moto import mock_aws
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.targets.aws_lambda import lambda_api
from infinity_cloud.targets.sagemaker import sagemaker_api

runner = CliRunner()
REGION = "us-east-1"
ACCOUNT_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/infinity-cloud:1"


@pytest.fixture
def sent(fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The IAM action of every AWS call made: the service's signing name and the operation."""
    monkeypatch.setattr(sagemaker_api, "POLL_S", 0.0)
    monkeypatch.setattr(lambda_api, "POLL_S", 0.0)
    actions: list[str] = []
    make_call = BaseClient._make_api_call

    def record(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        actions.append(f"{self.meta.service_model.signing_name}:{operation}")
        return make_call(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", record)
    return actions


def policy(target: str, which: str, *args: str) -> dict[str, Any]:
    result = runner.invoke(cli, ["policy", target, which, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def allowed(document: dict[str, Any]) -> set[str]:
    actions: set[str] = set()
    for statement in document["Statement"]:
        assert statement["Effect"] == "Allow"
        found = statement["Action"]
        actions |= {found} if isinstance(found, str) else set(found)
    return actions


def execution_role(target: str, name: str, *args: str) -> str:
    """A role made from the printed trust and execution policies (moto validates both)."""
    iam = boto3.client("iam", region_name=REGION)
    trust = json.dumps(policy(target, "trust"))
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust)["Role"]["Arn"]
    iam.put_role_policy(RoleName=name, PolicyName="execution",
                        PolicyDocument=json.dumps(policy(target, "execution", *args)))
    return arn


SAGEMAKER_DATA = ["--model-data", "s3://models/emb/model.tar.gz"]


def sagemaker_commands(tmp_path: Path, model: Path) -> tuple[str, list[list[str]]]:
    """A GPU endpoint with packed models and autoscaling deployed, looked at and deleted, as a
    first deployment does it; the execution role made from the printed policies."""
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="models")
    role = execution_role("sagemaker", "sagemaker-exec", *SAGEMAKER_DATA)
    needed = ["--image-uri", ACCOUNT_IMAGE, "--role", role, "--region", REGION]
    deploy = ["deploy", "sagemaker", "--out", str(tmp_path / "b"), "--model-id", str(model), *needed,
              "--instance-type", "ml.g4dn.xlarge", "--pack-models", *SAGEMAKER_DATA, "--autoscale", "1:2"]
    # What SageMaker makes as the endpoint's containers start, which `delete` takes with it.
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_group(logGroupName="/aws/sagemaker/Endpoints/infinity-cloud")
    return role, [deploy, ["status", "sagemaker", "--region", REGION],
                  ["delete", "sagemaker", "--region", REGION, "--yes"]]


def lambda_commands(tmp_path: Path, model: Path) -> tuple[str, list[list[str]]]:
    """A function deployed public, then private again (its grants removed), then without a
    URL (it is deleted), looked at, and deleted."""
    role = execution_role("aws-lambda", "lambda-exec")
    needed = ["--image-uri", ACCOUNT_IMAGE, "--role", role, "--region", REGION, "--function-name", "emb"]
    deploy = ["deploy", "aws-lambda", "--out", str(tmp_path / "b"), "--model-id", str(model), *needed]
    # What Lambda makes at the function's first invocation, which `delete` takes with it.
    boto3.client("logs", region_name=REGION).create_log_group(logGroupName="/aws/lambda/emb")
    return role, [[*deploy, "--auth", "NONE"], [*deploy, "--auth", "AWS_IAM"], [*deploy, "--no-function-url"],
                  ["status", "aws-lambda", "--region", REGION, "--function-name", "emb"],
                  ["delete", "aws-lambda", "--region", REGION, "--function-name", "emb", "--yes"]]


def run_all(commands: list[list[str]]) -> None:
    for command in commands:
        result = runner.invoke(cli, command)
        assert result.exit_code == 0, result.output


@mock_aws
def test_the_sagemaker_deployer_policy_allows_every_call(
    sent: list[str], tmp_path: Path, tiny_embedder: Path
) -> None:
    data = SAGEMAKER_DATA
    role, commands = sagemaker_commands(tmp_path, tiny_embedder)
    sent.clear()  # from here on, only the CLI's own calls
    run_all(commands)
    made = set(sent)
    iam = boto3.client("iam", region_name=REGION)
    iam.create_user(UserName="deployer")  # the printed policy is one IAM takes for a user
    deployer = policy("sagemaker", "deployer", *data, "--role", role, "--image-uri", ACCOUNT_IMAGE)
    iam.put_user_policy(UserName="deployer", PolicyName="deploy", PolicyDocument=json.dumps(deployer))
    assert {"sagemaker:CreateModel", "application-autoscaling:PutScalingPolicy", "s3:PutObject",
            "logs:DeleteLogGroup"} <= made
    assert made - allowed(deployer) == set()
    assert "sagemaker:InvokeEndpoint" in allowed(deployer)  # invoke and smoke
    # The push of the image (your Docker) a first deployment needs, to the image's repository only.
    push = next(s for s in deployer["Statement"] if "ecr:PutImage" in s["Action"])
    assert push["Resource"] == "arn:aws:ecr:*:*:repository/infinity-cloud"
    assert {"ecr:CreateRepository", "ecr:GetAuthorizationToken", "ecr:UploadLayerPart"} <= allowed(deployer)


@mock_aws
def test_the_lambda_deployer_policy_allows_every_call(
    sent: list[str], tmp_path: Path, tiny_embedder: Path
) -> None:
    role, commands = lambda_commands(tmp_path, tiny_embedder)
    sent.clear()  # from here on, only the CLI's own calls
    run_all(commands)
    made = set(sent)
    deployer = policy("aws-lambda", "deployer", "--role", role, "--function-name", "emb",
                      "--image-uri", ACCOUNT_IMAGE)
    boto3.client("iam", region_name=REGION).create_user(UserName="deployer")
    boto3.client("iam", region_name=REGION).put_user_policy(
        UserName="deployer", PolicyName="deploy", PolicyDocument=json.dumps(deployer))
    assert {"lambda:CreateFunction", "lambda:CreateFunctionUrlConfig", "lambda:AddPermission",
            "lambda:RemovePermission", "lambda:DeleteFunctionUrlConfig", "logs:DeleteLogGroup"} <= made
    assert made - allowed(deployer) == set()
    # What only a failed deploy's rollback calls (tests/test_aws_lambda_deploy.py), and the
    # push of the image (your Docker) a first deployment needs.
    assert {"lambda:DeleteAlias", "lambda:DeleteFunction", "lambda:DeleteFunctionUrlConfig",
            "lambda:UpdateFunctionUrlConfig", "ecr:CreateRepository", "ecr:GetAuthorizationToken",
            "ecr:InitiateLayerUpload", "ecr:UploadLayerPart", "ecr:CompleteLayerUpload",
            "ecr:BatchCheckLayerAvailability", "ecr:PutImage"} <= allowed(deployer)
    push = next(s for s in deployer["Statement"] if "ecr:PutImage" in s["Action"])
    assert push["Resource"] == "arn:aws:ecr:*:*:repository/infinity-cloud"  # the image's repository only
    passes = [s for s in deployer["Statement"] if s["Action"] == "iam:PassRole"]
    assert passes[0]["Resource"] == role


def test_an_unknown_policy_names_the_ones_there_are() -> None:
    result = runner.invoke(cli, ["policy", "sagemaker", "admin"])
    assert result.exit_code == 2 and "trust, execution, deployer" in result.output


@pytest.fixture(scope="module")
def floor_botocore_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The API models of the oldest botocore the `aws` extra allows, from the package index:
    `pip install 'infinity-cloud[aws]'` keeps an older botocore already there, down to it."""
    import subprocess
    import sys
    import zipfile

    from conftest import ROOT
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["aws"]
    (floor,) = [spec.version for requirement in map(Requirement, extra) if requirement.name == "botocore"
                for spec in requirement.specifier if spec.operator == ">="]
    wheels = tmp_path_factory.mktemp("botocore-floor")
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
         "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", str(wheels),
         f"botocore=={floor}"], capture_output=True, text=True, timeout=300,
    )
    if fetched.returncode != 0:
        reason = f"pip could not fetch botocore=={floor}: {fetched.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(f"CI reaches the package index, but {reason}")
        pytest.skip(reason)
    (wheel,) = wheels.glob("botocore-*.whl")
    models = wheels / "models"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(models, [n for n in archive.namelist() if n.startswith("botocore/data/")])
    return models / "botocore" / "data"


@mock_aws
@pytest.mark.parametrize("commands", [sagemaker_commands, lambda_commands], ids=["sagemaker", "aws-lambda"])
def test_the_declared_botocore_floor_makes_every_call_of_a_first_deployment(
    floor_botocore_models: Path, fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path, tiny_embedder: Path, commands: Any,
) -> None:
    """Each call the CLI makes is checked against botocore's model of its API before the
    first one (a parameter AWS added later, such as add_permission's InvokedViaFunctionUrl,
    fails there, naming the upgrade): with the floor's own models, every command of a first
    deployment, its redeploys and its delete passes."""
    monkeypatch.setattr(sagemaker_api, "POLL_S", 0.0)
    monkeypatch.setattr(lambda_api, "POLL_S", 0.0)
    monkeypatch.setenv("AWS_DATA_PATH", str(floor_botocore_models))  # found before this botocore's own
    _, steps = commands(tmp_path, tiny_embedder)
    run_all(steps)
