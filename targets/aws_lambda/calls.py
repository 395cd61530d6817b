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
PUBLIC_INVOKE_STATEMENT = "infinity-cloud-public-url-invoke"
# Provisioned concurrency needs a published version; deploys that use it serve through this
# alias, which then follows every later deploy.
ALIAS = "live"


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


def wait_ready(
    client: Callable[[str], Any], name: str, report: Callable[[str], None], qualifier: str | None = None
) -> None:
    """Until the function (or one version of it) is Active and its last update Successful; a
    failure raises with Lambda's reason (the next update call would be refused while one is
    in progress)."""
    started = time.monotonic()
    label = f"{name}:{qualifier}" if qualifier else name
    while True:
        config = client("lambda").get_function_configuration(FunctionName=name, **_qualified(qualifier))
        state, update = config.get("State", "Active"), config.get("LastUpdateStatus", "Successful")
        report(f"{state}, last update {update}")
        if state == "Failed" or update == "Failed":
            reason = config.get("StateReason") or config.get("LastUpdateStatusReason") or "no reason given"
            raise AwsError(f"function {label!r} failed: {reason}")
        if state == "Active" and update == "Successful":
            return
        if time.monotonic() - started > WAIT_LIMIT_S:
            raise AwsError(f"function {label!r} is still {state} ({update}); ask status later")
        time.sleep(POLL_S)


def _qualified(qualifier: str | None) -> dict[str, str]:
    return {"Qualifier": qualifier} if qualifier else {}


def url_of(client: Callable[[str], Any], name: str, qualifier: str | None = None) -> str | None:
    try:
        config = client("lambda").get_function_url_config(FunctionName=name, **_qualified(qualifier))
        return config["FunctionUrl"]
    except client("lambda").exceptions.ResourceNotFoundException:
        return None


def url_calls(settings: LambdaSpec, qualifier: str | None = None, exists: bool = False) -> list[Call]:
    """The function's (or its alias's) URL with the spec's auth. A public (NONE) one also needs
    a resource policy letting anyone call it: since October 2025 both lambda:InvokeFunctionUrl
    and lambda:InvokeFunction (the latter only through the URL), else it answers 403."""
    name, where = settings.function_name, _qualified(qualifier)
    write = "update_function_url_config" if exists else "create_function_url_config"
    calls = [Call("lambda", write, {"FunctionName": name, "AuthType": settings.auth, **where})]
    if settings.auth == "NONE":
        calls += [
            Call("lambda", "add_permission", {
                "FunctionName": name, "StatementId": PUBLIC_URL_STATEMENT,
                "Action": "lambda:InvokeFunctionUrl", "Principal": "*", "FunctionUrlAuthType": "NONE",
                **where,
            }),
            Call("lambda", "add_permission", {
                "FunctionName": name, "StatementId": PUBLIC_INVOKE_STATEMENT,
                "Action": "lambda:InvokeFunction", "Principal": "*", "InvokedViaFunctionUrl": True, **where,
            }),
        ]
    return calls


def ensure_url(client: Callable[[str], Any], settings: LambdaSpec, qualifier: str | None = None) -> str:
    """Create or update the URL (and a public one's permissions); returns it."""
    lam = client("lambda")
    exists = url_of(client, settings.function_name, qualifier) is not None
    write, *permissions = url_calls(settings, qualifier, exists=exists)
    url = getattr(lam, write.operation)(**write.params)["FunctionUrl"]
    for call in permissions:
        with contextlib.suppress(lam.exceptions.ResourceConflictException):  # an earlier deploy's
            lam.add_permission(**call.params)
    return url


def alias_version(client: Callable[[str], Any], name: str) -> str | None:
    """The version the alias serves, or None when no deploy has made it."""
    lam = client("lambda")
    try:
        return lam.get_alias(FunctionName=name, Name=ALIAS)["FunctionVersion"]
    except lam.exceptions.ResourceNotFoundException:
        return None


def publish(client: Callable[[str], Any], name: str, report: Callable[[str], None]) -> str:
    """Publish the function as it now is and point the alias at that version."""
    lam = client("lambda")
    version = lam.publish_version(FunctionName=name, Description="infinity-cloud deploy")["Version"]
    wait_ready(client, name, report, qualifier=version)
    if alias_version(client, name) is None:
        lam.create_alias(FunctionName=name, Name=ALIAS, FunctionVersion=version)
    else:
        lam.update_alias(FunctionName=name, Name=ALIAS, FunctionVersion=version)
    return version


def provisioned(client: Callable[[str], Any], name: str) -> dict[str, Any] | None:
    """The alias's provisioned concurrency (Status, Requested/Available/Allocated...), or None."""
    lam = client("lambda")
    try:
        return lam.get_provisioned_concurrency_config(FunctionName=name, Qualifier=ALIAS)
    except lam.exceptions.ProvisionedConcurrencyConfigNotFoundException:
        return None


def provisioned_summary(config: dict[str, Any] | None) -> str:
    if not config:
        return "none"
    ready = config.get("AvailableProvisionedConcurrentExecutions", 0)
    return f"{config['Status']}: {ready} of {config['RequestedProvisionedConcurrentExecutions']} ready"


def provision(client: Callable[[str], Any], name: str, count: int, report: Callable[[str], None]) -> None:
    """Keep `count` environments of the alias initialised, waiting until they are; 0 removes
    an earlier deploy's (they are billed while idle)."""
    lam = client("lambda")
    if count == 0:
        if provisioned(client, name) is not None:
            lam.delete_provisioned_concurrency_config(FunctionName=name, Qualifier=ALIAS)
            report("provisioned concurrency removed")
        return
    lam.put_provisioned_concurrency_config(
        FunctionName=name, Qualifier=ALIAS, ProvisionedConcurrentExecutions=count
    )
    started = time.monotonic()
    while True:
        config = provisioned(client, name) or {}
        status = config.get("Status", "IN_PROGRESS")
        report(f"provisioned concurrency {provisioned_summary(config or None)}")
        if status == "READY":
            return
        if status == "FAILED":
            raise AwsError(f"provisioned concurrency for {name}:{ALIAS} failed: "
                           f"{config.get('StatusReason') or 'no reason given'}")
        if time.monotonic() - started > WAIT_LIMIT_S:
            raise AwsError(f"provisioned concurrency for {name}:{ALIAS} is still {status}; ask status later")
        time.sleep(POLL_S)


def invoke(
    client: Callable[[str], Any], name: str, body: dict[str, Any], route: str | None, api_key: str | None
) -> Any:
    """The handler's direct invocation: {"route", "body"} in, {"statusCode", "body"} out; through
    the alias when a deploy made one (its environments are the provisioned ones)."""
    event: dict[str, Any] = {"route": route or "invocations", "body": body}
    if api_key:
        event["headers"] = {"authorization": f"Bearer {api_key}"}
    where = _qualified(ALIAS if alias_version(client, name) else None)
    answer = client("lambda").invoke(FunctionName=name, Payload=json.dumps(event).encode(), **where)
    payload = json.loads(answer["Payload"].read() or b"null")
    if answer.get("FunctionError"):
        raise AwsError(f"function {name!r} failed: {payload}")
    if payload["statusCode"] >= 400:
        message = (payload.get("body") or {}).get("error", {}).get("message", payload.get("body"))
        raise AwsError(f"function {name!r} answered {payload['statusCode']}: {message}")
    return payload["body"]
