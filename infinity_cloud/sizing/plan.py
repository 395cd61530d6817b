"""`infinity-cloud plan`: the hardware, replicas, batch size, deadline and autoscaling threshold
for a model, a target and a load, with the expected p95 and monthly cost, each explained.

The model of a replica: it answers `C` tokens/s at saturation (a measured profile of the same
hardware when given, else `estimate`). A batch of `B` tokens takes B/C; a request waits for the
batch running when it came and then for its own, and at utilisation `u` for what queued ahead
(the M/D/1 factor 1/(1-u)), so p95 ~ B/C x (1 + 1/(1-u)). The batch is the largest that keeps
that within the p95 asked for; the replicas are enough that the load is `UTILISATION` of their
capacity. Each target's autoscaler is given the same rule in its own metric."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.sizing.estimate import Calibration, Estimate, Offer, Shape, estimate, offers
from infinity_cloud.sizing.profile import Profile

# The load a replica is planned at: room for bursts and for the autoscaler's lag.
UTILISATION = 0.7
# Batch tokens the plan chooses between: the server's default is the largest.
SMALLEST_BATCH, LARGEST_BATCH = 256, 16384
# A platform's own limit on one request, s (the deadline stays within half of it).
PLATFORM_LIMIT_S = {"sagemaker": 60.0, "aws_lambda": 900.0}
HOURS_PER_MONTH = 730
TARGETS = ("modal", "sagemaker", "kubernetes", "aws_lambda")


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
        raise ValueError(f"the price table has no offer for {target}; targets: {', '.join(TARGETS)}")
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
    if load.p95_ms is not None:
        limit = PLATFORM_LIMIT_S.get(offer.target)
        deadline = 2 * load.p95_ms / 1000
        choice.deadline_s = round(min(deadline, limit / 2) if limit else deadline, 3)
        choice.reasons["deadline_s"] = (
            "twice the p95 asked for: a request that would wait longer is answered 429 with a true "
            "Retry-After instead" + (f" (within half of {offer.target}'s {limit:g} s limit)" if limit else "")
        )
    target_settings(choice, load, per_replica_qps, scale_to_zero)
    return choice


def target_settings(choice: Choice, load: Load, per_replica_qps: float, scale_to_zero: bool | None) -> None:
    """The target section's fields, each with its reason: the replicas and the autoscaler's
    threshold in the metric that target's autoscaler reads."""
    offer, replicas = choice.offer, choice.replicas
    p95_s = choice.p95_ms / 1000
    reasons, settings = choice.reasons, choice.settings
    memory_mib = int(offer.memory_gib * 1024 * 0.75)
    if offer.target == "modal":
        in_flight = max(1, math.ceil(per_replica_qps * p95_s))
        settings.update(
            gpu=(offer.name,) if offer.is_gpu else (),
            min_containers=0 if scale_to_zero is not False else 1,
            max_containers=replicas,
            target_concurrency=in_flight,
        )
        if not offer.is_gpu:
            settings.update(cpu=float(offer.cores or 4), memory_mib=memory_mib)
        reasons["autoscaling"] = (
            f"target_concurrency {in_flight}: the requests in flight at {per_replica_qps:.1f} requests/s "
            f"a container and {choice.p95_ms:,.0f} ms each (Little's law); max_containers {replicas} "
            "caps the bill"
        )
    elif offer.target == "sagemaker":
        per_minute = max(1, int(per_replica_qps * 60))
        settings.update(
            instance_type=offer.name,
            instance_count=replicas,
            target_invocations=per_minute,
            autoscale=f"1:{replicas}" if replicas > 1 else None,
        )
        reasons["autoscaling"] = (
            f"target_invocations {per_minute} a minute an instance (SageMaker's InvocationsPerInstance): "
            f"{per_replica_qps:.2f} requests/s at {UTILISATION:.0%} of an instance"
        )
    elif offer.target == "kubernetes":
        queued = max(load.tokens_per_request, int(choice.capacity * p95_s / 2))
        settings.update(
            min_replicas=0 if scale_to_zero else 1,
            max_replicas=replicas,
            target_queued_tokens=queued,
            memory_mib=memory_mib,
        )
        if offer.is_gpu:
            settings.update(gpu=offer.device)
        else:
            settings.update(cpu=float(offer.cores or 2) * 2)  # vCPUs: Kubernetes counts threads
        reasons["autoscaling"] = (
            f"target_queued_tokens {queued}: what a replica clears in half the p95 ({choice.capacity:,.0f} "
            f"tokens/s x {p95_s / 2:.2f} s), the queued-tokens metric KEDA and the HPA read"
        )
    elif offer.target == "aws_lambda":
        concurrency = max(1, math.ceil(load.qps * p95_s))
        settings.update(memory_mb=int(offer.memory_gib * 1024), provisioned_concurrency=0)
        reasons["autoscaling"] = (
            f"Lambda runs one request per instance: about {concurrency} at once at {load.qps:g} requests/s "
            f"and {choice.p95_ms:,.0f} ms; it scales by itself, nothing to set"
        )
        choice.replicas = concurrency
        choice.monthly_usd = concurrency * offer.usd_per_hour * HOURS_PER_MONTH


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
