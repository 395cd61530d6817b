"""The Lambda API through boto3: create or update the function, wait until it is ready, its
URL (and the permissions a public one needs, removed again when it is no longer public; a
URL an earlier deploy made where this one serves none deleted), what one deploy made taken
back when a later step fails, deletion with its logs, and a direct invocation."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from infinity_cloud.targets.aws import ApiCall, AwsError, delete_log_group, run
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


def function_calls(settings: LambdaSpec, exists: bool) -> list[ApiCall]:
    """Create the function from the image, or point it at the new image and settings."""
    name = settings.function_name
    configuration = {"MemorySize": settings.memory_mb, "Timeout": settings.timeout_s, "Role": settings.role}
    if not exists:
        return [ApiCall("lambda", "create_function", {
            "FunctionName": name, "PackageType": "Image", "Code": {"ImageUri": settings.image_uri},
            "Architectures": [settings.architecture], **configuration,
        })]
    return [
        ApiCall("lambda", "update_function_code", {
            "FunctionName": name, "ImageUri": settings.image_uri, "Architectures": [settings.architecture],
        }),
        ApiCall("lambda", "update_function_configuration", {"FunctionName": name, **configuration}),
    ]


def apply_function(
    client: Callable[[str], Any], settings: LambdaSpec, exists: bool, report: Callable[[str], None],
    rollback: Rollback,
) -> None:
    """Create or update the function (`function_calls`), waiting after each call; one created
    here is deleted if a later step fails."""
    name = settings.function_name
    for call in function_calls(settings, exists=exists):
        run(client, call)
        if call.operation == "create_function":
            undo = ApiCall("lambda", "delete_function", {"FunctionName": name})
            rollback.made(f"deleted function {name!r}", undo)
        wait_ready(client, name, report)


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


def _url_config(client: Callable[[str], Any], name: str, qualifier: str | None) -> dict[str, Any] | None:
    lam = client("lambda")
    try:
        return lam.get_function_url_config(FunctionName=name, **_qualified(qualifier))
    except lam.exceptions.ResourceNotFoundException:
        return None


def url_of(client: Callable[[str], Any], name: str, qualifier: str | None = None) -> str | None:
    config = _url_config(client, name, qualifier)
    return config["FunctionUrl"] if config else None


def url_calls(settings: LambdaSpec, qualifier: str | None = None, exists: bool = False) -> list[ApiCall]:
    """The function's (or its alias's) URL with the spec's auth. A public (NONE) one also needs
    a resource policy letting anyone call it: since October 2025 both lambda:InvokeFunctionUrl
    and lambda:InvokeFunction (the latter only through the URL), else it answers 403."""
    name, where = settings.function_name, _qualified(qualifier)
    write = "update_function_url_config" if exists else "create_function_url_config"
    calls = [ApiCall("lambda", write, {"FunctionName": name, "AuthType": settings.auth, **where})]
    if settings.auth == "NONE":
        calls += [
            ApiCall("lambda", "add_permission", {
                "FunctionName": name, "StatementId": PUBLIC_URL_STATEMENT,
                "Action": "lambda:InvokeFunctionUrl", "Principal": "*", "FunctionUrlAuthType": "NONE",
                **where,
            }),
            ApiCall("lambda", "add_permission", {
                "FunctionName": name, "StatementId": PUBLIC_INVOKE_STATEMENT,
                "Action": "lambda:InvokeFunction", "Principal": "*", "InvokedViaFunctionUrl": True, **where,
            }),
        ]
    return calls


def delete_url_call(name: str, qualifier: str | None = None) -> ApiCall:
    return ApiCall("lambda", "delete_function_url_config", {"FunctionName": name, **_qualified(qualifier)})


def revoke_calls(name: str, statements: Iterable[str], qualifier: str | None = None) -> list[ApiCall]:
    where = _qualified(qualifier)
    return [ApiCall("lambda", "remove_permission", {"FunctionName": name, "StatementId": sid, **where})
            for sid in statements]


def public_grants(client: Callable[[str], Any], name: str, qualifier: str | None = None) -> list[str]:
    """Which of the public URL's two statements the function's (or alias's) policy holds."""
    lam = client("lambda")
    try:
        policy = json.loads(lam.get_policy(FunctionName=name, **_qualified(qualifier))["Policy"])
    except lam.exceptions.ResourceNotFoundException:  # no policy at all
        return []
    held = {statement.get("Sid") for statement in policy.get("Statement", [])}
    return [sid for sid in (PUBLIC_URL_STATEMENT, PUBLIC_INVOKE_STATEMENT) if sid in held]


class Rollback:
    """What one deploy made, each with the call that takes it back. Used as a context: when a
    later step fails, they are taken back newest first and the error says so, so no half-made
    deployment (a function without its URL, a public URL that answers 403) is left."""

    def __init__(self, client: Callable[[str], Any]) -> None:
        self._client = client
        self._made: list[tuple[str, ApiCall]] = []

    def made(self, what: str, undo: ApiCall) -> None:
        self._made.append((what, undo))

    def __enter__(self) -> Rollback:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if not isinstance(exc, Exception) or not self._made:  # done, or interrupted: nothing taken back
            return
        note = f"rolled back what this deploy made: {', '.join(self._undo())}"
        if isinstance(exc, AwsError):
            raise AwsError(f"{exc.message}; {note}") from None
        print(note, file=sys.stderr)  # beside an unexpected error's own traceback

    def _undo(self) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        done = []
        for what, call in reversed(self._made):
            try:
                run(self._client, call)
                done.append(what)
            except (BotoCoreError, ClientError) as exc:  # the others are still taken back
                done.append(f"NOT {what} ({type(exc).__name__}: {exc}): remove it by hand")
        self._made.clear()
        return done


def ensure_url(
    client: Callable[[str], Any], settings: LambdaSpec, rollback: Rollback, qualifier: str | None = None
) -> tuple[str, list[str]]:
    """Create or update the URL with the spec's auth; a public one gets the two statements it
    lacks, any other loses those an earlier public deploy granted. Returns the URL and the
    statements removed."""
    name = settings.function_name
    before = _url_config(client, name, qualifier)
    write, *permissions = url_calls(settings, qualifier, exists=before is not None)
    url = run(client, write)["FunctionUrl"]
    if before is None:
        rollback.made("deleted the function URL", delete_url_call(name, qualifier))
    elif before["AuthType"] != settings.auth:
        rollback.made(f"set the URL's auth back to {before['AuthType']}", ApiCall(
            "lambda", "update_function_url_config", {**write.params, "AuthType": before["AuthType"]}))
    granted = public_grants(client, name, qualifier)
    if settings.auth != "NONE":
        for call in revoke_calls(name, granted, qualifier):
            run(client, call)
        return url, granted
    for call in permissions:
        sid = call.params["StatementId"]
        if sid not in granted:  # an earlier deploy's stays
            run(client, call)
            rollback.made(f"removed permission {sid!r}", *revoke_calls(name, [sid], qualifier))
    return url, []


def unwanted_url_places(settings: LambdaSpec, aliased: bool) -> list[str | None]:
    """Where an earlier deploy may have left a URL that this one does not serve: the function
    itself (None) and, once deploys serve through it, the alias; all of them without a URL
    (--no-function-url), else all but the one this deploy's URL is on."""
    serving = ALIAS if aliased else None
    places: list[str | None] = [None, ALIAS] if aliased else [None]
    return [place for place in places if not (settings.function_url and place == serving)]


def remove_url(client: Callable[[str], Any], name: str, qualifier: str | None = None) -> list[str]:
    """Delete the URL on the function (or its alias) where there is one, then the public
    statements a deploy granted there (only those two: others stay). The URL goes first, so
    a refusal of either leaves no URL that answers 403. Returns what went, for the notes.

    Nothing here is handed to `Rollback`: a deleted URL cannot be brought back (a new one gets
    another address), so the deploy calls this last, after every step a failure takes back."""
    removed = []
    config = _url_config(client, name, qualifier)
    if config is not None:
        run(client, delete_url_call(name, qualifier))
        removed.append(f"its URL {config['FunctionUrl']} (auth {config['AuthType']})")
    granted = public_grants(client, name, qualifier)
    for call in revoke_calls(name, granted, qualifier):
        run(client, call)
    if granted:
        removed.append(f"the public grants ({', '.join(granted)})")
    return removed


def place_of(name: str, qualifier: str | None) -> str:
    return f"alias {name}:{qualifier}" if qualifier else f"function {name!r} itself"


def log_group(name: str) -> str:
    """Where Lambda writes the function's logs (every version's and alias's too)."""
    return f"/aws/lambda/{name}"


def delete(client: Callable[[str], Any], name: str) -> None:
    """The URL where there is one, the function (its versions, aliases and their URLs go with
    it), and its log group, which Lambda keeps forever otherwise. A log group the function was
    pointed at elsewhere may be shared: it stays."""
    lam = client("lambda")
    if url_of(client, name):
        lam.delete_function_url_config(FunctionName=name)
    lam.delete_function(FunctionName=name)
    delete_log_group(client, log_group(name))


def alias_version(client: Callable[[str], Any], name: str) -> str | None:
    """The version the alias serves, or None when no deploy has made it."""
    lam = client("lambda")
    try:
        return lam.get_alias(FunctionName=name, Name=ALIAS)["FunctionVersion"]
    except lam.exceptions.ResourceNotFoundException:
        return None


def publish(
    client: Callable[[str], Any], name: str, report: Callable[[str], None], rollback: Rollback
) -> str:
    """Publish the function as it now is and point the alias at that version."""
    lam = client("lambda")
    version = lam.publish_version(FunctionName=name, Description="infinity-cloud deploy")["Version"]
    wait_ready(client, name, report, qualifier=version)
    if alias_version(client, name) is None:
        lam.create_alias(FunctionName=name, Name=ALIAS, FunctionVersion=version)
        undo = ApiCall("lambda", "delete_alias", {"FunctionName": name, "Name": ALIAS})
        rollback.made(f"deleted alias {ALIAS!r}", undo)
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
