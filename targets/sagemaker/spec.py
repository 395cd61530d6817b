"""The `sagemaker:` section of the deployment spec: how `infinity-cloud build sagemaker`
packages the models as a bring-your-own container for a SageMaker endpoint."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Instance families with NVIDIA GPUs (https://aws.amazon.com/sagemaker/pricing/): the image
# gets CUDA torch. ml.inf2 is AWS Inferentia2 (Neuron); everything else is CPU.
GPU_FAMILIES = ("g4dn", "g5", "g6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en")
# The instance types with several GPUs (AWS's EC2 accelerated computing instance specs; a
# SageMaker ml.X is EC2's X): every other type of a GPU family has one. The container's server
# makes an engine replica on each GPU it sees (none is pinned), so an instance clears that many
# times one GPU's invocations.
GPUS_PER_INSTANCE = {
    "ml.g4dn.12xlarge": 4,
    "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
    "ml.g6.12xlarge": 4, "ml.g6.24xlarge": 4, "ml.g6.48xlarge": 8,
    "ml.g6e.12xlarge": 4, "ml.g6e.24xlarge": 4, "ml.g6e.48xlarge": 8,
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8,
    "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8, "ml.p5en.48xlarge": 8,
}
# Invocations a minute one GPU (or a CPU instance) is expected to take: the autoscaling
# target's default, times the instance's GPUs.
INVOCATIONS_PER_GPU = 600
# GPU families whose GPUs no CUDA 13 torch runs (CUDA 13 dropped Volta, sm_70): refused by
# name, since torch would see the GPU and fail at its first kernel.
UNRUNNABLE_GPU_FAMILIES = {"p3": "V100 (Volta)", "p3dn": "V100 (Volta)"}
NEURON_FAMILIES = ("inf2", "trn1")
# The machine image GPU instances run (ProductionVariant's InferenceAmiVersion): NVIDIA driver
# 580, CUDA 13.0 (botocore's model of CreateEndpointConfig lists each AMI's driver). Without
# one SageMaker picks its own, whose older driver does not run the image's torch: PyPI's
# torch is the CUDA 13 build, which needs driver 580 or newer. Resolved with the package
# index like every other requirement of the image, so no second index is trusted unchecked.
GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
# SageMaker's own payload limits: 6 MB for a real-time endpoint, 4 MB for a serverless one.
REALTIME_PAYLOAD_BYTES = 6 * 1024 * 1024
SERVERLESS_PAYLOAD_BYTES = 4 * 1024 * 1024
_INSTANCE = re.compile(r"^ml\.([a-z0-9]+)\.[a-z0-9]+$")
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,45}$")
_ROLE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")

Variant = Literal["gpu", "cpu", "serverless", "inferentia2"]
# Graviton (arm64) families SageMaker hosts real-time endpoints on (API_ProductionVariant):
# their images are built for linux/arm64.
GRAVITON_FAMILIES = ("c6g", "c6gd", "c6gn", "c7g", "m6g", "m6gd", "r6g", "r6gd", "r7gd", "r8g", "c8g", "m8g")
# Hugging Face's Neuron inference container, in the AWS account that serves it in most
# regions; pulling it needs `aws ecr get-login-password` for that account. The newest HF
# Neuron image with transformers (the 2.20 one before it shipped transformers 4.43 and
# tokenizers 0.19, below this package's floors); AWS's plain Neuron images run newer Pythons
# but hold no transformers or optimum-neuron.
NEURON_IMAGE = (
    "763104351884.dkr.ecr.{region}.amazonaws.com/huggingface-pytorch-inference-neuronx:"
    "2.8.0-transformers4.55.4-neuronx-py310-sdk2.26.0-ubuntu22.04"
)
# What that image's Python (3.10) already holds, at the versions its Neuron SDK was built
# against (its Dockerfile: huggingface/pytorch/inference/docker/2.8/py3/sdk2.26.0): the image
# keeps them, and the rest of the requirements are resolved around them.
NEURON_IMAGE_SHIPS = {
    "torch": "==2.8.0",
    "transformers": "==4.55.4",
    "tokenizers": ">=0.21,<0.22",
    "huggingface-hub": "==0.35.0",
    "safetensors": ">=0.4.3",  # transformers' floor; the image's own version is not published
    "numpy": ">=1.22.2,<=1.25.2",
    "optimum-neuron": "==0.4.1",
}


class SageMakerSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint_name: str = Field(
        "infinity-cloud", description="The endpoint's name (also its model's and config's)."
    )
    instance_type: str = Field(
        "ml.g5.xlarge",
        description="Instance type: a GPU family (ml.g5, ml.g6, ...) gets CUDA torch, ml.inf2 Neuron, "
        "others (ml.c7i, ml.m7i, ...) CPU OpenVINO.",
    )
    serverless: bool = Field(
        False, description="A serverless endpoint (CPU only, 4 MB payloads, OpenVINO/ONNX without torch)."
    )
    base_image: str = Field("python:3.11-slim", description="Image the Dockerfile starts FROM (CPU and GPU).")
    neuron_image: str = Field(
        NEURON_IMAGE, description="Image an Inferentia2 Dockerfile starts FROM: Hugging Face's Neuron "
        "inference container ({region}: the spec's region, else us-east-1).",
    )
    port: int = Field(8080, ge=1, le=65535, description="Port the container listens on unless SageMaker "
                      "sets SAGEMAKER_BIND_TO_PORT.")
    # -- deploy ---------------------------------------------------------------------------
    image_uri: str | None = Field(
        None, description="The image built from `build sagemaker` and pushed to ECR (needed to deploy)."
    )
    role: str | None = Field(
        None, description="Execution role ARN SageMaker runs the endpoint as (needed to deploy)."
    )
    region: str | None = Field(None, description="AWS region (default: the AWS profile's).")
    instance_count: int = Field(1, ge=1, description="Instances behind a real-time endpoint.")
    memory_mb: int = Field(
        6144, ge=1024, le=6144, multiple_of=1024, description="Serverless: memory per instance, MB."
    )
    max_concurrency: int = Field(20, ge=1, le=200, description="Serverless: concurrent invocations.")
    autoscale: str | None = Field(
        None, description="MIN:MAX instances, scaled on invocations per instance (real-time only)."
    )
    target_invocations: int = Field(
        INVOCATIONS_PER_GPU, ge=1, description="Autoscaling target: invocations per instance per minute "
        "(default 600, times the instance's GPUs: ml.g5.12xlarge has 4, each serving).",
    )
    model_data: str | None = Field(
        None, description="s3:// URI of a model.tar.gz that SageMaker unpacks into /opt/ml/model "
        "(with --pack-models, deploy uploads the one build made there).",
    )
    pack_models: bool = Field(
        False, description="GPU: put the models in model.tar.gz instead of the image, so one image serves "
        "any model; deploy uploads it to --model-data.",
    )
    startup_timeout_s: int = Field(
        1800, ge=60, le=3600, description="Longest a container may take to answer /ping with 200.",
        json_schema_extra={"flag": "--startup-timeout"},
    )

    @model_validator(mode="before")
    @classmethod
    def _sized_for_gpus(cls, data: Any) -> Any:
        """--target-invocations, unless given, is one GPU's times the instance's GPUs."""
        if isinstance(data, dict) and data.get("target_invocations") is None:
            gpus = GPUS_PER_INSTANCE.get(str(data.get("instance_type")), 1)
            if gpus > 1:
                return {**data, "target_invocations": INVOCATIONS_PER_GPU * gpus}
        return data

    @field_validator("endpoint_name")
    @classmethod
    def _endpoint_name(cls, value: str) -> str:
        # Model and config names add a 16-character stamp to it, within SageMaker's 63.
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: an endpoint name is 1-46 letters, digits and '-' (not first)")
        return value

    @field_validator("role")
    @classmethod
    def _role(cls, value: str | None) -> str | None:
        if value is not None and not _ROLE.match(value):
            raise ValueError(f"{value!r} is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)")
        return value

    @field_validator("model_data")
    @classmethod
    def _model_data(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("s3://"):
            raise ValueError(f"{value!r}: model data is an s3:// URI")
        return value

    @field_validator("autoscale")
    @classmethod
    def _autoscale(cls, value: str | None) -> str | None:
        if value is not None:
            low, _, high = value.partition(":")
            if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
                raise ValueError(f"{value!r}: autoscale is MIN:MAX instances, 1 <= MIN <= MAX")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SageMakerSpec:
        if self.serverless and self.autoscale:
            raise ValueError("a serverless endpoint scales by itself; --autoscale is for real-time endpoints")
        if self.pack_models and self.variant != "gpu":
            raise ValueError(
                "--pack-models is for GPU images: CPU and serverless images build their exports from "
                "the models at image build, so the models are baked in"
            )
        return self

    @property
    def scaling(self) -> tuple[int, int] | None:
        if self.autoscale is None:
            return None
        low, _, high = self.autoscale.partition(":")
        return int(low), int(high)

    @field_validator("instance_type")
    @classmethod
    def _instance(cls, value: str) -> str:
        found = _INSTANCE.match(value)
        if not found:
            raise ValueError(f"{value!r} is not a SageMaker instance type (such as ml.g5.xlarge)")
        if found.group(1) in UNRUNNABLE_GPU_FAMILIES:
            gpus = UNRUNNABLE_GPU_FAMILIES[found.group(1)]
            raise ValueError(
                f"{value}: its {gpus} GPUs run no CUDA 13 build of torch, which this image installs "
                "(CUDA 13 dropped Volta); use ml.g5, ml.g6, ml.g6e or ml.p4d and newer"
            )
        return value

    @property
    def family(self) -> str:
        return _INSTANCE.match(self.instance_type).group(1)  # type: ignore[union-attr]

    @property
    def variant(self) -> Variant:
        if self.serverless:
            return "serverless"
        if self.family in NEURON_FAMILIES:
            return "inferentia2"
        return "gpu" if self.family in GPU_FAMILIES else "cpu"

    @property
    def arch(self) -> str:
        """The image's CPU: arm64 on Graviton instances, else x86_64 (serverless included)."""
        return "aarch64" if not self.serverless and self.family in GRAVITON_FAMILIES else "x86_64"

    @property
    def device(self) -> str:
        return {"gpu": "cuda", "inferentia2": "neuron"}.get(self.variant, "cpu")

    @property
    def payload_limit(self) -> int:
        return SERVERLESS_PAYLOAD_BYTES if self.serverless else REALTIME_PAYLOAD_BYTES
