"""Deploying the Lambda function with boto3, offline: moto for create/update/URL/permission/
delete (read back), botocore's Stubber for what moto cannot run (an invocation needs
Docker there)."""

from __future__ import annotations

import io
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber
from botocore.validate import validate_parameters
from moto import mock_aws
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.targets.aws_lambda import lambda_api

runner = CliRunner()
REGION = "us-east-1"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/minilm-lambda:1"


@pytest.fixture(autouse=True)
def aws_env(fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lambda_api, "POLL_S", 0.0)  # no waiting between polls


def role() -> str:
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                      "Principal": {"Service": "lambda.amazonaws.com"}}]}
    iam = boto3.client("iam", region_name=REGION)
    created = iam.create_role(RoleName="lambda-exec", AssumeRolePolicyDocument=json.dumps(policy))
    return created["Role"]["Arn"]


def deploy(tmp_path: Path, model: Path, arn: str, *args: str, image: str = IMAGE) -> Any:
    command = ["deploy", "aws-lambda", "--out", str(tmp_path / "build"), "--model-id", str(model)]
    return runner.invoke(cli, [*command, "--image-uri", image, "--role", arn, "--region", REGION, *args])


@mock_aws
def test_deploy_creates_the_function_and_its_url_then_updates_it(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    make_call = BaseClient._make_api_call

    def record(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        sent.append((operation, params))
        return make_call(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", record)
    arn = role()
    result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--memory", "3538",
                    "--timeout", "30", "--architecture", "arm64")
    assert result.exit_code == 0, result.output
    lam = boto3.client("lambda", region_name=REGION)
    function = lam.get_function(FunctionName="emb")
    config = function["Configuration"]
    assert (config["PackageType"], config["MemorySize"], config["Timeout"], config["Architectures"]) == (
        "Image", 3538, 30, ["arm64"])
    assert config["Role"] == arn and function["Code"]["ImageUri"] == IMAGE
    url = lam.get_function_url_config(FunctionName="emb")
    assert url["AuthType"] == "AWS_IAM" and url["FunctionUrl"] in result.output
    assert "public" not in result.output
    # IAM auth: the printed calls are signed (an unsigned curl or OpenAI client gets a 403).
    assert f"awscurl --service lambda --region {REGION} -X POST {url['FunctionUrl'].rstrip('/')}/embeddings" \
        in result.output
    assert "\ncurl " not in result.output and "OpenAI(" not in result.output
    snippet = result.output.split("python - <<'PY'\n", 1)[1].split("\nPY", 1)[0]
    compile(snippet, "signed-call", "exec")  # what a user pastes is Python
    assert 'SigV4Auth(boto3.Session().get_credentials(), "lambda",' in snippet

    # Again, with a new image and memory and a public URL: updated, and the permission granted.
    image = IMAGE.replace(":1", ":2")
    result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--memory", "1769",
                    "--auth", "NONE", image=image)
    assert result.exit_code == 0, result.output
    function = lam.get_function(FunctionName="emb")
    assert function["Code"]["ImageUri"] == image and function["Configuration"]["MemorySize"] == 1769
    assert lam.get_function_url_config(FunctionName="emb")["AuthType"] == "NONE"
    # Both permissions a public URL needs since October 2025, the second only through the URL
    # (moto keeps the statements, not their conditions: those are read from the calls sent).
    statements = json.loads(lam.get_policy(FunctionName="emb")["Policy"])["Statement"]
    assert [(s["Action"], s["Principal"]) for s in statements] == [
        ("lambda:InvokeFunctionUrl", "*"), ("lambda:InvokeFunction", "*")]
    url_only, invoke = [params for operation, params in sent if operation == "AddPermission"]
    assert url_only["FunctionUrlAuthType"] == "NONE" and invoke["InvokedViaFunctionUrl"] is True
    assert "the function URL is public" in result.output

    status = runner.invoke(cli, ["status", "aws-lambda", "--function-name", "emb", "--region", REGION])
    assert status.exit_code == 0 and "state: Active" in status.output and "memory_mb: 1769" in status.output
    named = ["--function-name", "emb", "--region", REGION]
    deleted = runner.invoke(cli, ["delete", "aws-lambda", *named, "--yes"])
    assert deleted.exit_code == 0, deleted.output
    assert lam.list_functions()["Functions"] == []
    again = runner.invoke(cli, ["status", "aws-lambda", "--function-name", "emb", "--region", REGION])
    assert again.exit_code == 2 and "no Lambda function named 'emb'" in again.output


def test_dry_run_prints_the_calls(tmp_path: Path, tiny_embedder: Path, monkeypatch) -> None:
    from infinity_cloud.targets.aws_lambda import target

    monkeypatch.setattr(target, "clients", lambda region: pytest.fail("AWS was called"))
    monkeypatch.setattr(target.LambdaTarget, "build", lambda *a: pytest.fail("the models were exported"))
    arn = "arn:aws:iam::123456789012:role/lambda-exec"
    result = deploy(tmp_path, tiny_embedder, arn, "--dry-run", "--auth", "NONE")
    assert result.exit_code == 0, result.output
    assert "lambda.create_function(" in result.output and IMAGE in result.output and arn in result.output
    # Complete: the URL and both permissions a public one needs.
    assert "lambda.create_function_url_config(" in result.output
    assert result.output.count("lambda.add_permission(") == 2
    assert '"InvokedViaFunctionUrl": true' in result.output
    assert "delete_function_url_config" not in result.output  # a URL where it was: nothing to remove
    # Served through the alias: the function's own URL, where an earlier deploy made one, goes last.
    moved = deploy(tmp_path, tiny_embedder, arn, "--dry-run", "--provisioned-concurrency", "2")
    assert moved.exit_code == 0, moved.output
    last = moved.output.split("(last, where an earlier deploy left a URL", 1)[1]
    assert 'lambda.delete_function_url_config({\n "FunctionName": "infinity-cloud"\n})' in last
    assert last.count("lambda.remove_permission(") == 2 and "Qualifier" not in last
    refused = deploy(tmp_path, tiny_embedder, arn, "--dry-run", "--backend", "torch")
    assert refused.exit_code == 2 and "serves without torch" in refused.output  # still checked


def test_deploy_needs_an_image_and_a_role(tmp_path: Path) -> None:
    result = runner.invoke(cli, ["deploy", "aws-lambda", "--out", str(tmp_path / "o"), "--dry-run"])
    assert result.exit_code == 2 and "needs --image-uri" in result.output


def payload(body: dict[str, Any]) -> StreamingBody:
    data = json.dumps(body).encode()
    return StreamingBody(io.BytesIO(data), len(data))


def test_invoke_sends_a_direct_event_and_reads_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    lam = boto3.client("lambda", region_name=REGION)
    monkeypatch.setattr("infinity_cloud.targets.aws_lambda.target.clients", lambda _: {"lambda": lam}.get)
    answer = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]}
    with Stubber(lam) as stub:
        event = {"route": "embeddings", "body": {"input": ["hello"], "model": "emb"}}
        ok = {"StatusCode": 200, "Payload": payload({"statusCode": 200, "body": answer})}
        expected = {"FunctionName": "infinity-cloud", "Payload": json.dumps(event).encode()}
        stub.add_client_error("get_alias", "ResourceNotFoundException", http_status_code=404)
        stub.add_response("invoke", ok, expected)
        # With an alias (a provisioned-concurrency deploy made it): invoked through it.
        alias = {"Name": "live", "FunctionVersion": "3"}
        stub.add_response("get_alias", alias, {"FunctionName": "infinity-cloud", "Name": "live"})
        stub.add_response("invoke", {"StatusCode": 200, "Payload": payload(
            {"statusCode": 404, "body": {"error": {"message": "model 'nope' is not served"}}})},
            {"FunctionName": "infinity-cloud", "Payload": ANY, "Qualifier": "live"})
        result = runner.invoke(cli, ["invoke", "aws-lambda", "--region", REGION, "--route", "embeddings",
                                     "--model", "emb", "--input", "hello"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output) == answer
        result = runner.invoke(cli, ["invoke", "aws-lambda", "--region", REGION, "--model", "nope"])
        assert result.exit_code == 2 and "answered 404: model 'nope' is not served" in result.output
        stub.assert_no_pending_responses()


class LambdaWithProvisioning:
    """moto's Lambda, except the provisioned-concurrency calls, which moto does not have: those
    go to a client whose answers are stubbed in Lambda's own response shapes."""

    STUBBED = {"put_provisioned_concurrency_config", "get_provisioned_concurrency_config",
               "delete_provisioned_concurrency_config"}

    def __init__(self, moto: Any, stubbed: Any) -> None:
        self.moto, self.stubbed = moto, stubbed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stubbed if name in self.STUBBED else self.moto, name)


