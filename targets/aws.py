"""What every AWS target shares: boto3 imported on demand, clients by service in one
region, one API call as data (printed by --dry-run, run otherwise), and every way an AWS
call fails mapped to one line."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.targets.base import TargetError, one_line

NO_CREDENTIALS = (
    "no AWS credentials: run `aws configure` (or `aws sso login`), or set AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY (and AWS_REGION), then run this again"
)


class AwsError(TargetError):
    """boto3 is missing, has no credentials, AWS refused a call, or a resource failed."""


@dataclass(frozen=True)
class ApiCall:
    """One AWS API call: the client (`sagemaker`, `lambda`, ...), the boto3 method and its
    parameters."""

    service: str
    operation: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.service}.{self.operation}({json.dumps(self.params, indent=1, sort_keys=True)})"


def import_boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise AwsError(f"boto3 is not installed: {install_command('aws')}") from None
    return boto3


@contextmanager
def aws_calls(action: str) -> Iterator[None]:
    """Map every way an AWS call fails to one line naming what was being done."""
    import_boto3()
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    try:
        yield
    except NoCredentialsError:
        raise AwsError(NO_CREDENTIALS) from None
    except NoRegionError:
        raise AwsError("no AWS region: pass --region or set AWS_REGION") from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise AwsError(
            f"AWS refused to {action}: {error.get('Code', 'error')}: {one_line(error.get('Message', exc))}"
        ) from None
    except (BotoCoreError, OSError) as exc:
        raise AwsError(f"could not {action}: {type(exc).__name__}: {one_line(str(exc))}") from exc


def clients(region: str | None) -> Callable[[str], Any]:
    """boto3 clients by service name, one each, in `region` (None: the profile's)."""
    session = import_boto3().session.Session(region_name=region)
    made: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in made:
            made[service] = session.client(service)
        return made[service]

    return client


def require_image_and_role(target: str, image_uri: str | None, role: str | None) -> None:
    """Checked before anything is built or called: a deploy needs the pushed image and a role."""
    if not image_uri or not role:
        raise ConfigError(
            f"deploy {target} needs --image-uri (the image built from `infinity-cloud build {target}` "
            "and pushed to ECR) and --role (the ARN of the execution role it runs as)"
        )


def run(client: Callable[[str], Any], call: ApiCall) -> Any:
    return getattr(client(call.service), call.operation)(**call.params)


def check_known(client: Callable[[str], Any], calls: Iterable[ApiCall]) -> None:
    """Each call's parameters checked against this botocore's model of its API before the
    first call is made: a botocore older than a parameter (AWS adds them) fails here, naming
    the upgrade, not half-way through a deployment."""
    import botocore
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    for call in calls:
        meta = client(call.service).meta
        operation = meta.service_model.operation_model(meta.method_to_api_mapping[call.operation])
        try:
            validate_parameters(call.params, operation.input_shape)
        except ParamValidationError as exc:
            raise AwsError(
                f"botocore {botocore.__version__} cannot make {call.service}.{call.operation} as it is "
                f"needed: {one_line(str(exc))}; {install_command('aws', upgrade=True)}"
            ) from None


def delete_log_group(client: Callable[[str], Any], group: str) -> None:
    """The log group AWS made for what `delete` takes (kept forever otherwise); none made (never
    started or invoked) is fine."""
    logs = client("logs")
    with contextlib.suppress(logs.exceptions.ResourceNotFoundException):
        logs.delete_log_group(logGroupName=group)


def repository_arn(image_uri: str | None) -> str:
    """The ECR repository of ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME[:TAG|@DIGEST], any
    account and region (the ARN's own parts); every repository when no image is named yet."""
    if not image_uri or "/" not in image_uri:
        return "*"
    path = image_uri.partition("/")[2].partition("@")[0]
    return f"arn:aws:ecr:*:*:repository/{re.sub(r':[^/]*$', '', path)}"  # less its tag


def image_push_statements(image_uri: str | None) -> list[dict[str, Any]]:
    """What a first deployment's push of its image needs (your Docker, with a token from
    `aws ecr get-login-password`): the repository made, then its layers and image uploaded."""
    return [
        {"Sid": "PushTheImage", "Effect": "Allow", "Resource": repository_arn(image_uri), "Action": [
            "ecr:CreateRepository", "ecr:BatchCheckLayerAvailability", "ecr:InitiateLayerUpload",
            "ecr:UploadLayerPart", "ecr:CompleteLayerUpload", "ecr:PutImage"]},
        {"Sid": "LogInToEcr", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
    ]
