"""The one protocol every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import ModelLoadError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.inputs import ModelInputs


@dataclass(frozen=True)
class Calibration:
    """Inputs for measuring a precision while building it (accuracy-aware int8): batches to
    rank layers on, held-out batches to check the result on, the task's head, so that what
    is compared is what a caller gets (pooled, normalised vectors; scores), and batches to
    collect static int8's activation ranges on (texts apart from the held-out ones)."""

    batches: list[ModelInputs]
    held_out: list[ModelInputs]
    head: Head
    statistics: list[ModelInputs]


class Backend(ABC):
    """Loads a model's weights and runs batches through one of its graphs.

    `forward` returns what the graph returns (its family's `Graph.returns`): token states for an
    encoder, logits for a classifier, pooled term weights for SPLADE, a tower's embeddings
    for CLIP. Pooling, heads, normalisation and scoring are the engine's shared code, never a
    backend's; the graphs themselves are defined once, by their families (`families/`).
    """

    name: ClassVar[str]
    # The graphs this backend can run, by name; None: every family's graph.
    graphs: ClassVar[frozenset[str] | None] = None
    # Whether it runs a graph's ONNX trace, so only graphs that trace (`Graph.traceable`).
    traced: ClassVar[bool] = False
    # Where to turn for a graph this backend does not run.
    others: ClassVar[str] = "--backend torch (or auto)"
    # Precisions built by measuring: their __init__ takes `calibration=`, a function that
    # makes the `Calibration` (only a build calls it).
    calibrated_dtypes: ClassVar[frozenset[str]] = frozenset()
    # Token inputs are padded to a multiple of this (never past the model's length): a backend
    # that keeps compiled kernels per input shape meets a bounded set of shapes, not one new
    # shape per new input length.
    length_grain: ClassVar[int] = 1

    def __init__(self, info: ModelInfo, spec: ModelSpec, graph: GraphOutput | None = None) -> None:
        self.info = info
        self.spec = spec
        self.graph: GraphOutput = graph or info.towers["text"]
        runs = "graphs that trace to ONNX" if self.traced else ", ".join(sorted(self.graphs or ()))
        if (self.graphs is not None and self.graph not in self.graphs) or (
            self.traced and not info.family.graph(self.graph).traceable
        ):
            raise ModelLoadError(
                f"the {self.name} backend cannot run {info.path.name}'s {self.graph} graph "
                f"({info.family.name}); it runs {runs}: serve it with {self.others}"
            )
        self.device = "cpu"
        self.dtype = "float32"
        # Worst cosine to float32 on the fidelity probes, measured for reduced precisions.
        self.agreement: float | None = None
        # Why it runs in another precision than the one `dtype auto`/`fastest` would pick, or
        # than the one asked for falls short (`/models` shows it); None where nothing is amiss.
        self.precision_note: str | None = None
        # The cached export it runs (its folder's name, a hash of how it was built): a
        # precision verdict is about that build, and a rebuilt int8 needs its own.
        self.export_name: str | None = None
        self.export_folder: Path | None = None  # where it is (its size is logged at load)

    @abstractmethod
    def forward(self, inputs: ModelInputs) -> np.ndarray: ...

    @classmethod
    def auto_dtypes(cls, spec: ModelSpec) -> tuple[str, ...]:
        """Precisions `dtype auto` measures at load on `spec`'s device, float32 first, to serve
        the fastest that agrees with float32; none: the backend's own rule picks one."""
        return ()

    @classmethod
    def fastest_dtypes(cls, spec: ModelSpec) -> tuple[str, ...]:
        """Precisions `dtype fastest` times at load on `spec`'s device, float32 first: every
        one the backend runs there, int8 included."""
        return cls.auto_dtypes(spec) or ("float32",)

    @classmethod
    def device_name(cls, spec: ModelSpec) -> str:
        """The device `spec` runs on, as specific as a measurement on it needs (a GPU's model)."""
        return spec.device

    @classmethod
    def visible_devices(cls, kind: str) -> int:
        """Devices of `kind` (cuda) this backend can run on in this process: what a model is
        replicated onto by default (`models.replicas`)."""
        return 1

    def fuse(self, head: Head) -> bool:
        """Run `head` inside the graph from now on, if this backend can (`forward` then returns
        the head's rows): on a GPU only what the answer needs is copied to the host."""
        return False

    def submit(self, inputs: ModelInputs) -> Callable[[], np.ndarray]:
        """Start a batch and return a function that waits for its output.

        Backends that run asynchronously override this so the next batch is started while
        the last one still runs (no idle cores between batches); by default it is `forward`.
        """
        output = self.forward(inputs)
        return lambda: output

    @property
    def batches_in_flight(self) -> int:
        """Batches it runs at once (`submit` starts the next before the last is collected):
        what a full batch's device memory is multiplied by to fit the device. By default
        `submit` is `forward`, so one."""
        return 1

    def peak_device_bytes(self, inputs: ModelInputs) -> int | None:
        """Device memory a batch of `inputs` takes at its peak above the weights, measured by
        running it; None for a backend on the host (the memory budget counts that)."""
        return None

    def free_device_bytes(self) -> int | None:
        """Device memory free for batches now (free plus cached); None on the host."""
        return None

    def settle(self) -> None:  # noqa: B027 - most backends do nothing in the background
        """Wait for what the backend still builds in the background after loading (it adds
        memory a budget must count)."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (device memory, sessions)."""