class PerQualifier:
    """moto's Lambda, except function URLs and resource policies. moto keeps one URL per
    function whatever the Qualifier, its published versions share the function's policy, and
    it has no list_function_url_configs; Lambda keeps a URL and a policy per qualifier (the
    function itself, or an alias of it: the only qualifier a deploy passes). Here they are kept
    so: each request checked against botocore's model of the call as a real one is, answered
    in Lambda's documented response shapes, and refused with Lambda's errors (no such function
    or alias, no URL or policy there, a URL or statement id already there)."""

    CALLS = frozenset({"create_function_url_config", "get_function_url_config", "update_function_url_config",
                       "delete_function_url_config", "add_permission", "remove_permission", "get_policy"})

    def __init__(self, moto: Any) -> None:
        self.moto = moto
        self.urls: dict[tuple[str, str | None], dict[str, Any]] = {}
        self.statements: dict[tuple[str, str | None], dict[str, dict[str, Any]]] = {}

    def __getattr__(self, name: str) -> Any:
        if name not in self.CALLS:
            return getattr(self.moto, name)

        def call(**params: Any) -> Any:
            meta = self.moto.meta
            operation = meta.method_to_api_mapping[name]
            validate_parameters(params, meta.service_model.operation_model(operation).input_shape)
            function, qualifier = params["FunctionName"], params.get("Qualifier")
            arn = self.moto.get_function_configuration(FunctionName=function)["FunctionArn"]
            if qualifier:
                arn = self.moto.get_alias(FunctionName=function, Name=qualifier)["AliasArn"]
            return getattr(self, f"_{name}")(operation, (function, qualifier), arn, params)

        return call

    def _refuse(self, operation: str, code: str, message: str, status: int) -> None:
        error = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
        raise getattr(self.moto.exceptions, code)(error, operation)

    def _not_found(self, operation: str) -> None:
        message = "The resource you requested does not exist."
        self._refuse(operation, "ResourceNotFoundException", message, 404)

    def _url(self, operation: str, where: tuple[str, str | None]) -> dict[str, Any]:
        if where not in self.urls:
            self._not_found(operation)
        return self.urls[where]

    def _create_function_url_config(self, operation: str, where: Any, arn: str, params: dict) -> dict:
        if where in self.urls:
            self._refuse(operation, "ResourceConflictException",
                         f"Failed to create function url config for [functionArn = {arn}]. Error message: "
                         "FunctionUrlConfig exists for this Lambda function", 409)
        now = datetime.now(timezone.utc).isoformat()
        self.urls[where] = {"FunctionUrl": f"https://{uuid.uuid4().hex}.lambda-url.{REGION}.on.aws/",
                            "FunctionArn": arn, "AuthType": params["AuthType"], "CreationTime": now,
                            "LastModifiedTime": now, "InvokeMode": params.get("InvokeMode", "BUFFERED")}
        return {k: v for k, v in self.urls[where].items() if k != "LastModifiedTime"}

    def _get_function_url_config(self, operation: str, where: Any, arn: str, params: dict) -> dict:
        return dict(self._url(operation, where))

    def _update_function_url_config(self, operation: str, where: Any, arn: str, params: dict) -> dict:
        config = self._url(operation, where)
        config.update(AuthType=params["AuthType"], LastModifiedTime=datetime.now(timezone.utc).isoformat())
        return dict(config)

    def _delete_function_url_config(self, operation: str, where: Any, arn: str, params: dict) -> dict:
        self._url(operation, where)
        del self.urls[where]
        return {}

    def _add_permission(self, operation: str, where: Any, arn: str, params: dict) -> dict:
        held, sid = self.statements.setdefault(where, {}), params["StatementId"]
        if sid in held:
            self._refuse(operation, "ResourceConflictException", f"The statement id ({sid}) provided already "
                         "exists. Please provide a new statement id, or remove the existing statement.", 409)
        statement = {"Sid": sid, "Effect": "Allow", "Principal": params["Principal"],
                     "Action": params["Action"], "Resource": arn}
        if "FunctionUrlAuthType" in params:
            auth = params["FunctionUrlAuthType"]
            statement["Condition"] = {"StringEquals": {"lambda:FunctionUrlAuthType": auth}}
        if "InvokedViaFunctionUrl" in params:
            via = str(params["InvokedViaFunctionUrl"]).lower()
            statement["Condition"] = {"Bool": {"lambda:InvokedViaFunctionUrl": via}}
        held[sid] = statement
        return {"Statement": json.dumps(statement)}

    def _remove_permission(self, operation: str, where: Any, arn: str, params: dict) -> dict:
        held, sid = self.statements.get(where, {}), params["StatementId"]
        if sid not in held:
            message = f"Statement {sid} is not found in resource policy."
            self._refuse(operation, "ResourceNotFoundException", message, 404)
        del held[sid]
        return {}

    def _get_policy(self, operation: str, where: Any, arn: str, params: dict) -> dict:
        held = self.statements.get(where)
        if not held:
            self._not_found(operation)
        policy = {"Version": "2012-10-17", "Id": "default", "Statement": list(held.values())}
        return {"Policy": json.dumps(policy), "RevisionId": str(uuid.uuid4())}


