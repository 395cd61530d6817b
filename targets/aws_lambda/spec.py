"""The `aws_lambda:` section of the deployment spec: how `infinity-cloud build aws_lambda`
packages the models as a container image for an AWS Lambda function."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Lambda gives CPU in proportion to memory: one vCPU at 1,769 MB, six at 10,240 MB.
MB_PER_VCPU = 1769
MAX_VCPUS = 6


class LambdaSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    function_name: str = Field("infinity-cloud", description="The Lambda function's name.")
    memory_mb: int = Field(
        3008, ge=128, le=10240, description="Memory, MB; Lambda's vCPUs follow it (1 per 1,769 MB, up to 6).",
        json_schema_extra={"flag": "--memory"},
    )
    timeout_s: int = Field(60, ge=1, le=900, description="Longest one invocation may run, s.",
                           json_schema_extra={"flag": "--timeout"})
    architecture: Literal["x86_64", "arm64"] = Field("x86_64", description="x86_64 or arm64 (Graviton).")
    base_image: str = Field(
        "public.ecr.aws/lambda/python:3.12", description="Lambda's Python base image to start FROM."
    )

    # -- deploy ---------------------------------------------------------------------------
    image_uri: str | None = Field(
        None, description="The image built from `build aws-lambda` and pushed to ECR (needed to deploy)."
    )
    role: str | None = Field(None, description="Execution role ARN the function runs as (needed to deploy).")
    region: str | None = Field(None, description="AWS region (default: the AWS profile's).")
    function_url: bool = Field(True, description="Give the function an HTTPS URL.")
    auth: Literal["AWS_IAM", "NONE"] = Field(
        "AWS_IAM", description="The URL's auth: AWS_IAM (signed requests) or NONE (public: set "
        "INFINITY_CLOUD_ENDPOINT_KEYS in the function's environment then).",
    )
    provisioned_concurrency: int = Field(
        0, ge=0, le=10000,
        description="Environments kept initialised (no cold starts, billed while idle): served through the "
        "alias 'live' on a published version, and the URL is the alias's; 0 removes an earlier deploy's.",
    )

    @property
    def vcpus(self) -> int:
        return max(1, min(MAX_VCPUS, round(self.memory_mb / MB_PER_VCPU)))
