"""How `infinity-cloud plan` sizes the `aws_lambda:` section: the function's memory. Lambda
scales by itself, one request an instance, so a replica here is an instance running at once."""

from __future__ import annotations

import math

from infinity_cloud.sizing.plan import HOURS_PER_MONTH, Choice, Load, Planner


def settings(choice: Choice, load: Load, per_replica_qps: float, scale_to_zero: bool | None) -> None:
    offer = choice.offer
    p95_s = choice.p95_ms / 1000
    concurrency = max(1, math.ceil(load.qps * p95_s))
    choice.settings.update(memory_mb=int(offer.memory_gib * 1024), provisioned_concurrency=0)
    choice.reasons["autoscaling"] = (
        f"Lambda runs one request per instance: about {concurrency} at once at {load.qps:g} requests/s "
        f"and {choice.p95_ms:,.0f} ms; it scales by itself, nothing to set"
    )
    choice.replicas = concurrency
    choice.monthly_usd = concurrency * offer.usd_per_hour * HOURS_PER_MONTH


# A Lambda invocation runs for 15 minutes at most.
PLANNER = Planner(settings, request_limit_s=900.0)
