"""How `infinity-cloud plan --target local` sizes this host: one server on this machine, its
batch tokens and deadline from the p95 kept, and the memory it may use."""

from __future__ import annotations

from infinity_cloud.sizing.plan import TOKENIZER_THREADS, Choice, Planner


def size_section(choice: Choice) -> None:
    offer = choice.offer
    threads = min(offer.cores or 1, TOKENIZER_THREADS)
    budget_mb = int(offer.memory_gib * 1024 * 0.9)
    choice.autoscaling_why = (
        f"one server process (its engine batches for all {offer.cores} cores, {threads} tokenizer "
        "threads); "
        f"memory budget {budget_mb:,} MB, the server's default (90% of this host's "
        f"{offer.memory_gib:g} GiB); "
        f"it takes {choice.per_replica_qps:,.1f} requests/s at the p95 kept"
    )


PLANNER = Planner(size_section, one_host=True)
