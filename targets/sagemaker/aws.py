"""The SageMaker control and data planes through boto3: the deploy as a plan of API calls
(printed by --dry-run, run otherwise), waiting for InService, autoscaling, status, delete,
and invoke_endpoint. Every AWS failure ends in one clear line."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infinity_cloud.errors import ConfigError
from infinity_cloud.targets.aws import AwsError, Call, run
from infinity_cloud.targets.aws import clients as aws_clients
from infinity_cloud.targets.base import one_line
from infinity_cloud.targets.sagemaker.spec import SageMakerSpec

VARIANT = "AllTraffic"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
# How often the deploy asks for the endpoint's state, and for how long at most.
POLL_S = 15.0
WAIT_LIMIT_S = 3600.0
FAILED = ("Failed", "OutOfService")


class SageMakerError(AwsError):
    """The endpoint failed, or answered with an error."""


class StillDeploying(SageMakerError):
    """The endpoint is still on its way after the wait: it may yet come up."""


def clients(settings: SageMakerSpec) -> Callable[[str], Any]:
    return aws_clients(settings.region)


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


def deploy_calls(
    settings: SageMakerSpec, version: str, update: bool, archive: Path | None = None
) -> list[Call]:
    """The calls that deploy the endpoint: the model archive uploaded (with --pack-models),
    a new model and endpoint config (named with `version`, so a redeploy is blue/green),
    then the endpoint created or moved to the new config, then autoscaling."""
    upload: list[Call] = []
    if settings.pack_models:
        if not settings.model_data or archive is None:
            raise ConfigError("--pack-models needs --model-data s3://BUCKET/KEY.tar.gz to upload it to")
        bucket, _, key = settings.model_data.removeprefix("s3://").partition("/")
        upload = [Call("s3", "upload_file", {"Filename": str(archive), "Bucket": bucket, "Key": key})]
    name = f"{settings.endpoint_name}-{version}"
    container: dict[str, Any] = {"Image": settings.image_uri}
    if settings.model_data:
        container["ModelDataUrl"] = settings.model_data
    variant: dict[str, Any] = {"VariantName": VARIANT, "ModelName": name}
    if settings.serverless:
        variant["ServerlessConfig"] = {
            "MemorySizeInMB": settings.memory_mb, "MaxConcurrency": settings.max_concurrency,
        }
    else:
        variant.update(
            InstanceType=settings.instance_type, InitialInstanceCount=settings.instance_count,
            # Large models take minutes to load; SageMaker's default gives up sooner.
            ContainerStartupHealthCheckTimeoutInSeconds=settings.startup_timeout_s,
        )
    endpoint = {"EndpointName": settings.endpoint_name, "EndpointConfigName": name}
    calls = [
        Call("sagemaker", "create_model", {
            "ModelName": name, "ExecutionRoleArn": settings.role, "PrimaryContainer": container,
        }),
        Call("sagemaker", "create_endpoint_config", {
            "EndpointConfigName": name, "ProductionVariants": [variant],
        }),
        Call("sagemaker", "update_endpoint" if update else "create_endpoint", endpoint),
    ]
    return upload + calls + scaling_calls(settings)


def scaling_calls(settings: SageMakerSpec) -> list[Call]:
    if settings.scaling is None:
        return []
    low, high = settings.scaling
    target = {
        "ServiceNamespace": "sagemaker", "ResourceId": resource_id(settings.endpoint_name),
        "ScalableDimension": SCALABLE_DIMENSION,
    }
    policy = {
        "TargetValue": float(settings.target_invocations),
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "ScaleInCooldown": 300, "ScaleOutCooldown": 60,
    }
    return [
        Call("application-autoscaling", "register_scalable_target",
             {**target, "MinCapacity": low, "MaxCapacity": high}),
        Call("application-autoscaling", "put_scaling_policy", {
            **target, "PolicyName": f"{settings.endpoint_name}-invocations",
            "PolicyType": "TargetTrackingScaling", "TargetTrackingScalingPolicyConfiguration": policy,
        }),
    ]


def describe_endpoint(client: Callable[[str], Any], name: str) -> dict[str, Any] | None:
    """The endpoint's description, or None when there is none of that name."""
    from botocore.exceptions import ClientError

    try:
        return client("sagemaker").describe_endpoint(EndpointName=name)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ValidationException" and "not find" in error.get("Message", "").lower():
            return None
        raise