def provisioning(status: str, ready: int, requested: int = 2) -> dict[str, Any]:
    return {"Status": status, "RequestedProvisionedConcurrentExecutions": requested,
            "AvailableProvisionedConcurrentExecutions": ready,
            "AllocatedProvisionedConcurrentExecutions": ready}


@mock_aws
def test_provisioned_concurrency_serves_through_a_published_alias(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arn = role()
    moto_lambda, stubbed = (boto3.client("lambda", region_name=REGION) for _ in range(2))
    per_qualifier = PerQualifier(moto_lambda)
    lam = LambdaWithProvisioning(per_qualifier, stubbed)
    monkeypatch.setattr("infinity_cloud.targets.aws_lambda.target.clients",
                        lambda _: lambda service: lam if service == "lambda" else boto3.client(service))
    where = {"FunctionName": "emb", "Qualifier": "live"}
    with Stubber(stubbed) as stub:
        stub.add_response("put_provisioned_concurrency_config",
                          {"RequestedProvisionedConcurrentExecutions": 2, "Status": "IN_PROGRESS"},
                          {**where, "ProvisionedConcurrentExecutions": 2})
        stub.add_response("get_provisioned_concurrency_config", provisioning("IN_PROGRESS", 1), where)
        stub.add_response("get_provisioned_concurrency_config", provisioning("READY", 2), where)
        result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb",
                        "--provisioned-concurrency", "2")
        assert result.exit_code == 0, result.output
        assert "served through alias emb:live with 2 provisioned environment(s)" in result.output
        assert moto_lambda.get_alias(FunctionName="emb", Name="live")["FunctionVersion"] == "1"
        versions = moto_lambda.list_versions_by_function(FunctionName="emb")["Versions"]
        assert [v["Version"] for v in versions] == ["$LATEST", "1"]
        assert list(per_qualifier.urls) == [("emb", "live")]  # the alias's URL, and only that

        stub.add_response("get_provisioned_concurrency_config", provisioning("READY", 2), where)
        status = runner.invoke(cli, ["status", "aws-lambda", "--function-name", "emb", "--region", REGION])
        assert status.exit_code == 0, status.output
        assert "alias: live -> version 1" in status.output and "READY: 2 of 2 ready" in status.output

        # Deployed again without it: a new version behind the alias, and the idle (billed)
        # environments removed.
        stub.add_response("get_provisioned_concurrency_config", provisioning("READY", 2), where)
        stub.add_response("delete_provisioned_concurrency_config", {}, where)
        result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb",
                        image=IMAGE.replace(":1", ":2"))
        assert result.exit_code == 0, result.output
        assert moto_lambda.get_alias(FunctionName="emb", Name="live")["FunctionVersion"] == "2"
        stub.assert_no_pending_responses()


