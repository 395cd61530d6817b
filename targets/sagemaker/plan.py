"""How `infinity-cloud plan` sizes the `sagemaker:` section: the instances, and the
autoscaler's threshold in SageMaker's metric, invocations a minute an instance."""

from __future__ import annotations

from infinity_cloud.sizing.plan import UTILISATION, Choice, Load, Planner


def size_section(choice: Choice, load: Load, per_replica_qps: float, scale_to_zero: bool | None) -> None:
    replicas = choice.replicas
    per_minute = max(1, int(per_replica_qps * 60))
    choice.settings.update(
        instance_type=choice.offer.name,
        instance_count=replicas,
        target_invocations=per_minute,
        autoscale=f"1:{replicas}" if replicas > 1 else None,
    )
    choice.reasons["autoscaling"] = (
        f"target_invocations {per_minute} a minute an instance (SageMaker's InvocationsPerInstance): "
        f"{per_replica_qps:.2f} requests/s at {UTILISATION:.0%} of an instance"
    )


# SageMaker's real-time endpoints answer within 60 s.
PLANNER = Planner(size_section, request_limit_s=60.0)
