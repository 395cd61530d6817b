"""The IAM policies a first SageMaker deployment needs, as documents `infinity-cloud policy
sagemaker` prints: the execution role's trust and permissions, and the deploying user's."""

from __future__ import annotations

from typing import Any

from infinity_cloud.targets.aws import image_push_statements
from infinity_cloud.targets.sagemaker.sagemaker_api import log_group
from infinity_cloud.targets.sagemaker.spec import SageMakerSpec

VERSION = "2012-10-17"
AUTOSCALING_SERVICE = "sagemaker.application-autoscaling.amazonaws.com"


def document(*statements: dict[str, Any]) -> dict[str, Any]:
    """An IAM policy document of `statements`."""
    return {"Version": VERSION, "Statement": list(statements)}


def _bucket_of(uri: str | None) -> tuple[str, str] | None:
    if not uri:
        return None
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def policies(settings: SageMakerSpec) -> dict[str, dict[str, Any]]:
    """trust: who may assume the execution role (SageMaker); execution: what the endpoint's
    containers need (pull the image, write logs and metrics, read the model data); deployer:
    every call `deploy`, `status`, `invoke`, `smoke` and `delete` make, and the push of the
    image to ECR a first deployment needs."""
    data = _bucket_of(settings.model_data)
    execution = [
        {"Sid": "PullTheImage", "Effect": "Allow", "Resource": "*", "Action": [
            "ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
            "ecr:BatchCheckLayerAvailability"]},
        {"Sid": "LogsAndMetrics", "Effect": "Allow", "Resource": "*", "Action": [
            "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams",
            "cloudwatch:PutMetricData"]},
    ]
    if data:
        execution.append({"Sid": "ReadTheModelData", "Effect": "Allow", "Action": ["s3:GetObject"],
                          "Resource": f"arn:aws:s3:::{data[0]}/{data[1]}"})
    deployer = [
        {"Sid": "Endpoint", "Effect": "Allow", "Resource": "*", "Action": [
            "sagemaker:CreateModel", "sagemaker:DescribeModel", "sagemaker:DeleteModel",
            "sagemaker:ListModels",
            "sagemaker:CreateEndpointConfig", "sagemaker:DescribeEndpointConfig",
            "sagemaker:DeleteEndpointConfig", "sagemaker:ListEndpointConfigs",
            "sagemaker:CreateEndpoint", "sagemaker:UpdateEndpoint", "sagemaker:DescribeEndpoint",
            "sagemaker:DeleteEndpoint", "sagemaker:InvokeEndpoint",
            # Application Auto Scaling changes the variant's instances as the registering caller
            "sagemaker:UpdateEndpointWeightsAndCapacities"]},
        {"Sid": "Autoscaling", "Effect": "Allow", "Resource": "*", "Action": [
            "application-autoscaling:RegisterScalableTarget",
            "application-autoscaling:DeregisterScalableTarget",
            "application-autoscaling:DescribeScalableTargets", "application-autoscaling:PutScalingPolicy",
            "application-autoscaling:DescribeScalingPolicies", "application-autoscaling:DeleteScalingPolicy",
            # target tracking makes its CloudWatch alarms as the caller
            "cloudwatch:PutMetricAlarm", "cloudwatch:DescribeAlarms", "cloudwatch:DeleteAlarms"]},
        {"Sid": "AutoscalingRoleOnce", "Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": f"arn:aws:iam::*:role/aws-service-role/{AUTOSCALING_SERVICE}/*",
         "Condition": {"StringLike": {"iam:AWSServiceName": AUTOSCALING_SERVICE}}},
        # `delete` takes the endpoint's log group with it (only its own).
        {"Sid": "TheLogs", "Effect": "Allow", "Action": "logs:DeleteLogGroup", "Resource": [
            f"arn:aws:logs:*:*:log-group:{log_group(settings.endpoint_name)}",
            f"arn:aws:logs:*:*:log-group:{log_group(settings.endpoint_name)}:*"]},
        *image_push_statements(settings.image_uri),
        {"Sid": "HandTheRoleToSageMaker", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": settings.role or "arn:aws:iam::ACCOUNT:role/ROLE",
         "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}},
    ]
    if data:
        deployer.append({"Sid": "UploadTheModelData", "Effect": "Allow", "Action": ["s3:PutObject"],
                         "Resource": f"arn:aws:s3:::{data[0]}/{data[1]}"})
    deployer[0]["Action"].sort()
    return {
        "trust": document({"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
                       "Action": "sts:AssumeRole"}),
        "execution": document(*execution),
        "deployer": document(*deployer),
    }