@mock_aws
def test_a_provisioned_redeploy_moves_the_public_url_to_the_alias_and_deletes_the_old_one(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Public on the function itself, then with provisioned concurrency: the URL is the
    alias's, and the function's own URL and its two public statements are gone (else the
    function stays public at its old address), said in the notes. Back to 0, deploys stay on
    the alias, and so does its URL. Then without a URL: the alias's goes too."""
    arn = role()
    moto_lambda, stubbed = (boto3.client("lambda", region_name=REGION) for _ in range(2))
    per_qualifier = PerQualifier(moto_lambda)
    lam = LambdaWithProvisioning(per_qualifier, stubbed)
    monkeypatch.setattr("infinity_cloud.targets.aws_lambda.target.clients",
                        lambda _: lambda service: lam if service == "lambda" else boto3.client(service))
    public = ["--function-name", "emb", "--auth", "NONE"]
    assert deploy(tmp_path, tiny_embedder, arn, *public).exit_code == 0
    old = lam.get_function_url_config(FunctionName="emb")["FunctionUrl"]
    assert len(json.loads(lam.get_policy(FunctionName="emb")["Policy"])["Statement"]) == 2
    where = {"FunctionName": "emb", "Qualifier": "live"}
    with Stubber(stubbed) as stub:
        stub.add_response("put_provisioned_concurrency_config",
                          {"RequestedProvisionedConcurrentExecutions": 2, "Status": "IN_PROGRESS"},
                          {**where, "ProvisionedConcurrentExecutions": 2})
        stub.add_response("get_provisioned_concurrency_config", provisioning("READY", 2), where)
        result = deploy(tmp_path, tiny_embedder, arn, *public, "--provisioned-concurrency", "2")
        assert result.exit_code == 0, result.output
        with pytest.raises(lam.exceptions.ResourceNotFoundException):
            lam.get_function_url_config(FunctionName="emb")
        with pytest.raises(lam.exceptions.ResourceNotFoundException):  # no statement left on it at all
            lam.get_policy(FunctionName="emb")
        new = lam.get_function_url_config(**where)
        assert new["AuthType"] == "NONE" and new["FunctionUrl"] != old and new["FunctionUrl"] in result.output
        statements = json.loads(lam.get_policy(**where)["Policy"])["Statement"]
        assert sorted((s["Sid"], s["Resource"].rsplit(":", 1)[1]) for s in statements) == [
            (lambda_api.PUBLIC_URL_STATEMENT, "live"), (lambda_api.PUBLIC_INVOKE_STATEMENT, "live")]
        output = " ".join(result.output.split())
        assert (f"removed what an earlier deploy left on function 'emb' itself, where this deploy serves no "
                f"URL: its URL {old} (auth NONE), the public grants ({lambda_api.PUBLIC_URL_STATEMENT}, "
                f"{lambda_api.PUBLIC_INVOKE_STATEMENT})") in output

        # Provisioned concurrency back to 0: still served through the alias, whose URL stays.
        stub.add_response("get_provisioned_concurrency_config", provisioning("READY", 2), where)
        stub.add_response("delete_provisioned_concurrency_config", {}, where)
        again = deploy(tmp_path, tiny_embedder, arn, *public)
        assert again.exit_code == 0, again.output
        assert lam.get_function_url_config(**where)["FunctionUrl"] == new["FunctionUrl"]
        assert list(per_qualifier.urls) == [("emb", "live")] and "removed what" not in again.output

        # No URL wanted: the alias's and its grants go, and nothing else is asked of the function.
        stub.add_client_error("get_provisioned_concurrency_config",
                              "ProvisionedConcurrencyConfigNotFoundException", http_status_code=404,
                              expected_params=where)
        off = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--no-function-url")
        assert off.exit_code == 0, off.output
        assert per_qualifier.urls == {}
        with pytest.raises(lam.exceptions.ResourceNotFoundException):
            lam.get_policy(**where)
        assert f"left on alias emb:live, where this deploy serves no URL: its URL {new['FunctionUrl']}" in \
            " ".join(off.output.split())
        stub.assert_no_pending_responses()


def without_invoked_via_function_url(folder: Path) -> Path:
    """A copy of this botocore's Lambda model without InvokedViaFunctionUrl, as botocore had it
    before 1.40.50, where botocore's AWS_DATA_PATH finds it first."""
    import botocore.loaders

    model = botocore.loaders.Loader().load_service_model("lambda", "service-2")
    del model["shapes"]["AddPermissionRequest"]["members"]["InvokedViaFunctionUrl"]
    target = folder / "lambda" / model["metadata"]["apiVersion"] / "service-2.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(model))
    return folder


@mock_aws
def test_a_botocore_without_a_needed_parameter_is_refused_before_anything_is_made(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arn = role()
    monkeypatch.setenv("AWS_DATA_PATH", str(without_invoked_via_function_url(tmp_path / "models")))
    result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "NONE")
    assert result.exit_code == 2, result.output
    assert "lambda.add_permission" in result.output and "InvokedViaFunctionUrl" in result.output
    assert install_command("aws", upgrade=True) in result.output
    assert boto3.client("lambda", region_name=REGION).list_functions()["Functions"] == []


class LambdaWith:
    """moto's Lambda, except the calls named, which go to a client whose answers are stubbed in
    Lambda's own request and response shapes (what moto lacks, or a refusal moto cannot make)."""

    def __init__(self, stubbed_calls: set[str], moto: Any, stubbed: Any) -> None:
        self.stubbed_calls, self.moto, self.stubbed = stubbed_calls, moto, stubbed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stubbed if name in self.stubbed_calls else self.moto, name)