def wait_in_service(
    client: Callable[[str], Any], name: str, report: Callable[[str, float], None], config: str | None = None
) -> dict[str, Any]:
    """Poll until the endpoint is InService (on `config`, when given); a failure raises with
    SageMaker's reason. A failed update is InService again, on its old config: SageMaker
    rolled it back."""
    started = time.monotonic()
    while True:
        endpoint = describe_endpoint(client, name)
        if endpoint is None:
            raise SageMakerError(f"endpoint {name!r} disappeared while deploying")
        status, elapsed = endpoint["EndpointStatus"], time.monotonic() - started
        report(status, elapsed)
        if status == "InService" and config is not None and endpoint["EndpointConfigName"] != config:
            reason = endpoint.get("FailureReason") or "SageMaker gave no reason"
            raise SageMakerError(
                f"endpoint {name!r} could not move to {config} and still serves "
                f"{endpoint['EndpointConfigName']}: {reason}"
            )
        if status == "InService":
            return endpoint
        if status in FAILED:
            reason = endpoint.get("FailureReason") or "SageMaker gave no reason"
            raise SageMakerError(f"endpoint {name!r} is {status}: {reason}")
        if elapsed > WAIT_LIMIT_S:
            raise StillDeploying(f"endpoint {name!r} still {status} after {elapsed:.0f} s; ask status later")
        time.sleep(POLL_S)


def resources_of(client: Callable[[str], Any], config_name: str) -> list[Call]:
    """The delete calls for an endpoint config and the models its variants run."""
    config = client("sagemaker").describe_endpoint_config(EndpointConfigName=config_name)
    models = [v["ModelName"] for v in config.get("ProductionVariants", [])]
    return [
        Call("sagemaker", "delete_endpoint_config", {"EndpointConfigName": config_name}),
        *(Call("sagemaker", "delete_model", {"ModelName": m}) for m in models),
    ]


# The undo of each call a deploy makes.
_UNDO = {
    "create_model": ("delete_model", "ModelName"),
    "create_endpoint_config": ("delete_endpoint_config", "EndpointConfigName"),
    "create_endpoint": ("delete_endpoint", "EndpointName"),
}


def roll_back(client: Callable[[str], Any], made: list[Call]) -> None:
    """Delete what a failed deploy created, newest first (an updated endpoint SageMaker rolls
    back itself). Each step is tried and said; a failing one does not hide the deploy's error."""
    from botocore.exceptions import BotoCoreError, ClientError

    for call in reversed(made):
        if call.operation not in _UNDO:
            continue
        operation, key = _UNDO[call.operation]
        undo = Call(call.service, operation, {key: call.params[key]})
        try:
            run(client, undo)
            print(f"rolled back: {call.service}.{operation}({call.params[key]})", file=sys.stderr)
        except (ClientError, BotoCoreError) as exc:
            print(f"could not roll back {call.params[key]}: {one_line(str(exc))}; delete it by hand",
                  file=sys.stderr)


def _stamped(endpoint: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(endpoint)}-\d{{8}}-\d{{6}}$")


def leftovers(client: Callable[[str], Any], endpoint: str) -> list[Call]:
    """The delete calls for every endpoint config and model named as this endpoint's deploys
    name them (`NAME-YYYYMMDD-HHMMSS`): those a failed or replaced deploy left behind."""
    sm, stamped = client("sagemaker"), _stamped(endpoint)
    calls = []
    for page in sm.get_paginator("list_endpoint_configs").paginate(NameContains=endpoint):
        calls += [Call("sagemaker", "delete_endpoint_config", {"EndpointConfigName": c["EndpointConfigName"]})
                  for c in page["EndpointConfigs"] if stamped.match(c["EndpointConfigName"])]
    for page in sm.get_paginator("list_models").paginate(NameContains=endpoint):
        calls += [Call("sagemaker", "delete_model", {"ModelName": m["ModelName"]})
                  for m in page["Models"] if stamped.match(m["ModelName"])]
    return calls


def scaling_registered(client: Callable[[str], Any], endpoint: str) -> bool:
    found = client("application-autoscaling").describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[resource_id(endpoint)],
        ScalableDimension=SCALABLE_DIMENSION,
    )
    return bool(found.get("ScalableTargets"))


def invoke(client: Callable[[str], Any], endpoint: str, body: dict[str, Any], route: str | None) -> Any:
    """invoke_endpoint with a JSON body; `route` goes in the custom attributes, as
    /invocations reads it. A container's error answer is raised with its own message."""
    from botocore.exceptions import ClientError

    extra = {"CustomAttributes": f"route={route}"} if route else {}
    try:
        answer = client("sagemaker-runtime").invoke_endpoint(
            EndpointName=endpoint, ContentType="application/json", Accept="application/json",
            Body=json.dumps(body).encode(), **extra,
        )
    except ClientError as exc:
        response = exc.response
        if response.get("Error", {}).get("Code") == "ModelError":
            status = response.get("OriginalStatusCode", "?")
            raise SageMakerError(f"the endpoint answered {status}: {_container_message(response)}") from None
        raise
    return json.loads(answer["Body"].read())


def _container_message(response: dict[str, Any]) -> str:
    original = response.get("OriginalMessage") or response.get("Error", {}).get("Message", "")
    try:
        return json.loads(original)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return one_line(str(original))
