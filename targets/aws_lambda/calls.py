"""The Lambda API through boto3: create or update the function, wait until it is ready, its
URL (and the permission a public one needs), and a direct invocation."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from infinity_cloud.targets.aws import AwsError, Call
from infinity_cloud.targets.aws_lambda.spec import LambdaSpec

POLL_S = 2.0
WAIT_LIMIT_S = 900.0
PUBLIC_URL_STATEMENT = "infinity-cloud-public-url"


def describe(client: Callable[[str], Any], name: str) -> dict[str, Any] | None:
    """The function's configuration, or None when there is none of that name."""
    try:
        return client("lambda").get_function_configuration(FunctionName=name)
    except client("lambda").exceptions.ResourceNotFoundException:
        return None


def function_calls(settings: LambdaSpec, exists: bool) -> list[Call]:
    """Create the function from the image, or point it at the new image and settings."""
    name = settings.function_name
    configuration = {"MemorySize": settings.memory_mb, "Timeout": settings.timeout_s, "Role": settings.role}
    if not exists:
        return [Call("lambda", "create_function", {
            "FunctionName": name, "PackageType": "Image", "Code": {"ImageUri": settings.image_uri},
            "Architectures": [settings.architecture], **configuration,
        })]
    return [
        Call("lambda", "update_function_code", {
            "FunctionName": name, "ImageUri": settings.image_uri, "Architectures": [settings.architecture],
        }),
        Call("lambda", "update_function_configuration", {"FunctionName": name, **configuration}),
    ]


def wait_ready(client: Callable[[str], Any], name: str, report: Callable[[str], None]) -> None:
    """Until the function is Active and its last update Successful; a failure raises with
    Lambda's reason (the next update call would be refused while one is in progress)."""
    started = time.monotonic()
    while True:
        config = client("lambda").get_function_configuration(FunctionName=name)
        state, update = config.get("State", "Active"), config.get("LastUpdateStatus", "Successful")
        report(f"{state}, last update {update}")
        if state == "Failed" or update == "Failed":
            reason = config.get("StateReason") or config.get("LastUpdateStatusReason") or "no reason given"
            raise AwsError(f"function {name!r} failed: {reason}")
        if state == "Active" and update == "Successful":
            return
        if time.monotonic() - started > WAIT_LIMIT_S:
            raise AwsError(f"function {name!r} is still {state} ({update}); ask status later")
        time.sleep(POLL_S)


def url_of(client: Callable[[str], Any], name: str) -> str | None:
    try:
        return client("lambda").get_function_url_config(FunctionName=name)["FunctionUrl"]
    except client("lambda").exceptions.ResourceNotFoundException:
        return None


def ensure_url(client: Callable[[str], Any], settings: LambdaSpec) -> str:
    """The function's URL with the spec's auth; a public (NONE) one also needs a resource
    policy letting anyone invoke it."""
    lam, name = client("lambda"), settings.function_name
    if url_of(client, name) is None:
        url = lam.create_function_url_config(FunctionName=name, AuthType=settings.auth)["FunctionUrl"]
    else:
        url = lam.update_function_url_config(FunctionName=name, AuthType=settings.auth)["FunctionUrl"]
    if settings.auth == "NONE":
        with contextlib.suppress(lam.exceptions.ResourceConflictException):  # an earlier deploy's
            lam.add_permission(
                FunctionName=name, StatementId=PUBLIC_URL_STATEMENT, Action="lambda:InvokeFunctionUrl",
                Principal="*", FunctionUrlAuthType="NONE",
            )
    return url


def invoke(
    client: Callable[[str], Any], name: str, body: dict[str, Any], route: str | None, api_key: str | None
) -> Any:
    """The handler's direct invocation: {"route", "body"} in, {"statusCode", "body"} out."""
    event: dict[str, Any] = {"route": route or "invocations", "body": body}
    if api_key:
        event["headers"] = {"authorization": f"Bearer {api_key}"}
    answer = client("lambda").invoke(FunctionName=name, Payload=json.dumps(event).encode())
    payload = json.loads(answer["Payload"].read() or b"null")
    if answer.get("FunctionError"):
        raise AwsError(f"function {name!r} failed: {payload}")
    if payload["statusCode"] >= 400:
        message = (payload.get("body") or {}).get("error", {}).get("message", payload.get("body"))
        raise AwsError(f"function {name!r} answered {payload['statusCode']}: {message}")
    return payload["body"]