def grant(sid: str, **condition: Any) -> dict[str, Any]:
    """add_permission's request for one of a public URL's two statements."""
    action = "lambda:InvokeFunctionUrl" if sid == lambda_api.PUBLIC_URL_STATEMENT else "lambda:InvokeFunction"
    return {"FunctionName": "emb", "StatementId": sid, "Action": action, "Principal": "*", **condition}


@mock_aws
def test_a_failed_step_takes_back_what_the_deploy_made(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The public URL's second statement refused (the deployer lacks lambda:AddPermission on
    it): the first statement, the URL and the new function are deleted again, newest first,
    and the error says so; for a function that was there, its URL's auth is set back."""
    arn = role()
    moto_lambda, stubbed = (boto3.client("lambda", region_name=REGION) for _ in range(2))
    lam = LambdaWith({"add_permission", "remove_permission", "get_policy"}, moto_lambda, stubbed)
    monkeypatch.setattr("infinity_cloud.targets.aws_lambda.target.clients",
                        lambda _: lambda service: lam if service == "lambda" else boto3.client(service))
    url_grant = grant(lambda_api.PUBLIC_URL_STATEMENT, FunctionUrlAuthType="NONE")
    invoke_grant = grant(lambda_api.PUBLIC_INVOKE_STATEMENT, InvokedViaFunctionUrl=True)
    refusal = ("User: arn:aws:iam::123456789012:user/deployer is not authorized to perform: "
               "lambda:AddPermission")
    with Stubber(stubbed) as stub:
        def refused_once() -> None:
            stub.add_client_error("get_policy", "ResourceNotFoundException", http_status_code=404,
                                  expected_params={"FunctionName": "emb"})
            stub.add_response("add_permission", {"Statement": "{}"}, url_grant)
            stub.add_client_error("add_permission", "AccessDeniedException", refusal, 403,
                                  expected_params=invoke_grant)
            stub.add_response("remove_permission", {}, {"FunctionName": "emb",
                                                        "StatementId": lambda_api.PUBLIC_URL_STATEMENT})

        refused_once()
        result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "NONE")
        assert result.exit_code == 2, result.output
        output = " ".join(result.output.split())
        assert "AccessDeniedException" in output
        assert ("rolled back what this deploy made: removed permission 'infinity-cloud-public-url', "
                "deleted the function URL, deleted function 'emb'") in output
        assert moto_lambda.list_functions()["Functions"] == []
        stub.assert_no_pending_responses()

        stub.add_client_error("get_policy", "ResourceNotFoundException", http_status_code=404,
                              expected_params={"FunctionName": "emb"})
        assert deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb").exit_code == 0
        refused_once()
        result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "NONE")
        assert result.exit_code == 2, result.output
        output = " ".join(result.output.split())
        assert ("rolled back what this deploy made: removed permission 'infinity-cloud-public-url', "
                "set the URL's auth back to AWS_IAM") in output
        assert moto_lambda.get_function_url_config(FunctionName="emb")["AuthType"] == "AWS_IAM"
        stub.assert_no_pending_responses()


