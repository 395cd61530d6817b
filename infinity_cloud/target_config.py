"""Per-target settings of the deployment spec (the Modal section; later SageMaker, Lambda).

Everything here is checked when the spec is built, so a bad setting is refused by the CLI
with a readable message before any file is rendered or any cloud API is called.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Modal's GPU types (https://modal.com/docs/guide/gpu), upper-cased as its client sends them,
# with the most of each that one container may ask for.
MODAL_GPUS: dict[str, int] = {
    "T4": 8, "L4": 8, "A10": 4, "A10G": 4, "L40S": 8, "A100": 8, "A100-40GB": 8, "A100-80GB": 8,
    "RTX-PRO-6000": 8, "H100": 8, "H100!": 8, "H200": 8, "B200": 8, "B200+": 8,
}
# Modal's own bounds (its client refuses values outside them at decoration time).
SCALEDOWN_WINDOW_RANGE = (2, 3600)
MAX_TIMEOUT_S = 24 * 3600
_MODAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,64}$")


def parse_gpu(value: str) -> str:
    """"h100:2" -> "H100:2"; an unknown type or a bad count is a ValueError naming the choices."""
    name, _, count = value.strip().partition(":")
    name = name.upper()
    if name not in MODAL_GPUS:
        choices = ", ".join(MODAL_GPUS)
        raise ValueError(f"unknown GPU {value!r}; Modal offers {choices} (add ':N' for N of them)")
    if count:
        if not count.isdigit() or not 1 <= int(count) <= MODAL_GPUS[name]:
            raise ValueError(f"GPU count in {value!r} must be 1 to {MODAL_GPUS[name]} for {name}")
        return f"{name}:{int(count)}"
    return name


class ModalSpec(BaseModel):
    """How `infinity-cloud build/deploy modal` packages the models (see the Modal docs for each)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    app_name: str = Field("infinity-cloud", description="the Modal app's name")
    environment: str | None = Field(None, description="Modal environment (default: the profile's)")
    gpu: tuple[str, ...] = Field(
        (), description="GPU type, 'TYPE:N', or several as a fallback list in order; none: CPU only"
    )
    cpu: float | None = Field(None, gt=0, description="CPU cores to reserve per container")
    memory_mib: int | None = Field(None, ge=128, description="memory to reserve per container, MiB")
    min_containers: int = Field(0, ge=0, description="containers kept warm when idle")
    max_containers: int | None = Field(None, ge=1, description="cap on containers (default: Modal's)")
    buffer_containers: int | None = Field(None, ge=0, description="idle containers kept ready under load")
    scaledown_window: int = Field(
        300, ge=SCALEDOWN_WINDOW_RANGE[0], le=SCALEDOWN_WINDOW_RANGE[1],
        description="seconds an idle container lives before it is stopped",
    )
    max_inputs: int | None = Field(
        None, ge=1, description="requests one container takes at once (default: sized from the batcher)"
    )
    target_inputs: int | None = Field(
        None, ge=1, description="requests per container the autoscaler aims for (default: from the batcher)"
    )
    timeout_s: int = Field(
        600, ge=1, le=MAX_TIMEOUT_S,
        description="longest a container may work on one request (Modal redirects web requests past 150 s)",
    )
    startup_timeout_s: int = Field(
        1200, ge=1, le=MAX_TIMEOUT_S, description="longest a container may take to load its models"
    )
    memory_snapshot: bool = Field(
        False, description="snapshot the loaded engine so later cold starts restore it (GPU: alpha)"
    )
    secrets: tuple[str, ...] = Field(
        (), description="Modal secrets for the image build and the containers (HF_TOKEN for gated models)"
    )
    api_key_secret: str | None = Field(
        None, description="Modal secret whose INFINITY_CLOUD_ENDPOINT_KEYS protect the endpoint"
    )
    requires_proxy_auth: bool = Field(False, description="also require Modal's proxy-auth headers")

    @field_validator("gpu", mode="before")
    @classmethod
    def _split_gpus(cls, value: Any) -> Any:
        """Accept "L4", "L4,A10G" (a flag or env value), or a list."""
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        return [part for item in value for part in str(item).replace(" ", "").split(",") if part]

    @field_validator("gpu")
    @classmethod
    def _known_gpus(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        gpus = tuple(parse_gpu(v) for v in value)
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"a GPU is listed twice in {', '.join(gpus)}")
        return gpus

    @field_validator("app_name", "environment", "secrets", "api_key_secret")
    @classmethod
    def _modal_names(cls, value: Any) -> Any:
        for name in [value] if isinstance(value, str) else value or ():
            if not _MODAL_NAME.match(name):
                raise ValueError(f"{name!r} is not a Modal name (1-64 letters, digits, '.', '_', '-')")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ModalSpec:
        if self.max_containers is not None and self.min_containers > self.max_containers:
            raise ValueError(
                f"min_containers ({self.min_containers}) exceeds max_containers ({self.max_containers})"
            )
        both = self.max_inputs is not None and self.target_inputs is not None
        if both and self.target_inputs > self.max_inputs:  # type: ignore[operator]
            raise ValueError(f"target_inputs ({self.target_inputs}) exceeds max_inputs ({self.max_inputs})")
        return self
