"""The `modal:` section of the deployment spec: how `infinity-cloud build/deploy modal`
packages the models. Everything is checked when the spec is built, so a bad setting is
refused with a readable message before any file is rendered or Modal is called. The CLI
makes a flag of each field (`flag` names it where the field's name would read badly)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The CUDA builds PyTorch's index publishes for each torch release (kept with the other images' needs).
from infinity_cloud.targets.container import TORCH_CUDA_BUILDS  # noqa: F401

# Modal's GPU types (https://modal.com/docs/guide/gpu), upper-cased as its client sends them.
MODAL_GPUS = (
    "T4", "L4", "A10", "A10G", "L40S", "A100", "A100-40GB", "A100-80GB", "RTX-PRO-6000",
    "H100", "H100!", "H200", "B200", "B200+",
)
# The torch build GPU images install. Modal's GPUs run from the T4 (Turing, sm_75) to the
# B200 and RTX PRO 6000 (Blackwell), whose kernels CUDA 12.6 lacks; CUDA 13.0 builds all of
# them, and Modal's hosts run driver R580 (13.0's floor). A GPU with no usable driver or
# kernels stops at start saying why (infinity_cloud/backends/cuda_check.py).
TORCH_CUDA = "cu130"
# A container's memory by default, for each of its GPUs (or a CPU container).
MEMORY_MIB_PER_GPU = 8192
# Modal's own bounds (its client refuses values outside them at decoration time).
SCALEDOWN_WINDOW_RANGE = (2, 3600)
MAX_TIMEOUT_S = 24 * 3600
_MODAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,64}$")


# GPUs a container may have of each type (https://modal.com/docs/guide/gpu, "Specifying GPU
# count": B200, H200, H100, A100, L4, T4 and L40S up to 8 on one machine, A10 up to 4). A type
# the guide gives no count for (RTX-PRO-6000) is asked for one at a time.
MAX_GPUS = {
    "T4": 8, "L4": 8, "A10": 4, "A10G": 4, "L40S": 8, "A100": 8, "A100-40GB": 8, "A100-80GB": 8,
    "H100": 8, "H100!": 8, "H200": 8, "B200": 8, "B200+": 8,
}


def parse_gpu(value: str) -> str:
    """"h100" -> "H100", "l4:4" -> "L4:4" (Modal's TYPE:COUNT, a container with COUNT GPUs,
    each served by an engine replica of its own). An unknown type, or a count Modal does not
    offer for the type, is a ValueError naming the choices."""
    name, colon, count = value.strip().partition(":")
    name = name.upper()
    if name not in MODAL_GPUS:
        raise ValueError(f"unknown GPU {value!r}; Modal offers {', '.join(MODAL_GPUS)}")
    if not colon:
        return name
    most = MAX_GPUS.get(name, 1)
    if not count.isdigit() or not 1 <= int(count) <= most:
        raise ValueError(f"{value!r}: Modal attaches 1 to {most} {name} GPUs to a container (TYPE:COUNT)")
    return name if int(count) == 1 else f"{name}:{int(count)}"


def gpu_count(gpu: str) -> int:
    """The GPUs of one parsed `--gpu` entry: "L4:4" -> 4, "L4" -> 1."""
    return int(gpu.partition(":")[2] or 1)


class ModalSpec(BaseModel):
    """How the Modal app is deployed (see Modal's guide to Servers for each setting)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    app_name: str = Field("infinity-cloud", description="The Modal app's name.")
    environment: str | None = Field(None, description="Modal environment (default: the profile's).")
    gpu: tuple[str, ...] = Field(
        (),
        description="GPU type (T4, L4, A10G, L40S, A100-80GB, H100, ...), TYPE:COUNT for several per "
        "container (L4:4; the server uses every one); several (repeated, or L4,A10G:2) form a fallback "
        "list in order. None: CPU only.",
    )
    cpu: float = Field(
        4.0, gt=0, description="CPU cores reserved per container (tokenization and HTTP run there)."
    )
    memory_mib: int = Field(
        MEMORY_MIB_PER_GPU, ge=512, description="Memory reserved per container, MiB (default 8192, times "
        "the fewest GPUs of --gpu TYPE:COUNT: every GPU's engine replica batches at once).",
        json_schema_extra={"flag": "--memory"},
    )
    min_containers: int = Field(0, ge=0, description="Containers kept running when idle.")
    max_containers: int = Field(
        2, ge=1, description="Cap on containers, so a traffic spike cannot run up an unbounded bill."
    )
    buffer_containers: int | None = Field(None, ge=0, description="Idle containers kept ready under load.")
    scaledown_window: int = Field(
        300, ge=SCALEDOWN_WINDOW_RANGE[0], le=SCALEDOWN_WINDOW_RANGE[1],
        description="Seconds an idle container lives before it is stopped.",
    )
    max_concurrency: int | None = Field(
        None, ge=1,
        description="Requests one container takes at once; Modal answers 429 past it "
        "(default: eight batches' worth). The engine's queue is sized so it never rejects first.",
    )
    target_concurrency: int | None = Field(
        None, ge=1,
        description="Requests per container the autoscaler aims for (default: two batches' worth).",
    )
    startup_timeout_s: int = Field(
        1200, ge=1, le=MAX_TIMEOUT_S, description="Longest a container may take to load its models.",
        json_schema_extra={"flag": "--startup-timeout"},
    )
    exit_grace_period_s: int = Field(
        30, ge=0, le=3600, description="Seconds a stopping container keeps serving its in-flight requests.",
        json_schema_extra={"flag": "--exit-grace-period"},
    )
    memory_snapshot: bool = Field(
        False, description="Snapshot the loaded engine so later cold starts restore it (GPU: alpha)."
    )
    secrets: tuple[str, ...] = Field(
        (),
        description="Modal secrets for the image build and the containers (e.g. one holding HF_TOKEN "
        "for gated models); repeatable.",
        json_schema_extra={"flag": "--secret"},
    )
    api_key_secret: str | None = Field(
        None,
        description="Modal secret whose INFINITY_CLOUD_ENDPOINT_KEYS (space-separated) the endpoint "
        "requires as bearer keys; the deploy and the containers refuse to run without it.",
    )
    proxy_auth: bool | None = Field(
        None,
        description="Require Modal's proxy-auth headers (Modal-Key, Modal-Secret). Default: on, unless "
        "--api-key-secret guards the endpoint; --no-proxy-auth without one makes a public endpoint.",
    )
    port: int = Field(8000, ge=1, le=65535, description="Port the server listens on inside the container.")

    @model_validator(mode="before")
    @classmethod
    def _sized_for_gpus(cls, data: Any) -> Any:
        """--memory, unless given, is one GPU's share times the container's (fewest) GPUs."""
        if not isinstance(data, dict) or data.get("memory_mib") is not None:
            return data
        try:
            gpus = [parse_gpu(g) for g in cls._split_gpus(data.get("gpu"))]
        except ValueError:
            return data  # the field's own check says why
        devices = min((gpu_count(g) for g in gpus), default=1)
        return {**data, "memory_mib": MEMORY_MIB_PER_GPU * devices} if devices > 1 else data

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
        if self.min_containers > self.max_containers:
            raise ValueError(
                f"min_containers ({self.min_containers}) exceeds max_containers ({self.max_containers})"
            )
        both = self.max_concurrency is not None and self.target_concurrency is not None
        if both and self.target_concurrency > self.max_concurrency:  # type: ignore[operator]
            raise ValueError(
                f"target_concurrency ({self.target_concurrency}) exceeds "
                f"max_concurrency ({self.max_concurrency})"
            )
        return self

    @property
    def device(self) -> str:
        return "cuda" if self.gpu else "cpu"

    @property
    def devices(self) -> int:
        """The GPUs a container surely has (the fewest of the fallback list), 1 on a CPU: each
        serves an engine replica of its own, so a container takes that many times one's load."""
        return min((gpu_count(g) for g in self.gpu), default=1)

    @property
    def requires_proxy_auth(self) -> bool:
        return self.proxy_auth if self.proxy_auth is not None else self.api_key_secret is None