@mock_aws
def test_a_redeploy_with_iam_auth_removes_the_public_grants(tmp_path: Path, tiny_embedder: Path) -> None:
    arn = role()
    lam = boto3.client("lambda", region_name=REGION)
    assert deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "NONE").exit_code == 0
    statements = json.loads(lam.get_policy(FunctionName="emb")["Policy"])["Statement"]
    public = {lambda_api.PUBLIC_URL_STATEMENT, lambda_api.PUBLIC_INVOKE_STATEMENT}
    assert {s["Sid"] for s in statements} == public
    # Again with a public URL: the statements there are kept, not granted twice.
    assert deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "NONE").exit_code == 0
    assert len(json.loads(lam.get_policy(FunctionName="emb")["Policy"])["Statement"]) == 2
    lam.add_permission(FunctionName="emb", StatementId="someone-elses", Action="lambda:InvokeFunction",
                       Principal="s3.amazonaws.com")
    result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "AWS_IAM")
    assert result.exit_code == 0, result.output
    assert lam.get_function_url_config(FunctionName="emb")["AuthType"] == "AWS_IAM"
    statements = json.loads(lam.get_policy(FunctionName="emb")["Policy"])["Statement"]
    assert [s["Sid"] for s in statements] == ["someone-elses"]  # only ours went
    assert "removed the public grants an earlier deploy gave the URL" in " ".join(result.output.split())
    assert "the function URL is public" not in result.output


