"""How `infinity-cloud plan` sizes the `aws_lambda:` section: the function's memory. Lambda
scales by itself, one request an instance, so a replica here is an instance running at once."""

from __future__ import annotations

import math

from infinity_cloud.sizing.plan import HOURS_PER_MONTH, Choice, Load, Planner


def size_section(choice: Choice, load: Load, per_replica_qps: float, scale_to_zero: bool | None) -> None:
    offer = choice.offer
    # No queue: an instance runs one request and Lambda starts another for the next, so a
    # request takes its own run time (at the instance's pace), and the instances running at
    # once are the requests/s times that (Little's law). The planner's p95, a replica's
    # queue at its utilisation, is not Lambda's: with it, more load could mean fewer instances.
    alone_s = load.tokens_per_request / choice.capacity
    choice.p95_ms = 1000 * alone_s
    choice.meets_p95 = load.p95_ms is None or choice.p95_ms <= load.p95_ms
    concurrency = max(1, math.ceil(load.qps * alone_s))
    choice.settings.update(memory_mb=int(offer.memory_gib * 1024), provisioned_concurrency=0)
    choice.reasons["autoscaling"] = (
        f"Lambda runs one request per instance, {choice.p95_ms:,.0f} ms each (no queue): about "
        f"{concurrency} at once at {load.qps:g} requests/s; it scales by itself, nothing to set"
    )
    choice.replicas = concurrency
    choice.monthly_usd = concurrency * offer.usd_per_hour * HOURS_PER_MONTH


# A Lambda invocation runs for 15 minutes at most.
PLANNER = Planner(size_section, request_limit_s=900.0)
