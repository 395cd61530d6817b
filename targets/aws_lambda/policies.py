"""The IAM policies a first Lambda deployment needs, as documents `infinity-cloud policy
aws-lambda` prints: the execution role's trust and permissions, and the deploying user's."""

from __future__ import annotations

from typing import Any

from infinity_cloud.targets.aws import image_push_statements, repository_arn
from infinity_cloud.targets.aws_lambda.lambda_api import log_group
from infinity_cloud.targets.aws_lambda.spec import LambdaSpec
from infinity_cloud.targets.sagemaker.policies import document


def policies(settings: LambdaSpec) -> dict[str, dict[str, Any]]:
    """trust: who may assume the execution role (Lambda); execution: what the function needs
    (its logs); deployer: every call `deploy` (with its rollback), `status`, `invoke`, `smoke`
    and `delete` make, the image pull Lambda does as the one who creates the function, and
    the push of the image to ECR (your Docker, with a token from `aws ecr get-login-password`)."""
    function = f"arn:aws:lambda:*:*:function:{settings.function_name}"
    repository = repository_arn(settings.image_uri)
    return {
        "trust": document({"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                           "Action": "sts:AssumeRole"}),
        "execution": document({"Sid": "Logs", "Effect": "Allow", "Resource": "*", "Action": [
            "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"]}),
        "deployer": document(
            {"Sid": "Function", "Effect": "Allow", "Resource": [function, f"{function}:*"], "Action": sorted([
                "lambda:CreateFunction", "lambda:GetFunction", "lambda:GetFunctionConfiguration",
                "lambda:UpdateFunctionCode", "lambda:UpdateFunctionConfiguration", "lambda:DeleteFunction",
                "lambda:CreateFunctionUrlConfig", "lambda:UpdateFunctionUrlConfig",
                "lambda:GetFunctionUrlConfig", "lambda:DeleteFunctionUrlConfig",
                "lambda:AddPermission", "lambda:RemovePermission", "lambda:GetPolicy",
                "lambda:InvokeFunction",
                "lambda:PublishVersion", "lambda:CreateAlias", "lambda:UpdateAlias", "lambda:GetAlias",
                "lambda:DeleteAlias", "lambda:PutProvisionedConcurrencyConfig",
                "lambda:GetProvisionedConcurrencyConfig", "lambda:DeleteProvisionedConcurrencyConfig"])},
            # `delete` takes the function's log group with it (only its own: one it was pointed
            # at elsewhere may be shared).
            {"Sid": "TheLogs", "Effect": "Allow", "Action": "logs:DeleteLogGroup", "Resource": [
                f"arn:aws:logs:*:*:log-group:{log_group(settings.function_name)}",
                f"arn:aws:logs:*:*:log-group:{log_group(settings.function_name)}:*"]},
            # Lambda pulls the image as the one who creates or updates the function, and sets
            # the repository's policy to let itself read it later.
            {"Sid": "TheImage", "Effect": "Allow", "Resource": repository, "Action": [
                "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:GetRepositoryPolicy",
                "ecr:SetRepositoryPolicy"]},
            *image_push_statements(settings.image_uri),
            {"Sid": "HandTheRoleToLambda", "Effect": "Allow", "Action": "iam:PassRole",
             "Resource": settings.role or "arn:aws:iam::ACCOUNT:role/ROLE",
             "Condition": {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}},
        ),
    }