@mock_aws
def test_a_redeploy_without_a_url_deletes_it_and_its_public_grants(
    tmp_path: Path, tiny_embedder: Path
) -> None:
    arn = role()
    lam = boto3.client("lambda", region_name=REGION)
    assert deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "NONE").exit_code == 0
    old = lam.get_function_url_config(FunctionName="emb")["FunctionUrl"]
    lam.add_permission(FunctionName="emb", StatementId="someone-elses", Action="lambda:InvokeFunction",
                       Principal="s3.amazonaws.com")
    result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--no-function-url")
    assert result.exit_code == 0, result.output
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_function_url_config(FunctionName="emb")
    statements = json.loads(lam.get_policy(FunctionName="emb")["Policy"])["Statement"]
    assert [s["Sid"] for s in statements] == ["someone-elses"]  # only ours went
    output = " ".join(result.output.split())
    assert (f"removed what an earlier deploy left on function 'emb' itself, where this deploy serves no URL: "
            f"its URL {old} (auth NONE), the public grants ({lambda_api.PUBLIC_URL_STATEMENT}, "
            f"{lambda_api.PUBLIC_INVOKE_STATEMENT})") in output
    assert "the function URL is public" not in output and "infinity-cloud invoke aws-lambda" in output
    assert "printed above" not in output and "it has no URL" in output  # no URL said to be above
    # Again: nothing there to remove, nothing said.
    again = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--no-function-url")
    assert again.exit_code == 0, again.output
    assert "removed what" not in again.output


