"""The IAM policies `infinity-cloud policy TARGET` prints are what a first deployment needs:
valid documents (IAM, as moto checks them, takes them for a role), and a deploying user
holding the deployer policy may make every call the CLI makes, read off the real boto3
calls of a deploy, status, invoke and delete against moto."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from moto import mock_aws
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.targets.aws_lambda import calls as lambda_calls
from infinity_cloud.targets.sagemaker import aws as sagemaker_aws

runner = CliRunner()
REGION = "us-east-1"
ACCOUNT_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/infinity-cloud:1"


@pytest.fixture
def sent(fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The IAM action of every AWS call made: the service's signing name and the operation."""
    monkeypatch.setattr(sagemaker_aws, "POLL_S", 0.0)
    monkeypatch.setattr(lambda_calls, "POLL_S", 0.0)
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


@mock_aws
def test_the_sagemaker_deployer_policy_allows_every_call(
    sent: list[str], tmp_path: Path, tiny_embedder: Path
) -> None:
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="models")
    data = ["--model-data", "s3://models/emb/model.tar.gz"]
    role = execution_role("sagemaker", "sagemaker-exec", *data)
    needed = ["--image-uri", ACCOUNT_IMAGE, "--role", role, "--region", REGION]
    deploy = ["deploy", "sagemaker", "--out", str(tmp_path / "b"), "--model-id", str(tiny_embedder), *needed,
              "--instance-type", "ml.g4dn.xlarge", "--pack-models", *data, "--autoscale", "1:2"]
    # What SageMaker makes as the endpoint's containers start, which `delete` takes with it.
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_group(logGroupName="/aws/sagemaker/Endpoints/infinity-cloud")
    sent.clear()  # from here on, only the CLI's own calls
    for command in (deploy, ["status", "sagemaker", "--region", REGION],
                    ["delete", "sagemaker", "--region", REGION, "--yes"]):
        result = runner.invoke(cli, command)
        assert result.exit_code == 0, result.output
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
    role = execution_role("aws-lambda", "lambda-exec")
    needed = ["--image-uri", ACCOUNT_IMAGE, "--role", role, "--region", REGION, "--function-name", "emb"]
    deploy = ["deploy", "aws-lambda", "--out", str(tmp_path / "b"), "--model-id", str(tiny_embedder), *needed]
    # What Lambda makes at the function's first invocation, which `delete` takes with it.
    boto3.client("logs", region_name=REGION).create_log_group(logGroupName="/aws/lambda/emb")
    sent.clear()  # from here on, only the CLI's own calls
    # Public, then private again (its grants removed), then without a URL (it is deleted), then
    # deleted.
    for command in ([*deploy, "--auth", "NONE"], [*deploy, "--auth", "AWS_IAM"],
                    [*deploy, "--no-function-url"],
                    ["status", "aws-lambda", "--region", REGION, "--function-name", "emb"],
                    ["delete", "aws-lambda", "--region", REGION, "--function-name", "emb", "--yes"]):
        result = runner.invoke(cli, command)
        assert result.exit_code == 0, result.output
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
