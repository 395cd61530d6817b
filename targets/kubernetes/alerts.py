"""The deployment's alerts: a PrometheusRule (monitoring.coreos.com/v1) that the Prometheus
operator loads beside the ServiceMonitor that scrapes the series it reads (it is rendered
whenever that monitor is). Each alert reads the server's own metrics (server/metrics.py),
over this deployment's replicas only (the `namespace` and `service` labels the monitor's
scrape gives them, as the autoscaler's query does):

- errors: the share of requests answered 5xx;
- latency: the p95 of `infinity_cloud_request_seconds`, by model, past `alert_p95_ms`;
- queue saturation: requests refused for load (429: the queue full, memory taken, or a wait
  past the deadline), and work queued beyond what the largest fleet clears (the autoscaler's
  per-replica share of queued tokens times the most replicas that may run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infinity_cloud.targets.kubernetes.spec import KubernetesSpec

RATE_WINDOW = "5m"
ERROR_SHARE = 0.05  # of requests answered 5xx
SHED_SHARE = 0.01  # of requests refused for load


@dataclass(frozen=True)
class Alert:
    """One alerting rule: it fires when `signal` (PromQL, a value per series) passes
    `threshold` for `hold`."""

    name: str
    signal: str
    threshold: float
    hold: str
    severity: str
    summary: str

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": f"{self.signal} > {self.threshold:g}",
            "for": self.hold,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": f"{self.summary}: {{{{ $value }}}}"},
        }


def alerts(settings: KubernetesSpec, target_tokens: int) -> list[Alert]:
    """This deployment's alerts, in the order they are rendered (`target_tokens`: the
    autoscaler's queued tokens per replica)."""
    scope = f'namespace="{settings.namespace}",service="{settings.name}"'
    requests = f"sum by (model) (rate(infinity_cloud_requests_total{{{scope}}}[{RATE_WINDOW}]))"

    def share(status: str) -> str:
        answered = f'infinity_cloud_requests_total{{{scope},status=~"{status}"}}'
        part = f"sum by (model) (rate({answered}[{RATE_WINDOW}]))"
        return f"({part} / {requests})"

    p95 = (f"histogram_quantile(0.95, sum by (le, model) "
           f"(rate(infinity_cloud_request_seconds_bucket{{{scope}}}[{RATE_WINDOW}])))")
    most = settings.min_replicas if settings.autoscaler == "none" else settings.max_replicas
    largest = target_tokens * max(1, most)
    return [
        Alert("InfinityCloudErrors", share("5.."), ERROR_SHARE, "5m", "critical",
              f"{settings.name}: more than {ERROR_SHARE:.0%} of a model's requests answered 5xx"),
        Alert("InfinityCloudLatencyHigh", p95, settings.alert_p95_ms / 1000, "10m", "warning",
              f"{settings.name}: a model's p95 request latency is over {settings.alert_p95_ms} ms (seconds)"),
        Alert("InfinityCloudQueueSaturated", share("429"), SHED_SHARE, "5m", "warning",
              f"{settings.name}: more than {SHED_SHARE:.0%} of a model's requests refused for load (429: "
              "queue full, memory taken, or a wait past its deadline)"),
        Alert("InfinityCloudQueueBacklog", f"sum(infinity_cloud_queued_tokens{{{scope}}})", largest, "10m",
              "warning", f"{settings.name}: more tokens queued than its most replicas ({most}) clear at the "
              "autoscaler's share each; raise --max-replicas"),
    ]


def prometheus_rule(settings: KubernetesSpec, target_tokens: int, meta: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule (`meta`: the deployment's metadata); its `spec.groups` is a
    Prometheus rules file as it stands."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": meta,
        "spec": {"groups": [{
            "name": f"infinity-cloud.{settings.namespace}.{settings.name}",
            "rules": [alert.rule() for alert in alerts(settings, target_tokens)],
        }]},
    }