@mock_aws
def test_a_refused_url_removal_takes_nothing_back_and_says_the_old_url_stays(
    tmp_path: Path, tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old URL's deletion is the deploy's last step, past what the rollback covers: when it
    is refused, the deploy (done) is not taken back, the URL stays as it was (still working,
    its grants kept) and the error says so."""
    arn = role()
    moto_lambda, stubbed = (boto3.client("lambda", region_name=REGION) for _ in range(2))
    lam = LambdaWith({"delete_function_url_config"}, moto_lambda, stubbed)
    monkeypatch.setattr("infinity_cloud.targets.aws_lambda.target.clients",
                        lambda _: lambda service: lam if service == "lambda" else boto3.client(service))
    assert deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--auth", "NONE").exit_code == 0
    refusal = ("User: arn:aws:iam::123456789012:user/deployer is not authorized to perform: "
               "lambda:DeleteFunctionUrlConfig")
    with Stubber(stubbed) as stub:
        stub.add_client_error("delete_function_url_config", "AccessDeniedException", refusal, 403,
                              expected_params={"FunctionName": "emb"})
        result = deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb", "--no-function-url",
                        image=IMAGE.replace(":1", ":2"))
        stub.assert_no_pending_responses()
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "AccessDeniedException" in output and "the deploy itself is done" in output
    assert "rolled back" not in output
    assert moto_lambda.get_function(FunctionName="emb")["Code"]["ImageUri"] == IMAGE.replace(":1", ":2")
    assert moto_lambda.get_function_url_config(FunctionName="emb")["AuthType"] == "NONE"
    statements = json.loads(moto_lambda.get_policy(FunctionName="emb")["Policy"])["Statement"]
    public = {lambda_api.PUBLIC_URL_STATEMENT, lambda_api.PUBLIC_INVOKE_STATEMENT}
    assert {s["Sid"] for s in statements} == public


@mock_aws
def test_delete_takes_the_function_and_its_log_group(tmp_path: Path, tiny_embedder: Path) -> None:
    arn = role()
    assert deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb").exit_code == 0
    logs = boto3.client("logs", region_name=REGION)
    for group in ("/aws/lambda/emb", "/aws/lambda/emb-other"):  # as Lambda makes at a first invocation
        logs.create_log_group(logGroupName=group)
    named = ["--function-name", "emb", "--region", REGION, "--yes"]
    assert runner.invoke(cli, ["delete", "aws-lambda", *named]).exit_code == 0
    assert boto3.client("lambda", region_name=REGION).list_functions()["Functions"] == []
    left = [group["logGroupName"] for group in logs.describe_log_groups()["logGroups"]]
    assert left == ["/aws/lambda/emb-other"]
    # A function never invoked has none: deleted all the same.
    assert deploy(tmp_path, tiny_embedder, arn, "--function-name", "emb").exit_code == 0
    assert runner.invoke(cli, ["delete", "aws-lambda", *named]).exit_code == 0
