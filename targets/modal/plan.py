"""How `infinity-cloud plan` sizes the `modal:` section: the containers, and the autoscaler's
threshold in Modal's metric, the requests in flight a container."""

from __future__ import annotations

import math

from infinity_cloud.sizing.plan import Choice, Load, Planner, container_memory_mib


def size_section(choice: Choice, load: Load, per_replica_qps: float, scale_to_zero: bool | None) -> None:
    offer, replicas = choice.offer, choice.replicas
    p95_s = choice.p95_ms / 1000
    in_flight = max(1, math.ceil(per_replica_qps * p95_s))
    choice.settings.update(
        gpu=(offer.name,) if offer.is_gpu else (),
        min_containers=0 if scale_to_zero is not False else 1,
        max_containers=replicas,
        target_concurrency=in_flight,
    )
    if not offer.is_gpu:
        choice.settings.update(cpu=float(offer.cores or 4), memory_mib=container_memory_mib(offer))
    choice.scales_to_zero = choice.settings["min_containers"] == 0
    choice.reasons["autoscaling"] = (
        f"target_concurrency {in_flight}: the requests in flight at {per_replica_qps:.1f} requests/s "
        f"a container and {choice.p95_ms:,.0f} ms each (Little's law); max_containers {replicas} "
        "caps the bill"
    )


PLANNER = Planner(size_section)
