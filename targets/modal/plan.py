"""How `infinity-cloud plan` sizes the `modal:` section: the containers, and the autoscaler's
threshold in Modal's metric, the requests in flight a container."""

from __future__ import annotations

import math

from infinity_cloud.sizing.plan import Choice, Planner, container_memory_mib


def size_section(choice: Choice) -> None:
    offer = choice.offer
    p95_s = min(choice.p95_ms, choice.load.slo_ms) / 1000
    in_flight = max(1, math.ceil(choice.per_replica_qps * p95_s))
    choice.settings.update(
        gpu=((offer.name if offer.gpus == 1 else f"{offer.name}:{offer.gpus}"),) if offer.is_gpu else (),
        min_containers=choice.min_replicas,
        max_containers=choice.replicas,
        target_concurrency=in_flight,
    )
    if not offer.is_gpu:
        choice.settings.update(cpu=float(offer.cores or 4), memory_mib=container_memory_mib(offer))
    choice.autoscaling_why = (
        f"target_concurrency {in_flight}: the requests in flight at {choice.per_replica_qps:.1f} requests/s "
        f"a container and {p95_s * 1000:,.0f} ms each (Little's law); min_containers {choice.min_replicas}, "
        f"max_containers {choice.replicas} caps the bill"
    )


PLANNER = Planner(size_section, zero_by_default=True)
