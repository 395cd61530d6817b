"""`infinity-cloud plan`: the hardware, replicas, batch size, deadline and autoscaling threshold
for a model, a target and a load, with the expected p95 and monthly cost, each explained.

The model of a replica: it answers `C` tokens/s at saturation, the least of three bounds (its
compute: a measured profile of the same hardware class when given, else `estimate`; its
tokenizer's CPU; its requests/s at the per-request overhead). A batch of `B` tokens takes B/C;
a request waits for the batch running when it came and then for its own, and at utilisation
`u` for what queued ahead (the M/D/1 factor 1/(1-u)), so p95 ~ B/C x (1 + 1/(1-u)). The batch
is the largest that keeps that within the p95 (the one asked for, else `DEFAULT_P95_MS`); the
replicas are enough that the load is `UTILISATION` of their capacity, at least `MIN_REPLICAS`
where the target keeps replicas up. An offer billed per use (Lambda, SageMaker serverless) has
no queue: a request takes its own time on an instance of its own.

Every figure is computed once, in `plan_offer`, into a `Choice` with the arithmetic that gave
it; the report only formats a Choice, so the headline, its explanation and the table of offers
cannot disagree. Each target's autoscaler is given the rule in its own metric by the target
itself (its `Planner`, in `targets/<name>/plan.py`), so this module names no target."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.sizing.estimate import Calibrations, Estimate, Offer, Shape, estimate, offers
from infinity_cloud.sizing.profile import Profile

# The load a replica is planned at: room for bursts and for the autoscaler's lag.
UTILISATION = 0.7
# Batch tokens the plan chooses between: the server's default is the largest.
SMALLEST_BATCH, LARGEST_BATCH = 256, 16384
HOURS_PER_MONTH = 730
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
# The p95 a plan keeps when none is asked for: an interactive request's budget.
DEFAULT_P95_MS = 1000.0
# Replicas a production plan keeps at least: one lost or restarting leaves one serving.
MIN_REPLICAS = 2
# The engine's tokenizer threads at most (infinity_cloud/engine/pipeline.py's pool).
TOKENIZER_THREADS = 4
# Modal stops a container idle this long (its default scaledown_window): traffic that comes
# more often keeps one up all the time.
MODAL_SCALEDOWN_S = 60


@dataclass(frozen=True)
class Load:
    qps: float
    tokens_per_request: int = 256
    texts_per_request: int = 1
    p95_ms: float | None = None  # None: DEFAULT_P95_MS
    min_replicas: int = MIN_REPLICAS

    @property
    def tokens_per_text(self) -> float:
        return self.tokens_per_request / self.texts_per_request

    @property
    def slo_ms(self) -> float:
        """The p95 the plan keeps: the one asked for, else the default."""
        return DEFAULT_P95_MS if self.p95_ms is None else self.p95_ms

    @property
    def tokens_per_s(self) -> float:
        return self.qps * self.tokens_per_request


@dataclass(frozen=True)
class Capacity:
    """A replica's saturated tokens/s: the least of its bounds, each kept to be shown."""

    compute: Estimate
    tokenizer: float | None = None  # tokens/s its tokenizer threads take, where measured
    requests_per_s: float | None = None  # at the per-request overhead, where known
    overhead_ms: float | None = None
    tokens_per_request: int = 256

    @property
    def bounds(self) -> dict[str, float]:
        found = {"compute": self.compute.tokens_per_s}
        if self.tokenizer is not None:
            found["tokenizer"] = self.tokenizer
        if self.requests_per_s is not None:
            found["requests"] = self.requests_per_s * self.tokens_per_request
        return found

    @property
    def binding(self) -> str:
        return min(self.bounds.items(), key=lambda kv: kv[1])[0]

    @property
    def tokens_per_s(self) -> float:
        return min(self.bounds.values())

    @property
    def spread(self) -> tuple[float, float] | None:
        return self.compute.spread if self.binding == "compute" else None

    def describe(self) -> str:
        parts = [f"compute {self.compute.tokens_per_s:,.0f} ({self.compute.basis})"]
        if self.tokenizer is not None:
            parts.append(f"tokenizer {self.tokenizer:,.0f} (measured on this model's tokenizer here)")
        if self.requests_per_s is not None:
            parts.append(
                f"requests {self.requests_per_s:,.0f}/s at {self.overhead_ms:g} ms each x "
                f"{self.tokens_per_request} tokens = {self.requests_per_s * self.tokens_per_request:,.0f}"
            )
        return f"the least of {'; '.join(parts)}: {self.binding} binds"


