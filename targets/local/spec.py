"""The `local:` section of the deployment spec: how `infinity-cloud build local` makes its
container image (the server itself is configured by the spec's `server:`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LocalSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    base_image: str = Field("python:3.11-slim", description="Image the Dockerfile starts FROM.")
    gpu: bool = Field(
        False,
        description="Build for NVIDIA GPUs: CUDA torch, each model's GPU backend, and the GPU "
        "reserved in the compose file.",
    )

    @property
    def device(self) -> str:
        return "cuda" if self.gpu else "cpu"
