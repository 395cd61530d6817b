"""The SageMaker control and data planes through boto3: the deploy as a plan of API calls
(printed by --dry-run, run otherwise), waiting for InService, autoscaling, status, delete,
and invoke_endpoint. Every AWS failure ends in one clear line."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infinity_cloud.core.errors import ConfigError
from infinity_cloud.targets.aws import ApiCall, AwsError, run
from infinity_cloud.targets.aws import clients as aws_clients
from infinity_cloud.targets.base import json_answer, one_line
from infinity_cloud.targets.sagemaker.spec import GPU_AMI, SageMakerSpec

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


def log_group(endpoint: str) -> str:
    """Where SageMaker writes an endpoint's containers' logs (every variant's)."""
    return f"/aws/sagemaker/Endpoints/{endpoint}"


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


def deploy_calls(
    settings: SageMakerSpec, version: str, update: bool, archive: Path | None = None
) -> list[ApiCall]:
    """The calls that deploy the endpoint: the model archive uploaded (with --pack-models),
    a new model and endpoint config (named with `version`, so a redeploy is blue/green),
    then the endpoint created or moved to the new config, then autoscaling."""
    upload: list[ApiCall] = []
    if settings.pack_models:
        if not settings.model_data or archive is None:
            raise ConfigError("--pack-models needs --model-data s3://BUCKET/KEY.tar.gz to upload it to")
        bucket, _, key = settings.model_data.removeprefix("s3://").partition("/")
        upload = [ApiCall("s3", "upload_file", {"Filename": str(archive), "Bucket": bucket, "Key": key})]
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
        if settings.variant == "gpu":  # the driver the image's torch was chosen for
            variant["InferenceAmiVersion"] = GPU_AMI
    endpoint = {"EndpointName": settings.endpoint_name, "EndpointConfigName": name}
    calls = [
        ApiCall("sagemaker", "create_model", {
            "ModelName": name, "ExecutionRoleArn": settings.role, "PrimaryContainer": container,
        }),
        ApiCall("sagemaker", "create_endpoint_config", {
            "EndpointConfigName": name, "ProductionVariants": [variant],
        }),
        ApiCall("sagemaker", "update_endpoint" if update else "create_endpoint", endpoint),
    ]
    return upload + calls + scaling_calls(settings)


def scalable_target(endpoint: str) -> dict[str, str]:
    """How Application Auto Scaling names the endpoint's variant."""
    return {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(endpoint),
            "ScalableDimension": SCALABLE_DIMENSION}


def scaling_calls(settings: SageMakerSpec) -> list[ApiCall]:
    if settings.scaling is None:
        return []
    low, high = settings.scaling
    target = scalable_target(settings.endpoint_name)
    policy = {
        "TargetValue": float(settings.target_invocations),
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "ScaleInCooldown": 300, "ScaleOutCooldown": 60,
    }
    return [
        ApiCall("application-autoscaling", "register_scalable_target",
             {**target, "MinCapacity": low, "MaxCapacity": high}),
        ApiCall("application-autoscaling", "put_scaling_policy", {
            **target, "PolicyName": f"{settings.endpoint_name}-invocations",
            "PolicyType": "TargetTrackingScaling", "TargetTrackingScalingPolicyConfiguration": policy,
        }),
    ]


@dataclass(frozen=True)
class Scaling:
    """An endpoint's autoscaling as it is now: the calls that remove it (its policies, then
    its scalable target) and those that put it back as it was. Empty when it has none."""

    removal: tuple[ApiCall, ...] = ()
    restore: tuple[ApiCall, ...] = ()


# The parts of a described scaling policy that put_scaling_policy takes back.
_POLICY_CONFIGS = ("TargetTrackingScalingPolicyConfiguration", "StepScalingPolicyConfiguration",
                   "PredictiveScalingPolicyConfiguration")


def current_scaling(client: Callable[[str], Any], endpoint: str) -> Scaling:
    """The endpoint's autoscaling, read from Application Auto Scaling."""
    scaling, target = client("application-autoscaling"), scalable_target(endpoint)
    found = scaling.describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[target["ResourceId"]],
        ScalableDimension=SCALABLE_DIMENSION,
    ).get("ScalableTargets", [])
    if not found:
        return Scaling()
    policies = scaling.describe_scaling_policies(**target).get("ScalingPolicies", [])
    service = "application-autoscaling"
    removal = [ApiCall(service, "delete_scaling_policy", {**target, "PolicyName": p["PolicyName"]})
               for p in policies]
    removal.append(ApiCall(service, "deregister_scalable_target", target))
    restore = [ApiCall(service, "register_scalable_target", {
        **target, "MinCapacity": found[0]["MinCapacity"], "MaxCapacity": found[0]["MaxCapacity"]})]
    restore += [ApiCall(service, "put_scaling_policy", {
        **target, "PolicyName": p["PolicyName"], "PolicyType": p["PolicyType"],
        **{key: p[key] for key in _POLICY_CONFIGS if key in p}}) for p in policies]
    return Scaling(tuple(removal), tuple(restore))


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