@dataclass
class Choice:
    """One offer planned for a load: every figure the report prints, with the arithmetic that
    gave it (`*_why`), set once."""

    offer: Offer
    load: Load
    capacity: Capacity
    batch_tokens: int
    replicas: int = 0
    replicas_why: str = ""
    p95_ms: float = 0.0
    p95_why: str = ""
    monthly_usd: float = 0.0
    cost_why: str = ""
    min_replicas: int = 0  # replicas kept up when idle (0: scales to zero)
    scales_to_zero: bool = False
    autoscaling_why: str = ""
    deadline_s: float | None = None
    deadline_why: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # the target section's fields

    @property
    def rate(self) -> float:
        """Tokens/s of one replica at saturation."""
        return self.capacity.tokens_per_s

    @property
    def per_replica_qps(self) -> float:
        """Requests/s a replica takes at `UTILISATION`."""
        return self.rate * UTILISATION / self.load.tokens_per_request

    @property
    def meets_p95(self) -> bool:
        """Judged against the p95 the plan keeps, asked for or the default."""
        return self.p95_ms <= self.load.slo_ms

    @property
    def reasons(self) -> dict[str, str]:
        offer = self.offer
        devices = f"{offer.gpus} x {offer.device}" if offer.gpus > 1 else offer.device
        found = {
            "hardware": f"{offer.name} ({devices}, {offer.precision()}): {self.rate:,.0f} tokens/s a "
            f"replica, {self.capacity.describe()}",
            "replicas": self.replicas_why,
            "batch_tokens": f"the largest batch whose p95 stays within {self.load.slo_ms:,g} ms"
            + ("" if self.meets_p95 else f"; even the smallest misses {self.load.slo_ms:,g} ms here"),
            "p95": self.p95_why,
            "deadline_s": self.deadline_why,
            "cost": f"{self.cost_why} (price: {offer.source}, {offer.as_of})",
        }
        if self.autoscaling_why:
            found["autoscaling"] = self.autoscaling_why
        return {k: v for k, v in found.items() if v}


@dataclass(frozen=True)
class Planner:
    """How a target sizes its own section: given by the target (`targets/<name>/plan.py`, named
    by its class's `planner`), found through the target registry its caller hands in
    (`Planners`)."""

    # Sets `choice.settings` (the section's fields) and `choice.autoscaling_why` (the
    # threshold in the metric the target's autoscaler reads) from the figures `plan_offer`
    # computed (replicas, min_replicas, scales_to_zero, p95): it changes none of them.
    size_section: Callable[[Choice], None]
    # The platform's own limit on one request, s (the deadline stays within half of it).
    request_limit_s: float | None = None
    # Whether replicas stop when idle unless told (--scale-to-zero/--keep-warm), and whether
    # they can at all.
    zero_by_default: bool = False
    can_scale_to_zero: bool = True
    # One machine, this one (`plan --target local`): one replica, nothing billed.
    one_host: bool = False


# Each target's planner by name, None where the target sizes no section: the target registry's
# `planner`, handed in by the caller (the targets import sizing, so sizing cannot import them).
Planners = Callable[[str], "Planner | None"]


def spelled(target: str) -> str:
    """A target as `deploy` spells it on the command line (aws-lambda)."""
    return target.replace("_", "-")


def local_offer() -> Offer:
    """This host as an offer: its usable cores, kernel class, clock and memory, nothing billed."""
    from infinity_cloud.core.hardware import cpu_clock_ghz, cpu_flags, cpu_model, usable_cores
    from infinity_cloud.sizing.estimate import kernel_class

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return Offer(
        target="local",
        name=f"this host ({cpu_model() or 'a CPU'})",
        device="cpu",
        memory_gib=round(memory, 1),
        usd_per_hour=0.0,
        source="read from this machine",
        as_of="now",
        cores=usable_cores(),
        kernel_class=kernel_class(cpu_flags()),
        clock_ghz=cpu_clock_ghz() or 2.5,
    )


