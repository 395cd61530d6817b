"""How `infinity-cloud plan` sizes the `aws_lambda:` section: the function's memory. Lambda
scales by itself, one request an instance, billed per use: `plan` computes the instances, p95
and cost of a per-use offer itself (sizing/plan.py); this sets the section."""

from __future__ import annotations

from infinity_cloud.sizing.plan import Choice, Planner


def size_section(choice: Choice) -> None:
    choice.settings.update(memory_mb=int(choice.offer.memory_gib * 1024), provisioned_concurrency=0)
    choice.autoscaling_why = (
        f"Lambda runs one request per instance and starts them itself: about {choice.replicas} at once at "
        f"{choice.load.qps:g} requests/s; nothing to set"
    )


# A Lambda invocation runs for 15 minutes at most.
PLANNER = Planner(size_section, request_limit_s=900.0, zero_by_default=True)
