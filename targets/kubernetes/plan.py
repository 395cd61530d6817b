"""How `infinity-cloud plan` sizes the `kubernetes:` section: the replicas and their
resources, and the autoscaler's threshold in the queued-tokens metric KEDA and the HPA read."""

from __future__ import annotations

from infinity_cloud.sizing.plan import Choice, Planner, container_memory_mib


def size_section(choice: Choice) -> None:
    offer = choice.offer
    half_p95_s = min(choice.p95_ms, choice.load.slo_ms) / 1000 / 2
    queued = max(choice.load.tokens_per_request, int(choice.rate * half_p95_s))
    choice.settings.update(
        min_replicas=choice.min_replicas,
        max_replicas=choice.replicas,
        target_queued_tokens=queued,
        memory_mib=container_memory_mib(offer),
    )
    if offer.is_gpu:
        choice.settings.update(gpu=offer.device, gpu_count=offer.gpus)  # a replica takes the node's GPUs
    else:
        choice.settings.update(cpu=float(offer.cores or 2) * 2)  # vCPUs: Kubernetes counts threads
    choice.autoscaling_why = (
        f"target_queued_tokens {queued}: what a replica clears in half the p95 ({choice.rate:,.0f} "
        f"tokens/s x {half_p95_s:.2f} s), the queued-tokens metric KEDA and the HPA read; "
        f"min_replicas {choice.min_replicas}, max_replicas {choice.replicas}"
    )


PLANNER = Planner(size_section)
