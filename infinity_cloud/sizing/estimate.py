"""What a replica of a model answers per second on some hardware, before it was measured there:
the model's work per token (from its config) against the hardware's peak at the precision it
would be served in, times an efficiency that measured profiles calibrate.

The work per token is the encoder's matrix products, 2 x layers x (4 h^2 + 2 h i), plus its
attention, 4 x layers x h x T for texts of T tokens. A GPU's peak is its datasheet's dense
tensor rate; a CPU's is cores x clock x FLOP per cycle of the best kernels it has. Efficiency
(what share of that peak a served model reached) is read off profiles measured on the same
hardware class; where none was, the nearest class's is used and the estimate says so."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

# FLOP per cycle per core, dense, by kernel class and precision (fused multiply-add = 2):
# AVX2 and AVX-512 are taken as two 256-bit FMA pipes (Zen 4 splits 512-bit ones; Intel's
# second 512-bit pipe is missing on many SKUs), AVX512-BF16's dot products double that, an
# AMX tile unit does 1,024 bfloat16 FLOP a cycle.
FLOP_PER_CYCLE: dict[str, dict[str, int]] = {
    "avx2": {"float32": 32},
    "avx512": {"float32": 32},
    "avx512_bf16": {"float32": 32, "bfloat16": 64},
    "amx": {"float32": 64, "bfloat16": 1024},
}


def kernel_class(flags: set[str] | frozenset[str] | list[str]) -> str:
    """The class a CPU's flags put it in, from best to worst."""
    found = set(flags)
    if "amx_bf16" in found:
        return "amx"
    if "avx512_bf16" in found:
        return "avx512_bf16"
    return "avx512" if "avx512f" in found else "avx2"


class Offer(BaseModel):
    """Hardware a target can run a replica on, and its price."""

    target: str
    name: str
    device: str  # "cpu", or the GPU's model
    memory_gib: float
    usd_per_hour: float
    source: str
    as_of: str
    cores: int | None = None
    kernel_class: str | None = None
    clock_ghz: float | None = None
    peak_tflops: dict[str, float] = Field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def hardware_class(self) -> str:
        return self.device if self.is_gpu else f"cpu/{self.kernel_class}"

    def precision(self) -> str:
        """The precision `dtype auto` serves here: the reduced one the hardware runs fast."""
        if self.is_gpu:
            return "bfloat16" if "bfloat16" in self.peak_tflops else "float16"
        return "bfloat16" if "bfloat16" in FLOP_PER_CYCLE[self.kernel_class or "avx2"] else "float32"

    def peak_flops(self) -> float:
        """FLOP/s at most, in the precision served."""
        if self.is_gpu:
            return self.peak_tflops[self.precision()] * 1e12
        return cpu_peak_flops(
            self.cores or 1, self.clock_ghz or 2.5, self.kernel_class or "avx2", self.precision()
        )


def cpu_peak_flops(cores: int, clock_ghz: float, kernels: str, precision: str) -> float:
    """A CPU's FLOP/s at most in `precision` (float32 where its class has no faster one)."""
    per_cycle = FLOP_PER_CYCLE[kernels]
    return cores * clock_ghz * 1e9 * per_cycle.get(precision, per_cycle["float32"])


def offers(target: str | None = None) -> list[Offer]:
    """The price table (`infinity_cloud/data/offers.json`), for one target or all."""
    text = resources.files("infinity_cloud").joinpath("data/offers.json").read_text(encoding="utf-8")
    found = [Offer(**o) for o in json.loads(text)["offers"]]
    return [o for o in found if target is None or o.target == target]


@dataclass(frozen=True)
class Shape:
    """A text encoder's size, from its config.json."""

    layers: int
    hidden: int
    inner: int
    max_tokens: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        try:
            hidden = int(config["hidden_size"])
            return cls(
                layers=int(config["num_hidden_layers"]),
                hidden=hidden,
                inner=int(config.get("intermediate_size") or 4 * hidden),
                max_tokens=int(config.get("max_position_embeddings") or 512),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                "plan estimates text encoders from their config.json (hidden_size, num_hidden_layers); "
                "this model's has none: bench it where it would run and give the profile (--profile)"
            ) from exc

    def flop_per_token(self, tokens_per_text: float) -> float:
        products = 2 * self.layers * (4 * self.hidden**2 + 2 * self.hidden * self.inner)
        return products + 4 * self.layers * self.hidden * tokens_per_text


class Calibration(BaseModel):
    """One measured point: a model's saturated tokens/s on known hardware."""

    label: str
    hardware_class: str
    peak_flops: float
    shape: dict[str, int]
    tokens_per_text: float
    tokens_per_s: float
    source: str

    def efficiency(self) -> float:
        shape = Shape(**self.shape)
        return self.tokens_per_s * shape.flop_per_token(self.tokens_per_text) / self.peak_flops


def calibrations() -> list[Calibration]:
    """The profiles this project measured (`infinity_cloud/data/calibration.json`)."""
    text = resources.files("infinity_cloud").joinpath("data/calibration.json").read_text(encoding="utf-8")
    return [Calibration(**c) for c in json.loads(text)["points"]]


@dataclass(frozen=True)
class Estimate:
    tokens_per_s: float
    efficiency: float
    # How it was made, in one line: which calibration, and how far measured profiles of
    # the class were from each other (or that none of the class was measured).
    basis: str


def estimate(offer: Offer, shape: Shape, tokens_per_text: float, points: list[Calibration]) -> Estimate:
    """Saturated tokens/s of one replica on `offer`, from `points` of its class, else of the
    nearest (any GPU for a GPU, any CPU for a CPU)."""
    same = [p for p in points if p.hardware_class == offer.hardware_class]
    near = same or [p for p in points if p.hardware_class.startswith("cpu/") != offer.is_gpu]
    if not near:
        raise ValueError(f"no measured profile to calibrate an estimate for {offer.name}")
    efficiencies = [p.efficiency() for p in near]
    efficiency = statistics.fmean(efficiencies)
    rate = efficiency * offer.peak_flops() / shape.flop_per_token(tokens_per_text)
    names = ", ".join(p.label for p in near)
    if not same:
        basis = (
            f"estimated: no profile of {offer.hardware_class} was measured; the efficiency of "
            f"{names} ({efficiency:.0%} of peak) is assumed"
        )
    elif len(same) == 1:
        basis = f"estimated from {names} ({efficiency:.0%} of peak), the one profile of this class"
    else:
        spread = max(abs(e / efficiency - 1) for e in efficiencies)
        basis = f"estimated from {len(same)} profiles of this class, within {spread:.0%} of each other"
    return Estimate(rate, efficiency, basis)