def resources_of(client: Callable[[str], Any], config_name: str) -> list[ApiCall]:
    """The delete calls for an endpoint config and the models its variants run."""
    config = client("sagemaker").describe_endpoint_config(EndpointConfigName=config_name)
    models = [v["ModelName"] for v in config.get("ProductionVariants", [])]
    return [
        ApiCall("sagemaker", "delete_endpoint_config", {"EndpointConfigName": config_name}),
        *(ApiCall("sagemaker", "delete_model", {"ModelName": m}) for m in models),
    ]


# The undo of each call a deploy makes.
_UNDO = {
    "create_model": ("delete_model", "ModelName"),
    "create_endpoint_config": ("delete_endpoint_config", "EndpointConfigName"),
    "create_endpoint": ("delete_endpoint", "EndpointName"),
}


def roll_back(client: Callable[[str], Any], made: list[ApiCall], scaling: Scaling = Scaling()) -> None:
    """Delete what a failed deploy created, newest first (an updated endpoint SageMaker rolls
    back itself), and register again the autoscaling it removed (`scaling`) for the update.
    Each step is tried and said; a failing one does not hide the deploy's error."""
    undo = [
        (ApiCall(call.service, operation, {key: call.params[key]}), call.params[key])
        for call in reversed(made) if call.operation in _UNDO
        for operation, key in [_UNDO[call.operation]]
    ]
    if any(call in made for call in scaling.removal):
        undo += [(call, call.params.get("PolicyName", call.params["ResourceId"])) for call in scaling.restore]
    _best_effort(client, undo)


def _best_effort(client: Callable[[str], Any], calls: list[tuple[ApiCall, str]]) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    for call, what in calls:
        try:
            run(client, call)
            print(f"rolled back: {call.service}.{call.operation}({what})", file=sys.stderr)
        except (ClientError, BotoCoreError) as exc:
            print(f"could not roll back {what}: {one_line(str(exc))}; do it by hand", file=sys.stderr)


def _stamped(endpoint: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(endpoint)}-\d{{8}}-\d{{6}}$")


def leftovers(client: Callable[[str], Any], endpoint: str) -> list[ApiCall]:
    """The delete calls for every endpoint config and model named as this endpoint's deploys
    name them (`NAME-YYYYMMDD-HHMMSS`): those a failed or replaced deploy left behind."""
    sm, stamped = client("sagemaker"), _stamped(endpoint)
    calls = []
    for page in sm.get_paginator("list_endpoint_configs").paginate(NameContains=endpoint):
        calls += [ApiCall("sagemaker", "delete_endpoint_config",
                          {"EndpointConfigName": c["EndpointConfigName"]})
                  for c in page["EndpointConfigs"] if stamped.match(c["EndpointConfigName"])]
    for page in sm.get_paginator("list_models").paginate(NameContains=endpoint):
        calls += [ApiCall("sagemaker", "delete_model", {"ModelName": m["ModelName"]})
                  for m in page["Models"] if stamped.match(m["ModelName"])]
    return calls


def invocation_url(client: Callable[[str], Any], endpoint: str) -> str:
    """Where the endpoint is called: the runtime's address in the clients' region (and
    partition), as botocore resolves it."""
    return f"{client('sagemaker-runtime').meta.endpoint_url.rstrip('/')}/endpoints/{endpoint}/invocations"


def usage_example(url: str, endpoint: str, region: str, model: str) -> str:
    """A SigV4-signed call of the endpoint, with awscurl and with boto3 (no bearer key: IAM
    decides who may call it)."""
    body = json.dumps({"model": model, "input": ["Hello from the cloud"]})
    return f"""awscurl --service sagemaker --region {region} -X POST {url} \\
  -H "Content-Type: application/json" -H "X-Amzn-SageMaker-Custom-Attributes: route=embeddings" \\
  -d '{body}'

python - <<'PY'
import json, boto3
runtime = boto3.client("sagemaker-runtime", region_name="{region}")
answer = runtime.invoke_endpoint(
    EndpointName="{endpoint}", ContentType="application/json", CustomAttributes="route=embeddings",
    Body=json.dumps({body}),
)
print(len(json.loads(answer["Body"].read())["data"][0]["embedding"]))
PY"""


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
    status = answer.get("ResponseMetadata", {}).get("HTTPStatusCode", 200)
    return json_answer(answer["Body"].read(), f"endpoint {endpoint!r}", status, answer.get("ContentType"))


def _container_message(response: dict[str, Any]) -> str:
    original = response.get("OriginalMessage") or response.get("Error", {}).get("Message", "")
    try:
        return json.loads(original)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return one_line(str(original))
