"""How `infinity-cloud plan` sizes the `sagemaker:` section: a real-time endpoint's instances
and the autoscaler's threshold in SageMaker's metric (invocations a minute an instance), or a
serverless endpoint's memory and concurrency (billed per use, sized by `plan` itself)."""

from __future__ import annotations

from infinity_cloud.sizing.plan import UTILISATION, Choice, Planner


def size_section(choice: Choice) -> None:
    if choice.offer.billing == "per_use":
        choice.settings.update(
            serverless=True,
            memory_mb=int(choice.offer.memory_gib * 1024),
            max_concurrency=min(200, 2 * choice.replicas),
        )
        choice.autoscaling_why = (
            f"serverless: SageMaker starts instances itself; max_concurrency "
            f"{choice.settings['max_concurrency']}: twice the {choice.replicas} at once at "
            f"{choice.load.qps:g} requests/s, room for bursts (at most 200)"
        )
        return
    replicas, floor = choice.replicas, choice.min_replicas
    per_minute = max(1, int(choice.per_replica_qps * 60))
    choice.settings.update(
        instance_type=choice.offer.name,
        instance_count=replicas,
        target_invocations=per_minute,
        autoscale=f"{floor}:{replicas}" if replicas > floor else None,
    )
    choice.autoscaling_why = (
        f"target_invocations {per_minute} a minute an instance (SageMaker's InvocationsPerInstance): "
        f"{choice.per_replica_qps:.2f} requests/s at {UTILISATION:.0%} of an instance; "
        + (f"autoscale {floor}:{replicas}" if replicas > floor else f"{replicas} instances, no autoscaling")
    )


# SageMaker's real-time endpoints answer within 60 s; a real-time endpoint keeps an instance.
PLANNER = Planner(size_section, request_limit_s=60.0, can_scale_to_zero=False)
