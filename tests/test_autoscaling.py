"""The autoscalers' own query, against a real Prometheus scraping two real server processes
(two replicas of one Service) under a bounded load on this machine: the replica count that
KEDA's and the HPA's formulas give from what Prometheus answers rises while the servers hold
queued work and falls back to the minimum once they are idle. No KEDA, HPA or cluster runs
here: the formulas are theirs, written out below, applied to Prometheus' answers.

Prometheus is Debian's, from `INFINITY_CLOUD_PROMETHEUS` (`.ci/fetch-prometheus` prints it) or
PATH; CI has it, so there a missing one fails the test rather than skipping it.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import FAKE, ROOT, free_port

from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.targets.kubernetes import manifests
from infinity_cloud.targets.kubernetes.spec import KubernetesSpec

TARGET_TOKENS = 40  # a replica's share: small, so a few queued requests are "more than one replica's"
SCRAPE_S = 1


def prometheus_program() -> str:
    found = os.environ.get("INFINITY_CLOUD_PROMETHEUS") or shutil.which("prometheus")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("CI runs a real Prometheus: INFINITY_CLOUD_PROMETHEUS=\"$(.ci/fetch-prometheus)\"")
        pytest.skip("no prometheus here: INFINITY_CLOUD_PROMETHEUS=\"$(.ci/fetch-prometheus)\"")
    return found


@contextlib.contextmanager
def process(argv: list[str], log: Path, ready: str, env: dict[str, str] | None = None) -> Iterator[None]:
    """Run `argv` until the block ends; wait until `ready` answers 200."""
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log.read_text(encoding="utf-8", errors="replace")[-3000:]
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(ready, timeout=2).status_code == 200:
                        break
                assert time.monotonic() < deadline, log.read_text(encoding="utf-8", errors="replace")[-3000:]
                time.sleep(0.2)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _meta_name(label: str) -> str:
    """A Kubernetes label as service discovery names it in a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def operator_scrape_job(objects: list[dict[str, Any]], ports: list[int], interval_s: int) -> dict[str, Any]:
    """The scrape job the Prometheus operator makes of the rendered ServiceMonitor, for the rendered
    Service's endpoints: here one replica per port on 127.0.0.1. Each target carries the meta
    labels Kubernetes service discovery gives an endpoint (`role: endpoints`: the Service's
    namespace, name and labels, the port's name, the pod and its container), and the job
    relabels them as the operator writes it (prometheus-operator, pkg/prometheus/promcfg.go:
    keep the Service the monitor selects and the port it names; namespace, service, pod,
    container, job and endpoint labels), then applies the endpoint's own relabelings. A
    monitor that selects no Service, or names another port, leaves nothing scraped."""
    kinds = {o["kind"]: o for o in objects}
    monitor, service = kinds["ServiceMonitor"], kinds["Service"]
    (endpoint,) = monitor["spec"]["endpoints"]
    namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
    assert namespace in monitor["spec"]["namespaceSelector"]["matchNames"]
    container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    (port,) = service["spec"]["ports"]
    relabel: list[dict[str, Any]] = [
        {"source_labels": [f"__meta_kubernetes_service_label_{_meta_name(k)}",
                           f"__meta_kubernetes_service_labelpresent_{_meta_name(k)}"],
         "regex": f"({re.escape(v)});true", "action": "keep"}
        for k, v in monitor["spec"]["selector"]["matchLabels"].items()
    ]
    relabel += [
        {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"],
         "action": "keep"},
        {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                           "__meta_kubernetes_endpoint_address_target_name"],
         "regex": "Pod;(.*)", "target_label": "pod", "replacement": "${1}"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    relabel += [{_snake(k): v for k, v in r.items()} for r in endpoint.get("relabelings", [])]
    service_labels = {}
    for key, value in service["metadata"]["labels"].items():
        service_labels[f"__meta_kubernetes_service_label_{_meta_name(key)}"] = value
        service_labels[f"__meta_kubernetes_service_labelpresent_{_meta_name(key)}"] = "true"
    targets = [{"targets": [f"127.0.0.1:{p}"], "labels": {
        **service_labels,
        "__meta_kubernetes_namespace": namespace, "__meta_kubernetes_service_name": name,
        "__meta_kubernetes_endpoint_port_name": port["name"],
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": f"{name}-{i}",
        "__meta_kubernetes_pod_name": f"{name}-{i}",
        "__meta_kubernetes_pod_container_name": container["name"],
    }} for i, p in enumerate(ports)]
    return {
        "job_name": f"serviceMonitor/{namespace}/{monitor['metadata']['name']}/0",
        "metrics_path": endpoint["path"],
        "scrape_interval": f"{interval_s}s",  # the monitor's own is 15s: too slow for a test
        "static_configs": targets,
        "relabel_configs": relabel,
        "metric_relabel_configs": [{_snake(k): v for k, v in r.items()}
                                   for r in endpoint.get("metricRelabelings", [])],
    }


def query(prometheus: str, promql: str) -> float:
    """What Prometheus answers to the query now: a scalar sum (0 when it has no series)."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert answer["status"] == "success", answer
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def keda_replicas(value: float, threshold: float, low: int, high: int) -> int:
    """KEDA's Prometheus scaler feeds the HPA an AverageValue metric of `threshold`, so the
    HPA wants ceil(value / threshold) replicas, within [min, max] (keda.sh/docs/concepts)."""
    return min(high, max(low, math.ceil(value / threshold)))


def hpa_replicas(current: int, per_pod: list[float], target: float, low: int, high: int) -> int:
    """The HPA's own rule for a Pods metric: ceil(current x average / target), left alone
    within its 10 % tolerance (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale)."""
    average = sum(per_pod) / len(per_pod) if per_pod else 0.0
    ratio = average / target
    if abs(ratio - 1) <= 0.1:
        return current
    return min(high, max(low, math.ceil(current * ratio)))


def test_the_scaled_object_query_rises_under_load_and_falls_when_idle(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    program = prometheus_program()
    settings = KubernetesSpec(min_replicas=1, max_replicas=6, target_queued_tokens=TARGET_TOKENS)
    spec = DeploymentSpec(models=(ModelSpec(model_id=str(tiny_embedder)),))
    trigger = manifests.autoscaler(spec, settings, "keda")["spec"]["triggers"][0]["metadata"]
    hpa = manifests.autoscaler(spec, settings, "hpa")["spec"]["metrics"][0]["pods"]
    threshold = float(trigger["threshold"])
    assert threshold == TARGET_TOKENS == float(hpa["target"]["averageValue"])

    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump({"models": [{
        "model_id": str(tiny_embedder), "served_model_name": "emb", "backend": FAKE,
        "max_batch_size": 2, "backend_options": {"delay_s": 0.25},
    }]}))
    replicas = [free_port(), free_port()]
    prometheus_port = free_port()
    scrape = tmp_path / "prometheus.yml"
    # Scraped as the Prometheus operator scrapes the rendered ServiceMonitor: its relabelling
    # gives the series the namespace and service labels the query selects.
    objects = [*manifests.base_objects(spec, settings, ""), manifests.service_monitor(spec, settings)]
    scrape.write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "scrape_configs": [operator_scrape_job(objects, replicas, SCRAPE_S)],
    }))
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    serve = [sys.executable, "-m", "infinity_cloud", "serve", "--config", str(config), "--host", "127.0.0.1"]
    with contextlib.ExitStack() as stack:
        for i, port in enumerate(replicas):
            stack.enter_context(process([*serve, "--port", str(port)], tmp_path / f"replica-{i}.log",
                                        f"http://127.0.0.1:{port}/health"))
        stack.enter_context(process(
            [program, f"--config.file={scrape}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            tmp_path / "prometheus.log", f"{prometheus}/-/ready",
        ))
        up = "sum(up{job=\"infinity-cloud\"})"
        deadline = time.monotonic() + 30
        while query(prometheus, up) < 2:  # both replicas scraped
            log = tmp_path / "prometheus.log"
            assert time.monotonic() < deadline, log.read_text(encoding="utf-8", errors="replace")[-3000:]
            time.sleep(0.5)
        idle_before = query(prometheus, trigger["query"])

        stop = threading.Event()
        answered: list[int] = []

        def client(port: int) -> None:
            texts = [f"passage {i} about autoscaling an embedding fleet" for i in range(8)]
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    answered.append(http.post(f"http://127.0.0.1:{port}/v1/embeddings",
                                              json={"model": "emb", "input": texts}).status_code)

        clients = [threading.Thread(target=client, args=(replicas[i % 2],)) for i in range(8)]
        for thread in clients:
            thread.start()
        busiest, busiest_keda, busiest_hpa = 0.0, 1, 1
        try:
            deadline = time.monotonic() + 20  # bounded: at most 20 s of load
            while time.monotonic() < deadline:
                time.sleep(SCRAPE_S)
                value = query(prometheus, trigger["query"])
                per_pod = httpx.get(f"{prometheus}/api/v1/query", timeout=5, params={
                    "query": f"sum by (instance) ({hpa['metric']['name']}{{service=\"{settings.name}\"}})",
                }).json()["data"]["result"]
                if value > busiest:
                    busiest = value
                    low, high = settings.min_replicas, settings.max_replicas
                    busiest_keda = keda_replicas(value, threshold, low, high)
                    pods = [float(r["value"][1]) for r in per_pod]
                    busiest_hpa = hpa_replicas(2, pods, threshold, low, high)
                if busiest_keda > 2 and time.monotonic() > deadline - 15:
                    break
        finally:
            stop.set()
            for thread in clients:
                thread.join(60)
        assert set(answered) == {200}, sorted(set(answered))
        assert idle_before == 0
        assert busiest > threshold, f"the queue never held more than one replica's share: {busiest}"
        assert busiest_keda > settings.min_replicas and busiest_hpa > 2, (busiest, busiest_keda, busiest_hpa)

        deadline = time.monotonic() + 30
        while (after := query(prometheus, trigger["query"])) > 0:
            assert time.monotonic() < deadline, f"still {after} queued tokens 30 s after the load"
            time.sleep(SCRAPE_S)
        idle = keda_replicas(after, threshold, settings.min_replicas, settings.max_replicas)
        assert idle == settings.min_replicas
        print(f"queued tokens at most {busiest:.0f} (threshold {threshold:.0f}): KEDA wants {busiest_keda}, "
              f"the HPA {busiest_hpa} of 2 running; idle: {idle}")
