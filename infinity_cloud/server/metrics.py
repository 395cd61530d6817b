"""Prometheus metrics, one registry per app so several apps can live in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from infinity_cloud.admission.memory import MemoryBudget
from infinity_cloud.batching import BatchReport

# Seconds, for this workload: a short text on a small model answers in a millisecond or two, a
# large batch on a CPU in seconds, and a request near its admission deadline (`--deadline-s`)
# in tens of seconds. Each bound doubles or so, so a p95 read from them is within ~2x anywhere.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes and the rest
        self.requests = Counter(
            "infinity_cloud_requests", "requests answered", ["model", "route", "status"], registry=r
        )
        self.inputs = Counter(
            "infinity_cloud_inputs", "inputs embedded, ranked or classified", ["model"], registry=r
        )
        self.tokens = Counter(
            "infinity_cloud_tokens", "real (unpadded) tokens processed", ["model"], registry=r
        )
        self.errors = Counter(
            "infinity_cloud_errors", "failed requests by kind", ["model", "kind"], registry=r
        )
        self.queue_depth = Gauge("infinity_cloud_queue_depth", "inputs waiting", ["model"], registry=r)
        # What the Kubernetes autoscalers scale on (targets/kubernetes/manifests.py names it).
        self.queued_tokens = Gauge(
            "infinity_cloud_queued_tokens", "tokens of the inputs waiting for a batch", ["model"], registry=r
        )
        # Each replica's (`models.replicas`), by device: the model's gauges above are their sums.
        self.device_queued_tokens = Gauge(
            "infinity_cloud_device_queued_tokens", "tokens of the inputs waiting on one device's replica",
            ["model", "device"], registry=r,
        )
        self.device_queue_depth = Gauge(
            "infinity_cloud_device_queue_depth", "inputs waiting on one device's replica",
            ["model", "device"], registry=r,
        )
        self.device_up = Gauge(
            "infinity_cloud_device_up", "1 while a device's replica serves, 0 once its worker died",
            ["model", "device"], registry=r,
        )
        self.memory_held = Gauge(
            "infinity_cloud_memory_held_bytes", "memory the admitted requests are estimated to hold",
            registry=r,
        )
        self.memory_budget = Gauge(
            "infinity_cloud_memory_budget_bytes", "the process's memory budget (0: none)", registry=r
        )
        self.batch_size = Histogram(
            "infinity_cloud_batch_size", "inputs per batch", ["model", "device"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r,
        )
        self.batch_tokens = Histogram(
            "infinity_cloud_batch_tokens", "padded tokens per batch", ["model", "device"],
            buckets=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536), registry=r,
        )
        self.queue_wait = Histogram(
            "infinity_cloud_queue_wait_seconds",
            "time an input waited in its model's batch queue before its batch's forward pass",
            ["model", "device"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.inference = Histogram(
            "infinity_cloud_inference_seconds", "forward pass plus postprocessing per batch",
            ["model", "device"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.latency = Histogram(
            "infinity_cloud_request_seconds",
            "time a request answered 200 took, from its engine call to its result; route: the route's "
            "template (/v1/embeddings), model: the served model's name", ["model", "route"],
            buckets=LATENCY_BUCKETS, registry=r,
        )

    def watch_cache(self, stats: Callable[[], dict[str, Any]]) -> None:
        """Export the result cache's counters, read from `stats` (`ResultCache.describe`) at
        each scrape."""
        self.registry.register(_CacheCollector(stats))

    def observe_batch(self, report: BatchReport) -> None:
        """A batch observer: called from the worker thread after each batch."""
        labels = (report.model, report.device)
        self.batch_size.labels(*labels).observe(report.size)
        self.batch_tokens.labels(*labels).observe(report.padded_tokens)
        self.inference.labels(*labels).observe(report.forward_s)
        wait = self.queue_wait.labels(*labels)
        for seconds in report.queue_wait_s:
            wait.observe(seconds)

    def render(self, queues: dict[str, dict[str, int]], memory: MemoryBudget) -> bytes:
        """The registry's text; `queues`: each model's `queue_depth` and `queued_tokens`, and
        each device's (`devices`)."""
        for model, stats in queues.items():
            self.queue_depth.labels(model).set(stats.get("queue_depth", 0))
            self.queued_tokens.labels(model).set(stats.get("queued_tokens", 0))
            for device, own in stats.get("devices", {}).items():
                self.device_queue_depth.labels(model, device).set(own["queue_depth"])
                self.device_queued_tokens.labels(model, device).set(own["queued_tokens"])
                self.device_up.labels(model, device).set(1 if own["alive"] else 0)
        self.memory_held.set(memory.held_bytes)
        self.memory_budget.set(memory.limit_bytes or 0)
        return generate_latest(self.registry)


# (kind, the cache's stat, help) of each metric but the hits.
_CACHE_METRICS = (
    (CounterMetricFamily, "misses", "inputs the cache did not hold, run by the model"),
    (CounterMetricFamily, "redis_errors", "Redis calls that failed or timed out (their inputs ran)"),
    (CounterMetricFamily, "rejected", "rows read from Redis that were not the model's (wrong form or tag): "
     "recomputed"),
    (GaugeMetricFamily, "memory_bytes", "what the in-process cache's rows take"),
    (GaugeMetricFamily, "memory_capacity_bytes", "the in-process cache's bound"),
    (GaugeMetricFamily, "entries", "rows in the in-process cache"),
)


class _CacheCollector:
    """The result cache's counters, as the cache keeps them (no second count here)."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        hits = CounterMetricFamily(
            "infinity_cloud_cache_hits", "inputs answered from the result cache, by store", labels=["store"]
        )
        for store, count in stats["hits"].items():
            hits.add_metric([store], count)
        yield hits
        for family, stat, text in _CACHE_METRICS:
            yield family(f"infinity_cloud_cache_{stat}", text, value=stats[stat])
