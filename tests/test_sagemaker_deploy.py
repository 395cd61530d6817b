"""Deploying to SageMaker with boto3, offline: moto stands in for the control plane (models,
endpoint configs, endpoints, autoscaling), botocore's Stubber for what moto lacks (the
Creating -> InService/Failed states, update_endpoint, ml.g5 instance types), and real
boto3 `invoke_endpoint` reaches the real container entrypoint through a local stand-in of
the runtime endpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import httpx
import numpy as np
import pytest
import yaml
from botocore.stub import Stubber
from conftest import FAKE, serve_in_process, spec_of
from moto import mock_aws
from test_sagemaker_target import BODIES, Serve, fake_model, write_config
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.targets.base import ROUTE_HEADER
from infinity_cloud.targets.sagemaker import sagemaker_api
from infinity_cloud.targets.sagemaker.client import SageMakerClient
from infinity_cloud.targets.sagemaker.spec import GPU_AMI, SageMakerSpec

runner = CliRunner()
REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/sagemaker-exec"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/infinity-cloud:1"
NEEDED = ["--image-uri", IMAGE, "--role", ROLE, "--region", REGION]
ARN = "arn:aws:sagemaker:us-east-1:123456789012"
PER_INSTANCE = "SageMakerVariantInvocationsPerInstance"
RUNTIME_URL = "https://runtime.sagemaker.us-east-1.amazonaws.com"


@pytest.fixture(autouse=True)
def aws_env(fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sagemaker_api, "POLL_S", 0.0)  # no waiting between polls


def deploy(tmp_path: Path, *args: str) -> Any:
    return runner.invoke(cli, ["deploy", "sagemaker", "--out", str(tmp_path / "build"), *NEEDED, *args])


# -- against moto ------------------------------------------------------------------------------


@mock_aws
def test_deploy_creates_model_config_endpoint_and_autoscaling(tmp_path: Path, tiny_embedder: Path) -> None:
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--backend", "onnx", "--endpoint-name", "emb",
                    "--instance-type", "ml.c5.xlarge", "--instance-count", "2", "--autoscale", "2:5",
                    "--target-invocations", "300", "--model-data", "s3://bucket/model.tar.gz")
    assert result.exit_code == 0, result.output
    sm = boto3.client("sagemaker", region_name=REGION)
    endpoint = sm.describe_endpoint(EndpointName="emb")
    assert endpoint["EndpointStatus"] == "InService"
    config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    (variant,) = config["ProductionVariants"]
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.c5.xlarge", 2)
    assert "InferenceAmiVersion" not in variant  # a CPU image needs no particular driver
    model = sm.describe_model(ModelName=variant["ModelName"])
    assert model["ExecutionRoleArn"] == ROLE
    assert model["PrimaryContainer"]["Image"] == IMAGE
    assert model["PrimaryContainer"]["ModelDataUrl"] == "s3://bucket/model.tar.gz"
    scaling = boto3.client("application-autoscaling", region_name=REGION)
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (
        "endpoint/emb/variant/AllTraffic", 2, 5)
    (policy,) = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 300.0
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == PER_INSTANCE
    assert (tmp_path / "build" / "Dockerfile").is_file()  # the files the image is built from


@mock_aws
def test_a_serverless_endpoint_gets_its_memory_and_concurrency(tmp_path: Path, tiny_embedder: Path) -> None:
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--serverless", "--memory-mb", "4096",
                    "--max-concurrency", "7")
    assert result.exit_code == 0, result.output
    sm = boto3.client("sagemaker", region_name=REGION)
    name = sm.describe_endpoint(EndpointName="infinity-cloud")["EndpointConfigName"]
    (variant,) = sm.describe_endpoint_config(EndpointConfigName=name)["ProductionVariants"]
    assert variant["ServerlessConfig"] == {"MemorySizeInMB": 4096, "MaxConcurrency": 7}
    status = runner.invoke(cli, ["status", "sagemaker", "--region", REGION])
    assert status.exit_code == 0, status.output
    assert "status: InService" in status.output and "serverless 4096 MB x 7" in status.output
    assert f"url: {RUNTIME_URL}/endpoints/infinity-cloud/invocations" in status.output


@mock_aws
def test_delete_removes_endpoint_config_model_and_scaling(tmp_path: Path, tiny_embedder: Path) -> None:
    args = ["--model-id", str(tiny_embedder), "--instance-type", "ml.m5.large", "--autoscale", "1:3"]
    assert deploy(tmp_path, *args).exit_code == 0
    sm = boto3.client("sagemaker", region_name=REGION)
    assert len(sm.list_models()["Models"]) == 1
    logs = boto3.client("logs", region_name=REGION)  # what SageMaker makes as the containers start
    for group in ("/aws/sagemaker/Endpoints/infinity-cloud", "/aws/sagemaker/Endpoints/infinity-cloud-2"):
        logs.create_log_group(logGroupName=group)
    result = runner.invoke(cli, ["delete", "sagemaker", "--region", REGION, "--yes"])
    assert result.exit_code == 0, result.output
    groups = [g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]]
    assert groups == ["/aws/sagemaker/Endpoints/infinity-cloud-2"], "its own log group only"
    assert sm.list_endpoints()["Endpoints"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == [] and sm.list_models()["Models"] == []
    scaling = boto3.client("application-autoscaling", region_name=REGION)
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    again = runner.invoke(cli, ["delete", "sagemaker", "--region", REGION, "--yes"])
    assert again.exit_code == 2 and "no SageMaker endpoint named 'infinity-cloud'" in again.output


@mock_aws
def test_delete_also_removes_what_earlier_and_failed_deploys_left(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    assert deploy(tmp_path, "--model-id", str(tiny_embedder), "--instance-type", "ml.m5.large").exit_code == 0
    sm = boto3.client("sagemaker", region_name=REGION)
    container = {"Image": IMAGE}
    variant = {"VariantName": "AllTraffic", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}
    for name in ("infinity-cloud-20250101-000000", "other-20250101-000000"):  # a leftover; someone else's
        sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer=container)
        sm.create_endpoint_config(
            EndpointConfigName=name, ProductionVariants=[{**variant, "ModelName": name}])
    result = runner.invoke(cli, ["delete", "sagemaker", "--region", REGION, "--yes"])
    assert result.exit_code == 0, result.output
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["other-20250101-000000"]
    configs = sm.list_endpoint_configs()["EndpointConfigs"]
    assert [c["EndpointConfigName"] for c in configs] == ["other-20250101-000000"]


@mock_aws
def test_a_gpu_endpoint_runs_the_machine_image_whose_driver_its_torch_needs(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    """The image's torch is PyPI's CUDA 13 build; the variant pins the machine image whose
    NVIDIA driver (580, CUDA 13.0) runs it, instead of whatever SageMaker would pick."""
    # (moto's list of endpoint instance types stops before g5: a T4 deploys as any GPU does)
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--instance-type", "ml.g4dn.xlarge")
    assert result.exit_code == 0, result.output
    sm = boto3.client("sagemaker", region_name=REGION)
    name = sm.describe_endpoint(EndpointName="infinity-cloud")["EndpointConfigName"]
    (variant,) = sm.describe_endpoint_config(EndpointConfigName=name)["ProductionVariants"]
    assert variant["InferenceAmiVersion"] == GPU_AMI == "al2023-ami-sagemaker-inference-gpu-4-1"
    # botocore's own model of the API says which driver and CUDA that image has.
    variant_shape = sm.meta.service_model.shape_for("ProductionVariant")
    documented = variant_shape.members["InferenceAmiVersion"].documentation
    assert re.search(rf"{GPU_AMI}</dt> <dd> <ul> <li> <p>Accelerator: GPU</p> </li> <li> <p>NVIDIA driver "
                     r"version: 580</p> </li> <li> <p>CUDA version: 13\.0", documented)
    assert "download.pytorch.org" not in (tmp_path / "build" / "Dockerfile").read_text()  # PyPI's torch


@mock_aws
def test_a_deploy_prints_its_invocation_url_and_a_signed_call_that_works(
    tmp_path: Path, tiny_embedder: Path, runtime: tuple[str, list[dict[str, Any]]]
) -> None:
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--served-model-name", "emb",
                    "--instance-type", "ml.m5.large", "--endpoint-name", "emb")
    assert result.exit_code == 0, result.output
    url = f"{RUNTIME_URL}/endpoints/emb/invocations"
    assert f"endpoint: {url}" in result.output and "printed above" not in result.output
    assert f"awscurl --service sagemaker --region {REGION} -X POST {url}" in result.output
    assert "X-Amzn-SageMaker-Custom-Attributes: route=embeddings" in result.output
    # The printed boto3 call, run as printed, against the runtime's stand-in (real HTTP).
    snippet = result.output.split("python - <<'PY'\n", 1)[1].split("\nPY", 1)[0]
    stand_in, _ = runtime
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": stand_in})
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0  # the embedding's dimension


@mock_aws
def test_a_deploy_that_fails_midway_deletes_what_it_created(tmp_path: Path, tiny_embedder: Path) -> None:
    """moto refuses ml.g5 in an endpoint config (as AWS refuses a type a region lacks): the
    model made before it is deleted again, and the error is one line."""
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--instance-type", "ml.g5.xlarge")
    assert result.exit_code == 2 and "AWS refused to deploy endpoint" in result.output
    assert "rolled back: sagemaker.delete_model(infinity-cloud-" in result.output
    sm = boto3.client("sagemaker", region_name=REGION)
    assert sm.list_models()["Models"] == [] and sm.list_endpoint_configs()["EndpointConfigs"] == []


# -- what moto lacks, with botocore's Stubber over the real API models --------------------------


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Stubber]]:
    """Real boto3 clients whose responses are stubbed; each call is checked against the API."""
    services = ("sagemaker", "application-autoscaling", "sagemaker-runtime")
    made = {s: boto3.client(s, region_name=REGION) for s in services}
    stubs = {s: Stubber(c) for s, c in made.items()}
    monkeypatch.setattr(sagemaker_api, "clients", lambda settings: made.__getitem__)
    for stub in stubs.values():
        stub.activate()
    yield stubs
    for stub in stubs.values():
        stub.assert_no_pending_responses()


@pytest.fixture
def call_order(stubbed: dict[str, Stubber]) -> list[str]:
    """Every API call made, in order, across the clients (each Stubber orders only its own)."""
    order: list[str] = []
    for stub in stubbed.values():
        stub.client.meta.events.register_first("before-call.*.*", lambda model, **_: order.append(model.name))
    return order


def endpoint_state(status: str, config: str = "emb-new", **extra: Any) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    return {"EndpointName": "emb", "EndpointArn": f"{ARN}:endpoint/emb",
            "EndpointConfigName": config, "EndpointStatus": status, "CreationTime": now,
            "LastModifiedTime": now, **extra}


NOT_FOUND = {"service_error_code": "ValidationException",
             "service_message": f'Could not find endpoint "{ARN}:endpoint/emb".'}


def stub_creation(sm: Stubber, update: bool = False) -> None:
    sm.add_response("create_model", {"ModelArn": f"{ARN}:model/m"})
    sm.add_response("create_endpoint_config", {"EndpointConfigArn": f"{ARN}:endpoint-config/c"})
    endpoint = "update_endpoint" if update else "create_endpoint"
    sm.add_response(endpoint, {"EndpointArn": f"{ARN}:endpoint/emb"})


def test_a_gpu_endpoint_waits_through_creating_to_in_service(
    stubbed: dict[str, Stubber], tmp_path: Path, tiny_embedder: Path
) -> None:
    sm = stubbed["sagemaker"]
    sm.add_client_error("describe_endpoint", **NOT_FOUND)
    stub_creation(sm)
    for status in ("Creating", "Creating", "InService"):
        sm.add_response("describe_endpoint", endpoint_state(status), {"EndpointName": "emb"})
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--endpoint-name", "emb",
                    "--instance-type", "ml.g4dn.xlarge", "--startup-timeout", "2400")
    assert result.exit_code == 0, result.output
    assert "deployed sagemaker 'emb'" in result.output


def test_a_multi_gpu_instance_serves_on_every_gpu_and_scales_on_all_of_them(
    stubbed: dict[str, Stubber], tmp_path: Path, tiny_embedder: Path
) -> None:
    """ml.g5.12xlarge has 4 A10Gs (TEI serves on 1 of them, its #349): the image pins no GPU (no
    device ids, no CUDA_VISIBLE_DEVICES), so its server makes an engine replica on each, and an
    instance takes 4 times one GPU's invocations before autoscaling adds another (600 x 4)."""
    sm, scaling = stubbed["sagemaker"], stubbed["application-autoscaling"]
    sm.add_client_error("describe_endpoint", **NOT_FOUND)
    sm.add_response("create_model", {"ModelArn": f"{ARN}:model/m"})
    sm.add_response("create_endpoint_config", {"EndpointConfigArn": f"{ARN}:endpoint-config/c"})
    sm.add_response("create_endpoint", {"EndpointArn": f"{ARN}:endpoint/emb"})
    sm.add_response("describe_endpoint", endpoint_state("InService"), {"EndpointName": "emb"})
    scaling.add_response("register_scalable_target", {})
    policy: dict[str, Any] = {}
    scaling.add_response("put_scaling_policy", {"PolicyARN": "arn:aws:autoscaling:policy/p", "Alarms": []})
    scaling.client.meta.events.register(
        "provide-client-params.application-autoscaling.PutScalingPolicy",
        lambda params, **_: policy.update(params["TargetTrackingScalingPolicyConfiguration"]))
    configs: list[dict[str, Any]] = []
    sm.client.meta.events.register("provide-client-params.sagemaker.CreateEndpointConfig",
                                   lambda params, **_: configs.append(params))
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--endpoint-name", "emb",
                    "--instance-type", "ml.g5.12xlarge", "--autoscale", "1:3")
    assert result.exit_code == 0, result.output
    (variant,) = configs[0]["ProductionVariants"]
    assert (variant["InstanceType"], variant["InferenceAmiVersion"]) == ("ml.g5.12xlarge", GPU_AMI)
    assert policy["TargetValue"] == 2400.0
    served = yaml.safe_load((tmp_path / "build" / "infinity-cloud.yaml").read_text())
    for model in served["models"]:
        assert model.get("device", "auto") in ("auto", "cuda") and not model.get("device_ids")
    assert "CUDA_VISIBLE_DEVICES" not in (tmp_path / "build" / "Dockerfile").read_text()
    given = SageMakerSpec(instance_type="ml.g5.12xlarge", target_invocations=900)
    assert given.target_invocations == 900  # a given target stays
    assert SageMakerSpec(instance_type="ml.g5.2xlarge").target_invocations == 600


