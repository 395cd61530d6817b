"""`infinity-cloud plan`: the hardware, replicas, batch size, deadline and autoscaling threshold
for a model, a target and a load, with the expected p95 and monthly cost, each explained.

The model of a replica: it answers `C` tokens/s at saturation (a measured profile of the same
hardware when given, else `estimate`). A batch of `B` tokens takes B/C; a request waits for the
batch running when it came and then for its own, and at utilisation `u` for what queued ahead
(the M/D/1 factor 1/(1-u)), so p95 ~ B/C x (1 + 1/(1-u)). The batch is the largest that keeps
that within the p95 asked for; the replicas are enough that the load is `UTILISATION` of their
capacity. Each target's autoscaler is given the same rule in its own metric, by the target
itself (its `Planner`, in `targets/<name>/plan.py`), so this module names no target."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud import wiring
from infinity_cloud.sizing.estimate import Calibration, Estimate, Offer, Shape, estimate, offers
from infinity_cloud.sizing.profile import Profile

# The load a replica is planned at: room for bursts and for the autoscaler's lag.
UTILISATION = 0.7
# Batch tokens the plan chooses between: the server's default is the largest.
SMALLEST_BATCH, LARGEST_BATCH = 256, 16384
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class Load:
    qps: float
    tokens_per_request: int = 256
    texts_per_request: int = 1
    p95_ms: float | None = None

    @property
    def tokens_per_text(self) -> float:
        return self.tokens_per_request / self.texts_per_request


@dataclass
class Choice:
    offer: Offer
    capacity: float  # tokens/s of one replica at saturation
    basis: str  # where `capacity` came from
    batch_tokens: int
    replicas: int
    p95_ms: float
    meets_p95: bool
    monthly_usd: float
    reasons: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # the target section's fields
    deadline_s: float | None = None
    scales_to_zero: bool = False  # the section lets every replica stop when idle


@dataclass(frozen=True)
class Planner:
    """How a target sizes its own section: given by the target (`targets/<name>/plan.py`, named
    by its class's `planner`), found through the target registry the package hands over
    (`wiring.target_planners`)."""

    # Sets `choice.settings` (the section's fields) and `choice.reasons["autoscaling"]` (the
    # threshold in the metric the target's autoscaler reads), from the load and the requests/s
    # a replica takes at `UTILISATION`; also `choice.scales_to_zero`, and the replicas, cost and
    # p95 where the platform counts them its own way (Lambda: no queue, an instance a request).
    # Called as (choice, load, per_replica_qps, scale_to_zero: the caller's
    # --scale-to-zero/--keep-warm, None for the target's own).
    size_section: Callable[[Choice, Load, float, bool | None], None]
    # The platform's own limit on one request, s (the deadline stays within half of it).
    request_limit_s: float | None = None


def planner_of(target: str) -> Planner | None:
    """The target's planner, or None where it sizes no section."""
    if wiring.target_planners is None:
        raise ValueError("no target registry is set (infinity_cloud.wiring.target_planners)")
    return wiring.target_planners().planner(target)


def planned_targets() -> tuple[str, ...]:
    """The targets `plan` sizes: those the price table prices (in its order) with a planner."""
    return tuple(t for t in dict.fromkeys(o.target for o in offers()) if planner_of(t) is not None)


def container_memory_mib(offer: Offer) -> int:
    """The memory a container of `offer` is given: three quarters of the machine's."""
    return int(offer.memory_gib * 1024 * 0.75)


def _batches_waited(utilisation: float) -> float:
    """Batch times a request's p95 spans: the one running when it came, its own, and the
    M/D/1 queue ahead at `utilisation`."""
    return 1 + 1 / (1 - utilisation)


def predicted_p95_ms(batch_tokens: int, capacity: float, utilisation: float) -> float:
    return 1000 * batch_tokens / capacity * _batches_waited(utilisation)


def batch_for(load: Load, capacity: float) -> int:
    """The largest batch (a power of two within the server's range) whose predicted p95 at
    the planned utilisation is within the p95 asked for; the largest of all without one."""
    if load.p95_ms is None:
        return LARGEST_BATCH
    fits = load.p95_ms / 1000 * capacity / _batches_waited(UTILISATION)
    size = SMALLEST_BATCH
    while size * 2 <= min(fits, LARGEST_BATCH):
        size *= 2
    return size


def capacity_of(
    offer: Offer, shape: Shape, load: Load, calibration: list[Calibration], profile: Profile | None
) -> Estimate:
    """A measured profile of this hardware class when given (its best saturated point,
    scaled to this load's text length), else the estimate; either says which."""
    found = estimate(offer, shape, load.tokens_per_text, calibration)
    if profile is None or profile.hardware.hardware_class != offer.hardware_class or not profile.points:
        return found
    best = max(profile.points, key=lambda p: p.tokens_per_s)
    measured_length = profile.tokens_per_text.get(best.kind) or load.tokens_per_text
    rate = (
        best.tokens_per_s * shape.flop_per_token(measured_length) / shape.flop_per_token(load.tokens_per_text)
    )
    off = found.tokens_per_s / rate - 1
    return Estimate(
        rate,
        found.efficiency,
        f"measured (the profile's {best.kind} x{best.per_request} at "
        f"{best.concurrency} clients); the estimate for this hardware was {off:+.0%} from it",
    )


def choose(
    target: str,
    shape: Shape,
    load: Load,
    calibration: list[Calibration],
    profile: Profile | None = None,
    scale_to_zero: bool | None = None,
    hardware: str | None = None,
) -> tuple[Choice, list[Choice]]:
    """Every offer of `target` (or the one named `hardware`) planned for `load`; the cheapest
    that meets the p95 (or, where none does, the one nearest it) first."""
    available = offers(target)
    if not available:
        raise ValueError(
            f"the price table has no offer for {target}; targets: {', '.join(planned_targets())}"
        )
    if hardware is not None:
        named = [o for o in available if o.name == hardware]
        if not named:
            names = ", ".join(o.name for o in available)
            raise ValueError(f"{target} has no {hardware!r} in the price table; it has {names}")
        available = named
    planned = [
        plan_offer(offer, shape, load, capacity_of(offer, shape, load, calibration, profile), scale_to_zero)
        for offer in available
    ]
    meeting = [c for c in planned if c.meets_p95]
    best = min(meeting, key=lambda c: c.monthly_usd) if meeting else min(planned, key=lambda c: c.p95_ms)
    return best, planned


def plan_offer(
    offer: Offer, shape: Shape, load: Load, capacity: Estimate, scale_to_zero: bool | None
) -> Choice:
    rate = capacity.tokens_per_s
    batch = batch_for(load, rate)
    needed = load.qps * load.tokens_per_request / (rate * UTILISATION)
    replicas = max(1, math.ceil(needed))
    p95 = predicted_p95_ms(batch, rate, min(UTILISATION, needed / replicas * UTILISATION))
    meets = load.p95_ms is None or p95 <= load.p95_ms
    choice = Choice(
        offer=offer,
        capacity=rate,
        basis=capacity.basis,
        batch_tokens=batch,
        replicas=replicas,
        p95_ms=p95,
        meets_p95=meets,
        monthly_usd=replicas * offer.usd_per_hour * HOURS_PER_MONTH,
    )
    per_replica_qps = rate * UTILISATION / load.tokens_per_request
    choice.reasons = {
        "hardware": f"{offer.name} ({offer.device}, {offer.precision()}): {rate:,.0f} tokens/s a replica, "
        f"{capacity.basis}",
        "replicas": f"{load.qps:g} requests/s x {load.tokens_per_request} tokens = "
        f"{load.qps * load.tokens_per_request:,.0f} tokens/s, at {UTILISATION:.0%} of "
        f"{rate:,.0f} a replica: {needed:.2f}, so {replicas}",
        "batch_tokens": (
            f"the largest batch whose p95 ({p95:,.0f} ms predicted) stays within {load.p95_ms:g} ms"
            if load.p95_ms is not None
            else "the server's largest: no p95 was asked for"
        )
        + ("" if meets else f"; even the smallest misses {load.p95_ms:g} ms here"),
        "cost": f"{replicas} x ${offer.usd_per_hour:.4g}/h x {HOURS_PER_MONTH} h "
        f"(price: {offer.source}, {offer.as_of})",
    }
    planner = planner_of(offer.target)
    if load.p95_ms is not None:
        limit = planner.request_limit_s if planner is not None else None
        deadline = 2 * load.p95_ms / 1000
        choice.deadline_s = round(min(deadline, limit / 2) if limit else deadline, 3)
        choice.reasons["deadline_s"] = (
            "twice the p95 asked for: a request that would wait longer is answered 429 with a true "
            "Retry-After instead" + (f" (within half of {offer.target}'s {limit:g} s limit)" if limit else "")
        )
    if planner is not None:
        planner.size_section(choice, load, per_replica_qps, scale_to_zero)
    return choice


def spec_data(model_id: str, target: str, choice: Choice) -> dict[str, Any]:
    """The spec `deploy TARGET --config` takes: the model with the batch and deadline chosen,
    and the target's section (the caller validates it as any spec is)."""
    model: dict[str, Any] = {"model_id": model_id, "batch_tokens": choice.batch_tokens}
    if choice.deadline_s is not None:
        model["deadline_s"] = choice.deadline_s
    settings = {
        k: list(v) if isinstance(v, tuple) else v for k, v in choice.settings.items() if v is not None
    }
    return {"models": [model], target: settings}
