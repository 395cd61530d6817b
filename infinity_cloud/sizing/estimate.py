"""What a replica of a model answers per second on some hardware, before it was measured there:
the model's work per token (from its config) against the hardware's peak at the precision it
would be served in, times an efficiency that measured profiles calibrate.

The work per token is the encoder's matrix products, 2 x layers x (4 h^2 + 2 h i), plus its
attention, 4 x layers x h x T for texts of T tokens. A GPU's peak is its datasheet's dense
tensor rate; a CPU's is cores x clock x FLOP per cycle of the best kernels it has. Efficiency
(what share of that peak a served model reached) is read off profiles measured on the same
hardware class. A class never measured is estimated from the nearest measured class, scaled by
a factor from public, dated figures (calibration.json's `unmeasured`, each with its source), and
carries that factor's uncertainty ("unmeasured class: x0.5-x2"): never a point figure that looks
measured."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

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
    peak_tflops: dict[str, float] = Field(default_factory=dict)  # one GPU's
    # GPUs of one instance: the server makes an engine replica on each (data parallel), so a
    # replica of this offer does `gpus` times one GPU's work (`plan.compute_of`).
    gpus: int = Field(1, ge=1)
    # How it is billed: "hourly" (an instance, up or not), "busy" (Modal: the seconds a
    # container is up, usd_per_hour of them), "per_use" (Lambda, SageMaker serverless: each
    # request's duration x memory, plus per request and per GB of data).
    billing: Literal["hourly", "busy", "per_use"] = "hourly"
    usd_per_gb_s: float | None = None
    usd_per_million_requests: float | None = None
    usd_per_gb_data: float | None = None

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
    text = _data("offers.json")
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
    model: str | None = None  # the model measured, so a comparison can leave it out

    def efficiency(self) -> float:
        shape = Shape(**self.shape)
        return self.tokens_per_s * shape.flop_per_token(self.tokens_per_text) / self.peak_flops


class Unmeasured(BaseModel):
    """How a class no profile was measured on is estimated: from `nearest` (a measured class),
    its achieved FLOP per cycle and core (CPU) or share of the peak (GPU) times `factor`,
    within `spread` of the truth at best. `source`: the public, dated figures it comes from."""

    hardware_class: str  # a class, or "gpu" for any GPU without its own entry
    nearest: str  # a class, or "gpu" for the measured GPU(s)
    factor: float
    spread: tuple[float, float]
    source: str


class Calibrations(BaseModel):
    points: list[Calibration]
    unmeasured: list[Unmeasured] = Field(default_factory=list)
    # A request's fixed cost on a replica (parsing, routing, answering), ms: it bounds a
    # replica's requests/s where a profile gives none of its own.
    request_overhead_ms: float | None = None
    request_overhead_source: str = ""

    def without(self, model: str) -> Calibrations:
        """The same, its points of `model` left out (to estimate a model not calibrated on)."""
        kept = [p for p in self.points if p.model != model]
        return self.model_copy(update={"points": kept})


def _data(name: str) -> str:
    return resources.files("infinity_cloud").joinpath(f"data/{name}").read_text(encoding="utf-8")


def calibrations() -> Calibrations:
    """The profiles this project measured (`infinity_cloud/data/calibration.json`) and how a
    class none was measured on is estimated."""
    return Calibrations.model_validate(json.loads(_data("calibration.json")))


@dataclass(frozen=True)
class Estimate:
    tokens_per_s: float
    efficiency: float
    # How it was made, in one line: which calibration, and how far measured profiles of
    # the class were from each other (or that none of the class was measured).
    basis: str
    # For a class never measured: the multiplicative range the truth is taken to lie in.
    spread: tuple[float, float] | None = None


def _achieved(points: list[Calibration]) -> tuple[float, list[float]]:
    """The mean efficiency of `points` and each one's."""
    efficiencies = [p.efficiency() for p in points]
    return statistics.fmean(efficiencies), efficiencies


def _measured(table: Calibrations, hardware_class: str) -> list[Calibration]:
    if hardware_class == "gpu":
        return [p for p in table.points if not p.hardware_class.startswith("cpu/")]
    return [p for p in table.points if p.hardware_class == hardware_class]


def _rule(table: Calibrations, offer: Offer) -> tuple[Unmeasured, list[Calibration]]:
    """The first rule for the offer's class (else, for a GPU, the rule for any GPU) whose
    nearest class was measured, and its points."""
    rules = [r for r in table.unmeasured if r.hardware_class == offer.hardware_class]
    if offer.is_gpu:
        rules += [r for r in table.unmeasured if r.hardware_class == "gpu"]
    for rule in rules:
        near = _measured(table, rule.nearest)
        if near:
            return rule, near
    raise ValueError(
        f"no measured profile of {offer.hardware_class}, nor of a class calibration.json's `unmeasured` "
        "estimates it from: bench it there and give the profile (--profile)"
    )


def estimate(offer: Offer, shape: Shape, tokens_per_text: float, table: Calibrations) -> Estimate:
    """Saturated tokens/s of one replica on `offer`: from the points measured on its class,
    else from the nearest measured class by the table's rule for it, with that rule's spread."""
    work = shape.flop_per_token(tokens_per_text)
    same = [p for p in table.points if p.hardware_class == offer.hardware_class]
    if same:
        efficiency, efficiencies = _achieved(same)
        names = ", ".join(p.label for p in same)
        if len(same) == 1:
            basis = f"estimated from {names} ({efficiency:.0%} of peak), the one profile of this class"
        else:
            spread = max(abs(e / efficiency - 1) for e in efficiencies)
            basis = f"estimated from {len(same)} profiles of this class, within {spread:.0%} of each other"
        return Estimate(efficiency * offer.peak_flops() / work, efficiency, basis)
    rule, near = _rule(table, offer)
    efficiency, _ = _achieved(near)
    if offer.is_gpu:
        # The nearest GPU's share of its datasheet peak, applied to this GPU's datasheet peak.
        rate = efficiency * rule.factor * offer.peak_flops() / work
    else:
        # The FLOP a cycle and core the nearest class achieved, times the factor: never this
        # class's own peak, which no measured model comes near (AMX's 1,024).
        nearest_class = rule.nearest.removeprefix("cpu/")
        per_cycle = FLOP_PER_CYCLE[nearest_class]
        achieved = efficiency * max(per_cycle.values())
        rate = achieved * rule.factor * (offer.cores or 1) * (offer.clock_ghz or 2.5) * 1e9 / work
    low, high = rule.spread
    names = ", ".join(p.label for p in near)
    basis = (
        f"unmeasured class {offer.hardware_class}: x{low:g}-x{high:g} "
        f"({rate * low:,.0f}-{rate * high:,.0f} tokens/s); from {names} "
        f"x{rule.factor:g} ({rule.source})"
    )
    return Estimate(rate, efficiency, basis, spread=(low, high))


def tokenizer_tokens_per_s(tokenizer_json: str, texts: list[str], seconds: float = 1.0) -> float:
    """Tokens/s one core of this model's own tokenizer takes (fast tokenizers' `tokenizer.json`),
    timed over `texts` one at a time, as the server tokenizes a request, for about `seconds`."""
    import time

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokens, start = 0, time.perf_counter()
    while True:
        for text in texts:
            tokens += len(tokenizer.encode(text).ids)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return tokens / elapsed