def offers_of(target: str, planners: Planners) -> list[Offer]:
    """The offers `plan` chooses between for `target`: the price table's, or this host."""
    planner = planners(target)
    if planner is not None and planner.one_host:
        return [local_offer()]
    return offers(target)


def planned_targets(planners: Planners) -> tuple[str, ...]:
    """The targets `plan` sizes: those the price table prices (in its order) with a planner,
    then the one that sizes this host."""
    priced = [t for t in dict.fromkeys(o.target for o in offers()) if planners(t) is not None]
    local = planners("local")
    return (*priced, *(["local"] if local is not None and local.one_host else []))


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
    the planned utilisation is within the p95 kept."""
    fits = load.slo_ms / 1000 * capacity / _batches_waited(UTILISATION)
    size = SMALLEST_BATCH
    while size * 2 <= min(fits, LARGEST_BATCH):
        size *= 2
    return size


def compute_of(
    offer: Offer, shape: Shape, load: Load, table: Calibrations, profile: Profile | None
) -> Estimate:
    """One GPU's compute (`one_gpu_compute`) times the offer's GPUs: a server makes an engine
    replica on each GPU it sees and keeps them all busy (docs/backends.md, "Devices")."""
    one = one_gpu_compute(offer, shape, load, table, profile)
    if offer.gpus == 1:
        return one
    return Estimate(one.tokens_per_s * offer.gpus, one.efficiency,
                    f"{one.basis}; x{offer.gpus} GPUs, an engine replica on each", one.spread)


def one_gpu_compute(
    offer: Offer, shape: Shape, load: Load, table: Calibrations, profile: Profile | None
) -> Estimate:
    """A measured profile of this hardware class when given (its best saturated point,
    scaled to this load's text length; a profile is one device's), else the estimate; either
    says which."""
    found = estimate(offer, shape, load.tokens_per_text, table)
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


def capacity_of(
    offer: Offer,
    shape: Shape,
    load: Load,
    table: Calibrations,
    profile: Profile | None = None,
    tokenizer_per_core: float | None = None,
) -> Capacity:
    """A replica's bounds on `offer`: compute, its tokenizer (`tokenizer_per_core` tokens/s
    measured on one core, times the tokenizer threads the offer's cores allow), and requests/s
    at the per-request overhead (the profile's, else the calibration's)."""
    threads = min(offer.cores, TOKENIZER_THREADS) if offer.cores else None
    overhead = profile.request_overhead_ms if profile is not None and profile.request_overhead_ms else None
    overhead = overhead or table.request_overhead_ms
    return Capacity(
        compute=compute_of(offer, shape, load, table, profile),
        tokenizer=tokenizer_per_core * threads if tokenizer_per_core and threads else None,
        requests_per_s=1000 / overhead if overhead else None,
        overhead_ms=overhead,
        tokens_per_request=load.tokens_per_request,
    )


def check_profile(profile: Profile, available: list[Offer], accept_contended: bool) -> None:
    """Refuse a profile that speaks for no offer here, or one measured on a busy machine."""
    if profile.contended and not accept_contended:
        measured = ", ".join(f"{k} {v:g}" for k, v in (profile.conditions or {}).items())
        raise ValueError(
            "the profile was measured on a busy machine (contended"
            + (f": {measured}" if measured else "")
            + "): its numbers are low; bench again on an idle machine, or --accept-contended"
        )
    classes = list(dict.fromkeys(o.hardware_class for o in available))
    if profile.hardware.hardware_class not in classes:
        raise ValueError(
            f"the profile was measured on {profile.hardware.hardware_class} ({profile.hardware.kind}); "
            f"no offer here is of that class: the price table has {', '.join(classes)}"
        )


def choose(
    target: str,
    planners: Planners,
    shape: Shape,
    load: Load,
    table: Calibrations,
    profile: Profile | None = None,
    scale_to_zero: bool | None = None,
    hardware: str | None = None,
    tokenizer_per_core: float | None = None,
    accept_contended: bool = False,
) -> tuple[Choice, list[Choice]]:
    """Every offer of `target` (or the one named `hardware`) planned for `load`; the cheapest
    that meets the p95 (or, where none does, the one nearest it) first."""
    available = offers_of(target, planners)
    if not available:
        raise ValueError(
            f"the price table has no offer for {spelled(target)}; targets: "
            f"{', '.join(spelled(t) for t in planned_targets(planners))}"
        )
    if hardware is not None:
        named = [o for o in available if o.name == hardware]
        if not named:
            names = ", ".join(o.name for o in available)
            raise ValueError(f"{spelled(target)} has no {hardware!r} in the price table; it has {names}")
        available = named
    if profile is not None:
        check_profile(profile, available, accept_contended)
    planned = [
        plan_offer(
            offer, load, capacity_of(offer, shape, load, table, profile, tokenizer_per_core),
            planners(offer.target), scale_to_zero,
        )
        for offer in available
    ]
    meeting = [c for c in planned if c.meets_p95]
    best = min(meeting, key=lambda c: c.monthly_usd) if meeting else min(planned, key=lambda c: c.p95_ms)
    return best, planned


def _scales_to_zero(offer: Offer, planner: Planner | None, asked: bool | None) -> bool:
    if offer.billing == "per_use":
        return True
    if planner is None or planner.one_host or not planner.can_scale_to_zero:
        return False
    return planner.zero_by_default if asked is None else asked


def plan_offer(offer: Offer, load: Load, capacity: Capacity, planner: Planner | None,
               scale_to_zero: bool | None = None) -> Choice:
    """Every figure of `offer` for `load` (sized by its target's `planner`), each with its
    arithmetic, computed here only."""
    rate = capacity.tokens_per_s
    choice = Choice(offer=offer, load=load, capacity=capacity, batch_tokens=batch_for(load, rate))
    choice.scales_to_zero = _scales_to_zero(offer, planner, scale_to_zero)
    if offer.billing == "per_use":
        _per_use(choice)
    else:
        _replicas(choice, one_host=planner is not None and planner.one_host)
    limit = planner.request_limit_s if planner is not None else None
    deadline = 2 * load.slo_ms / 1000
    choice.deadline_s = round(min(deadline, limit / 2) if limit else deadline, 3)
    choice.deadline_why = (
        f"twice the p95 kept ({load.slo_ms:,g} ms): a request that would wait longer is answered 429 "
        "with a true Retry-After instead"
        + (f" (within half of the platform's {limit:g} s limit)" if limit else "")
    )
    if planner is not None:
        planner.size_section(choice)
    return choice


def _replicas(choice: Choice, one_host: bool) -> None:
    """Replicas with a queue each: enough for the load at UTILISATION, at least the floor."""
    load, offer, rate = choice.load, choice.offer, choice.rate
    needed = load.tokens_per_s / (rate * UTILISATION)
    arithmetic = (
        f"{load.qps:g} requests/s x {load.tokens_per_request} tokens = {load.tokens_per_s:,.0f} tokens/s, "
        f"at {UTILISATION:.0%} of {rate:,.0f} a replica: {needed:.2f}"
    )
    if one_host:
        choice.replicas, choice.min_replicas = 1, 1
        share = needed * UTILISATION
        choice.replicas_why = (
            f"{arithmetic} replicas' worth; this host is 1: the load is {share:.0%} of its capacity"
            + (" (more than it takes: the p95 grows without bound)" if share >= 1 else "")
            + f"; it takes {choice.per_replica_qps:,.1f} requests/s at {UTILISATION:.0%}: 1"
        )
    else:
        floor = 1 if choice.scales_to_zero else max(1, load.min_replicas)
        replicas = max(floor, math.ceil(needed))
        if choice.scales_to_zero:
            why = "; it scales to zero, and starts a replica on the next request"
        elif floor > 1:
            why = (
                f"; at least {floor} kept for redundancy (one lost or restarting leaves one serving; "
                "--min-replicas 1 drops it)"
            )
        else:
            why = "; --min-replicas 1: no redundancy"
        choice.replicas = replicas
        choice.min_replicas = 0 if choice.scales_to_zero else floor
        choice.replicas_why = f"{arithmetic}, so {math.ceil(needed)}{why}: {replicas}"
    utilisation = load.tokens_per_s / (choice.replicas * rate)
    if utilisation >= 1:
        choice.p95_ms = math.inf
        choice.p95_why = "the load exceeds what the replicas take: the queue grows without bound"
    else:
        choice.p95_ms = predicted_p95_ms(choice.batch_tokens, rate, utilisation)
        choice.p95_why = (
            f"a batch of {choice.batch_tokens:,} tokens at {rate:,.0f} tokens/s x (1 + 1/(1 - "
            f"{utilisation:.2f})) batches waited = {choice.p95_ms:,.0f} ms"
        )
    if one_host:
        choice.monthly_usd, choice.cost_why = 0.0, "this host: nothing billed = $0 a month"
    elif offer.billing == "busy":
        kept = choice.min_replicas
        steady = 1 if load.qps >= 1 / MODAL_SCALEDOWN_S else 0
        billed = max(needed, kept, steady)
        choice.monthly_usd = billed * offer.usd_per_hour * HOURS_PER_MONTH
        choice.cost_why = (
            f"billed by the second a container is up: {needed:.2f} busy (the load at {UTILISATION:.0%} of "
            f"a container), at least the {kept} kept warm"
            + (f" and 1 kept up by requests more often than every {MODAL_SCALEDOWN_S} s" if steady else "")
            + f": {billed:.2f} x ${offer.usd_per_hour:.4g}/h x {HOURS_PER_MONTH} h = "
            f"${choice.monthly_usd:,.0f} a month"
        )
    else:
        choice.monthly_usd = choice.replicas * offer.usd_per_hour * HOURS_PER_MONTH
        choice.cost_why = (
            f"{choice.replicas} x ${offer.usd_per_hour:.4g}/h x {HOURS_PER_MONTH} h = "
            f"${choice.monthly_usd:,.0f} a month"
        )


def _per_use(choice: Choice) -> None:
    """An offer billed per use runs one request an instance, with no queue: a request takes its
    own time (its tokens through the tokenizer and the model, plus the overhead), the instances
    at once are the requests/s times that (Little's law), and the bill is each request's
    duration x memory, plus per request and per GB of data."""
    load, offer, capacity = choice.load, choice.offer, choice.capacity
    steps = {"compute": load.tokens_per_request / capacity.compute.tokens_per_s}
    if capacity.tokenizer:
        steps["tokenizer"] = load.tokens_per_request / capacity.tokenizer
    if capacity.overhead_ms:
        steps["overhead"] = capacity.overhead_ms / 1000
    duration = sum(steps.values())
    choice.p95_ms = 1000 * duration
    choice.p95_why = (
        "one request an instance, no queue: "
        + " + ".join(f"{name} {1000 * s:,.1f}" for name, s in steps.items())
        + f" = {choice.p95_ms:,.0f} ms (a cold start adds to the first request of an instance)"
    )
    at_once = load.qps * duration
    choice.replicas = max(1, math.ceil(at_once))
    choice.min_replicas = 0
    choice.replicas_why = (
        f"{load.qps:g} requests/s x {duration:.3f} s each (Little's law) = {at_once:.2f} instances at once, "
        f"scaling to zero when idle: {choice.replicas}"
    )
    requests = load.qps * SECONDS_PER_MONTH
    gb = offer.memory_gib
    duration_usd = requests * duration * gb * (offer.usd_per_gb_s or 0)
    parts = [
        f"{load.qps:g} requests/s x {SECONDS_PER_MONTH:,} s = {requests:,.0f} requests x {duration:.3f} s x "
        f"{gb:g} GB x ${offer.usd_per_gb_s:.10g}/GB-s = ${duration_usd:,.2f}"
    ]
    total = duration_usd
    if offer.usd_per_million_requests:
        usd = requests / 1e6 * offer.usd_per_million_requests
        parts.append(
            f"{requests / 1e6:,.2f} M requests x ${offer.usd_per_million_requests:g}/M = ${usd:,.2f}"
        )
        total += usd
    if offer.usd_per_gb_data:
        # in: about 4 bytes a token of text; out: the answer's JSON, taken as 4 KB a text
        per_request = load.tokens_per_request * 4 + load.texts_per_request * 4096
        data_gb = requests * per_request / 1e9
        usd = data_gb * offer.usd_per_gb_data
        parts.append(f"{data_gb:,.1f} GB in and out x ${offer.usd_per_gb_data:g}/GB = ${usd:,.2f}")
        total += usd
    choice.monthly_usd = total
    choice.cost_why = (
        " + ".join(parts)
        + f" = ${total:,.0f} a month, by use at the busiest hour's rate all month (an upper bound)"
    )


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