def test_a_failed_endpoint_says_sagemakers_reason(
    stubbed: dict[str, Stubber], tmp_path: Path, tiny_embedder: Path
) -> None:
    sm = stubbed["sagemaker"]
    sm.add_client_error("describe_endpoint", **NOT_FOUND)
    stub_creation(sm)
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    sm.add_response("describe_endpoint", endpoint_state("Creating"))
    sm.add_response("describe_endpoint", endpoint_state("Failed", FailureReason=reason))
    # Rolled back, newest first: the endpoint, its config, its model.
    for operation in ("delete_endpoint", "delete_endpoint_config", "delete_model"):
        sm.add_response(operation, {})
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--endpoint-name", "emb")
    assert result.exit_code == 2
    assert f"endpoint 'emb' is Failed: {reason}" in result.output and "Traceback" not in result.output
    assert result.output.count("rolled back:") == 3


def test_a_deploy_that_outwaits_the_cli_is_left_to_come_up(
    stubbed: dict[str, Stubber], tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Still Creating when the CLI stops waiting: it may yet come up, so nothing is deleted."""
    monkeypatch.setattr(sagemaker_api, "WAIT_LIMIT_S", -1.0)
    sm = stubbed["sagemaker"]
    sm.add_client_error("describe_endpoint", **NOT_FOUND)
    stub_creation(sm)
    sm.add_response("describe_endpoint", endpoint_state("Creating"))
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--endpoint-name", "emb")
    assert result.exit_code == 2 and "still Creating" in result.output and "ask status later" in result.output
    assert "roll back" not in result.output and "rolled back" not in result.output


def test_a_failed_update_keeps_the_old_config_and_deletes_the_new_one(
    stubbed: dict[str, Stubber], tmp_path: Path, tiny_embedder: Path
) -> None:
    """SageMaker puts an endpoint whose update failed back on its old config, InService: that
    is a failure, and the new model and config go."""
    sm = stubbed["sagemaker"]
    sm.add_response("describe_endpoint", endpoint_state("InService", config="emb-old"))
    stubbed["application-autoscaling"].add_response("describe_scalable_targets", {"ScalableTargets": []})
    stub_creation(sm, update=True)
    sm.add_response("describe_endpoint", endpoint_state("Updating", config="emb-old"))
    reason = "The primary container did not pass the ping health check."
    sm.add_response("describe_endpoint", endpoint_state("InService", config="emb-old", FailureReason=reason))
    sm.add_response("delete_endpoint_config", {})
    sm.add_response("delete_model", {})
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--endpoint-name", "emb")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "could not move to emb-" in message and f"still serves emb-old: {reason}" in message
    assert "delete_endpoint(" not in message and message.count("rolled back:") == 2


def test_an_html_error_page_is_one_readable_line() -> None:
    """A proxy's or load balancer's HTML page in place of AWS's error: its title, on one line."""
    from botocore.exceptions import ClientError

    from infinity_cloud.targets.aws import AwsError, aws_calls

    page = ("<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<center><h1>502 Bad Gateway"
            "</h1></center>\n<hr><center>nginx</center>\n</body>\n</html>")
    with pytest.raises(AwsError) as raised, aws_calls("describe endpoint 'emb'"):
        raise ClientError({"Error": {"Code": "502", "Message": page}}, "DescribeEndpoint")
    message = str(raised.value)
    assert "\n" not in message and "<" not in message
    assert message.startswith("AWS refused to describe endpoint 'emb': 502: 502 Bad Gateway (an HTML page")
    xml = ('<?xml version="1.0" encoding="utf-8"?>\n<ErrorResponse><Errors><Error><Code>AccessDenied</Code>'
           "<Message>User: arn:aws:iam::1:user/d is not authorized</Message></Error></Errors>"
           "</ErrorResponse>")
    with pytest.raises(AwsError) as raised, aws_calls("describe endpoint 'emb'"):
        raise ClientError({"Error": {"Code": "403", "Message": xml}}, "DescribeEndpoint")
    assert str(raised.value) == ("AWS refused to describe endpoint 'emb': 403: AccessDenied: User: "
                                 "arn:aws:iam::1:user/d is not authorized")


def test_deploying_an_existing_name_updates_it_blue_green(
    stubbed: dict[str, Stubber], tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new model and config, the endpoint moved to them, then the old ones deleted."""
    monkeypatch.setattr(sagemaker_api, "stamp", lambda: "20260101-000000")
    sm, scaling = stubbed["sagemaker"], stubbed["application-autoscaling"]
    sm.add_response("describe_endpoint", endpoint_state("InService", config="emb-old"))
    scaling.add_response("describe_scalable_targets", {"ScalableTargets": []}, DESCRIBE_TARGET)
    stub_creation(sm, update=True)
    sm.add_response("describe_endpoint", endpoint_state("Updating", config="emb-old"))
    sm.add_response("describe_endpoint", endpoint_state("InService", config="emb-20260101-000000"))
    scaling.add_response("register_scalable_target", {})
    policy = {"PolicyARN": "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:p", "Alarms": []}
    scaling.add_response("put_scaling_policy", policy)
    old_variant = {"VariantName": "AllTraffic", "ModelName": "emb-old", "InstanceType": "ml.g5.xlarge",
                   "InitialInstanceCount": 1}
    sm.add_response("describe_endpoint_config", {
        "EndpointConfigName": "emb-old", "EndpointConfigArn": f"{ARN}:endpoint-config/emb-old",
        "ProductionVariants": [old_variant], "CreationTime": datetime.now(timezone.utc)},
        {"EndpointConfigName": "emb-old"})
    sm.add_response("delete_endpoint_config", {}, {"EndpointConfigName": "emb-old"})
    sm.add_response("delete_model", {}, {"ModelName": "emb-old"})
    args = ["--model-id", str(tiny_embedder), "--endpoint-name", "emb", "--autoscale", "1:4"]
    result = deploy(tmp_path, *args)
    assert result.exit_code == 0, result.output


TARGET = {"ServiceNamespace": "sagemaker", "ResourceId": "endpoint/emb/variant/AllTraffic",
          "ScalableDimension": "sagemaker:variant:DesiredInstanceCount"}
DESCRIBE_TARGET = {"ServiceNamespace": "sagemaker", "ResourceIds": [TARGET["ResourceId"]],
                   "ScalableDimension": TARGET["ScalableDimension"]}
OLD_TRACKING = {"TargetValue": 600.0, "PredefinedMetricSpecification": {"PredefinedMetricType": PER_INSTANCE},
                "ScaleInCooldown": 300, "ScaleOutCooldown": 60}
SCALING_ROLE = ("arn:aws:iam::123456789012:role/aws-service-role/"
                "sagemaker.application-autoscaling.amazonaws.com/AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint")


def stub_old_scaling(scaling: Stubber) -> None:
    """The endpoint autoscaled 1 to 3 on invocations, as an earlier --autoscale 1:3 left it,
    and its removal as AWS documents it: the policies, then the scalable target."""
    now = datetime.now(timezone.utc)
    registered = {**TARGET, "MinCapacity": 1, "MaxCapacity": 3, "RoleARN": SCALING_ROLE, "CreationTime": now}
    scaling.add_response("describe_scalable_targets", {"ScalableTargets": [registered]}, DESCRIBE_TARGET)
    policy = {**TARGET, "PolicyARN": "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:p",
              "PolicyName": "emb-invocations", "PolicyType": "TargetTrackingScaling",
              "TargetTrackingScalingPolicyConfiguration": OLD_TRACKING, "CreationTime": now}
    scaling.add_response("describe_scaling_policies", {"ScalingPolicies": [policy]}, TARGET)
    scaling.add_response("delete_scaling_policy", {}, {**TARGET, "PolicyName": "emb-invocations"})
    scaling.add_response("deregister_scalable_target", {}, TARGET)


def stub_old_config_deleted(sm: Stubber) -> None:
    old_variant = {"VariantName": "AllTraffic", "ModelName": "emb-old", "InstanceType": "ml.g5.xlarge",
                   "InitialInstanceCount": 1}
    sm.add_response("describe_endpoint_config", {
        "EndpointConfigName": "emb-old", "EndpointConfigArn": f"{ARN}:endpoint-config/emb-old",
        "ProductionVariants": [old_variant], "CreationTime": datetime.now(timezone.utc)},
        {"EndpointConfigName": "emb-old"})
    sm.add_response("delete_endpoint_config", {}, {"EndpointConfigName": "emb-old"})
    sm.add_response("delete_model", {}, {"ModelName": "emb-old"})


@pytest.mark.parametrize("autoscale", [["--autoscale", "2:6"], []])
def test_redeploying_an_autoscaled_endpoint_deregisters_it_before_the_update(
    stubbed: dict[str, Stubber], call_order: list[str], tmp_path: Path, tiny_embedder: Path,
    monkeypatch: pytest.MonkeyPatch, autoscale: list[str],
) -> None:
    """AWS refuses to update a variant that is a scalable target ("... has Auto Scaling
    enabled"): its policies and target go just before update_endpoint, and --autoscale
    registers anew once the endpoint is InService; without it nothing stays registered."""
    monkeypatch.setattr(sagemaker_api, "stamp", lambda: "20260101-000000")
    sm, scaling = stubbed["sagemaker"], stubbed["application-autoscaling"]
    old = endpoint_state("InService", config="emb-old")
    sm.add_response("describe_endpoint", old, {"EndpointName": "emb"})
    stub_old_scaling(scaling)
    stub_creation(sm, update=True)
    sm.add_response("describe_endpoint", endpoint_state("Updating", config="emb-old"))
    sm.add_response("describe_endpoint", endpoint_state("InService", config="emb-20260101-000000"))
    if autoscale:
        scaling.add_response("register_scalable_target", {}, {**TARGET, "MinCapacity": 2, "MaxCapacity": 6})
        policy = {"PolicyARN": "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:q", "Alarms": []}
        scaling.add_response("put_scaling_policy", policy, {
            **TARGET, "PolicyName": "emb-invocations", "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": OLD_TRACKING})
    stub_old_config_deleted(sm)
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--endpoint-name", "emb", *autoscale)
    assert result.exit_code == 0, result.output
    expected = [
        "DescribeEndpoint", "DescribeScalableTargets", "DescribeScalingPolicies",
        "CreateModel", "CreateEndpointConfig",
        "DeleteScalingPolicy", "DeregisterScalableTarget", "UpdateEndpoint",
        "DescribeEndpoint", "DescribeEndpoint",
        *(["RegisterScalableTarget", "PutScalingPolicy"] if autoscale else []),
        "DescribeEndpointConfig", "DeleteEndpointConfig", "DeleteModel",
    ]
    assert call_order == expected


def test_a_failed_update_of_an_autoscaled_endpoint_registers_its_autoscaling_again(
    stubbed: dict[str, Stubber], tmp_path: Path, tiny_embedder: Path
) -> None:
    """SageMaker puts the endpoint back on its old config; its autoscaling, removed for the
    update, is registered again as it was (bounds and policy), with the new config and model
    deleted."""
    sm, scaling = stubbed["sagemaker"], stubbed["application-autoscaling"]
    sm.add_response("describe_endpoint", endpoint_state("InService", config="emb-old"))
    stub_old_scaling(scaling)
    stub_creation(sm, update=True)
    reason = "The primary container did not pass the ping health check."
    sm.add_response("describe_endpoint", endpoint_state("InService", config="emb-old", FailureReason=reason))
    sm.add_response("delete_endpoint_config", {})
    sm.add_response("delete_model", {})
    scaling.add_response("register_scalable_target", {}, {**TARGET, "MinCapacity": 1, "MaxCapacity": 3})
    policy = {"PolicyARN": "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:p", "Alarms": []}
    scaling.add_response("put_scaling_policy", policy, {
        **TARGET, "PolicyName": "emb-invocations", "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": OLD_TRACKING})
    args = ["--model-id", str(tiny_embedder), "--endpoint-name", "emb", "--autoscale", "2:6"]
    result = deploy(tmp_path, *args)
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"still serves emb-old: {reason}" in message
    restored = "rolled back: application-autoscaling."
    assert f"{restored}register_scalable_target(endpoint/emb/variant/AllTraffic)" in message
    assert f"{restored}put_scaling_policy(emb-invocations)" in message


def test_dry_run_prints_the_calls_and_calls_nothing(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sagemaker_api, "clients", lambda settings: pytest.fail("AWS was called"))
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--serverless", "--dry-run")
    assert result.exit_code == 0, result.output
    for call in ("create_model(", "create_endpoint_config(", "create_endpoint("):
        assert f"sagemaker.{call}" in result.output
    assert '"ServerlessConfig"' in result.output and ROLE in result.output and IMAGE in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--role", ROLE], "needs --image-uri"),
    (["--image-uri", IMAGE, "--role", "admin"], "is not an IAM role ARN"),
    (["--image-uri", IMAGE, "--role", ROLE, "--serverless", "--autoscale", "1:2"], "scales by itself"),
    (["--image-uri", IMAGE, "--role", ROLE, "--memory-mb", "5000"], "multiple of 1024"),
])
def test_bad_deploy_settings_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(cli, ["deploy", "sagemaker", "--out", str(tmp_path / "o"), "--dry-run", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_without_credentials_every_call_says_how_to_log_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_embedder: Path
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for command in (["status"], ["delete", "--yes"], ["invoke"]):
        result = runner.invoke(cli, [command[0], "sagemaker", "--region", REGION, *command[1:]])
        assert result.exit_code == 2 and "no AWS credentials" in result.output, result.output
    result = deploy(tmp_path, "--model-id", str(tiny_embedder))
    assert result.exit_code == 2 and "no AWS credentials" in result.output


# -- invoke_endpoint through a stand-in of the runtime endpoint ----------------------------------


class RuntimeStandIn(BaseHTTPRequestHandler):
    """POST /endpoints/NAME/invocations, forwarded to the container's /invocations with the
    custom attributes, as SageMaker's runtime does; a container error becomes a ModelError."""

    container_url = ""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {"Content-Type": self.headers["Content-Type"]}
        attributes = self.headers.get(ROUTE_HEADER)
        if attributes:
            headers[ROUTE_HEADER] = attributes
        answer = httpx.post(f"{self.container_url}/invocations", content=body, headers=headers, timeout=60)
        if answer.status_code == 200:
            self._send(200, answer.content, {"Content-Type": "application/json"})
        else:
            error = {"message": "Received client error from primary with message ...",
                     "OriginalStatusCode": answer.status_code, "OriginalMessage": answer.text}
            self._send(424, json.dumps(error).encode(), {"x-amzn-ErrorType": "ModelError:",
                                                         "Content-Type": "application/json"})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, tiny_embedder: Path, tiny_reranker: Path,
            tiny_classifier: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    folders = {"emb": tiny_embedder, "rr": tiny_reranker, "cl": tiny_classifier}
    models = [fake_model(path, name) for name, path in folders.items()]
    container = Serve(write_config(tmp_path_factory.mktemp("runtime"), models))
    handler = type("Handler", (RuntimeStandIn,), {"container_url": container.url})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        container.wait_listening()
        container.wait_ready()
        yield f"http://127.0.0.1:{server.server_address[1]}", models
    finally:
        server.shutdown()
        container.stop()


@pytest.mark.parametrize("route", list(BODIES))
async def test_invoke_endpoint_answers_as_the_local_server_does(
    runtime: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    url, models = runtime
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", url)  # botocore's own override
    body = BODIES[route]
    flags = ["--region", REGION, "--endpoint-name", "emb", "--route", route, "--model", body["model"]]
    if route == "rerank":
        flags += ["--query", body["query"], *(f for doc in body["documents"] for f in ("--document", doc))]
    else:
        flags += [f for text in body["input"] for f in ("--input", text)]
    result = runner.invoke(cli, ["invoke", "sagemaker", *flags])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    path = {"embeddings": "/embeddings", "rerank": "/rerank", "classify": "/classify"}[route]
    async with serve_in_process(spec_of(*(ModelSpec(**m) for m in models))) as local:
        expected = (await local.post(path, json=body)).json()
    assert answer["object"] == expected["object"]
    key = "results" if route == "rerank" else "data"
    assert answer[key] == expected[key]


def test_a_container_error_through_invoke_is_one_line(
    runtime: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = runtime
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", url)
    flags = ["--region", REGION, "--route", "rerank", "--model", "rr", "--input", "x"]
    result = runner.invoke(cli, ["invoke", "sagemaker", *flags])
    assert result.exit_code == 2
    assert "the endpoint answered 422" in result.output and "query" in result.output


async def test_the_python_client_mirrors_the_openai_and_cohere_shapes(
    runtime: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, models = runtime
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", url)
    client = SageMakerClient("emb", region_name=REGION)
    async with serve_in_process(spec_of(*(ModelSpec(**m) for m in models))) as local:
        body = BODIES["embeddings"]
        vectors = client.embeddings.create(input=body["input"], model="emb")
        expected = (await local.post("/embeddings", json=body)).json()
        assert [d.index for d in vectors.data] == [0, 1, 2]
        got = np.array([d.embedding for d in vectors.data])
        # Exact float32 from base64 against the JSON floats the server rounds to 6 decimals.
        np.testing.assert_allclose(got, [d["embedding"] for d in expected["data"]], atol=1e-6)
        assert vectors.usage.prompt_tokens == expected["usage"]["prompt_tokens"]

        body = BODIES["rerank"]
        ranked = client.rerank(body["query"], body["documents"], model="rr", top_n=2, return_documents=True)
        expected = (await local.post("/rerank", json={**body, "top_n": 2, "return_documents": True})).json()
        assert [(r.index, r.relevance_score, r.document) for r in ranked.results] == [
            (r["index"], r["relevance_score"], r["document"]) for r in expected["results"]]

        body = BODIES["classify"]
        labels = client.classify(body["input"], model="cl")
        expected = (await local.post("/classify", json=body)).json()
        assert [[(x.label, x.score) for x in row] for row in labels.data] == [
            [(x["label"], x["score"]) for x in row] for row in expected["data"]]
    with pytest.raises(sagemaker_api.SageMakerError, match="the endpoint answered 404"):
        client.embeddings.create(input=["x"], model="no-such-model")


class NotJsonStandIn(BaseHTTPRequestHandler):
    """A runtime endpoint that answers 200 with something that is not JSON (a proxy's page)."""

    page = b"<html><head><title>Sign in to the proxy</title></head><body>" + b"x" * 2000 + b"</body></html>"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.mark.parametrize("command", [
    ["invoke", "sagemaker", "--input", "hello"],
    ["smoke", "sagemaker", "--deployed", "--served-model-name", "emb", "--backend", FAKE],
])
def test_an_answer_that_is_not_json_is_one_line_saying_what_came_back(
    monkeypatch: pytest.MonkeyPatch, tiny_embedder: Path, command: list[str]
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotJsonStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        result = runner.invoke(cli, [*command, "--region", REGION, "--model-id", str(tiny_embedder)])
    finally:
        server.shutdown()
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    said = "endpoint 'infinity-cloud' answered 200 (text/html), not JSON: '<html><head><title>Sign in"
    assert said in message and "x" * 200 in message and "x" * 300 not in message  # the first 300 characters
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output


@mock_aws
def test_packed_models_are_uploaded_to_the_model_data_uri(tmp_path: Path, tiny_embedder: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="models")
    uri = "s3://models/emb/model.tar.gz"
    result = deploy(tmp_path, "--model-id", str(tiny_embedder), "--instance-type", "ml.g4dn.xlarge",
                    "--pack-models", "--model-data", uri)
    assert result.exit_code == 0, result.output
    uploaded = s3.get_object(Bucket="models", Key="emb/model.tar.gz")["Body"].read()
    assert uploaded == (tmp_path / "build" / "model.tar.gz").read_bytes()
    sm = boto3.client("sagemaker", region_name=REGION)
    (model,) = sm.list_models()["Models"]
    assert sm.describe_model(ModelName=model["ModelName"])["PrimaryContainer"]["ModelDataUrl"] == uri
    missing = deploy(tmp_path, "--model-id", str(tiny_embedder), "--pack-models", "--dry-run")
    assert missing.exit_code == 2 and "--pack-models needs --model-data" in missing.output


@mock_aws
def test_a_plans_spec_deploys_with_its_instances_and_autoscaling(tmp_path: Path, tiny_embedder: Path) -> None:
    """`plan --write` for SageMaker, deployed as written: its instance type, count and
    InvocationsPerInstance target reach the endpoint and its scaling policy."""
    spec = tmp_path / "plan.yaml"
    argv = ["plan", "--model-id", str(tiny_embedder), "--target", "sagemaker", "--qps", "200000",
            "--hardware", "ml.m5.xlarge", "--write", str(spec)]
    planned = runner.invoke(cli, argv)
    assert planned.exit_code == 0, planned.output
    chosen = yaml.safe_load(spec.read_text())["sagemaker"]
    assert chosen["instance_count"] > 1  # enough load to scale
    result = deploy(tmp_path, "--config", str(spec), "--endpoint-name", "planned")
    assert result.exit_code == 0, result.output
    sm = boto3.client("sagemaker", region_name=REGION)
    endpoint = sm.describe_endpoint(EndpointName="planned")
    config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    (variant,) = config["ProductionVariants"]
    assert variant["InstanceType"] == "ml.m5.xlarge"
    assert variant["InitialInstanceCount"] == chosen["instance_count"]
    scaling = boto3.client("application-autoscaling", region_name=REGION)
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    floor = int(chosen["autoscale"].split(":")[0])  # the plan's floor: 2 for a production plan
    assert floor == 2
    assert (target["MinCapacity"], target["MaxCapacity"]) == (floor, chosen["instance_count"])
    (policy,) = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == float(chosen["target_invocations"])
