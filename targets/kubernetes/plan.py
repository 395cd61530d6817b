"""How `infinity-cloud plan` sizes the `kubernetes:` section: the replicas and their
resources, and the autoscaler's threshold in the queued-tokens metric KEDA and the HPA read."""

from __future__ import annotations

from infinity_cloud.sizing.plan import Choice, Load, Planner, container_memory_mib


def size_section(choice: Choice, load: Load, per_replica_qps: float, scale_to_zero: bool | None) -> None:
    offer = choice.offer
    p95_s = choice.p95_ms / 1000
    queued = max(load.tokens_per_request, int(choice.capacity * p95_s / 2))
    choice.settings.update(
        min_replicas=0 if scale_to_zero else 1,
        max_replicas=choice.replicas,
        target_queued_tokens=queued,
        memory_mib=container_memory_mib(offer),
    )
    if offer.is_gpu:
        choice.settings.update(gpu=offer.device)
    else:
        choice.settings.update(cpu=float(offer.cores or 2) * 2)  # vCPUs: Kubernetes counts threads
    choice.scales_to_zero = choice.settings["min_replicas"] == 0
    choice.reasons["autoscaling"] = (
        f"target_queued_tokens {queued}: what a replica clears in half the p95 ({choice.capacity:,.0f} "
        f"tokens/s x {p95_s / 2:.2f} s), the queued-tokens metric KEDA and the HPA read"
    )


PLANNER = Planner(size_section)
