"""The PrometheusRule the Kubernetes target renders beside its ServiceMonitor
(targets/kubernetes/alerts.py), checked by Prometheus' own tools: its groups as a rules file
pass `promtool check rules`, and a real Prometheus, scraping a real server as the operator
scrapes the rendered ServiceMonitor (tests/test_autoscaling.py), loads them, evaluates every
expression without error, and puts the latency and backlog alerts in pending once the server
is slow and backlogged past thresholds set low for the test.

Prometheus is Debian's, from `INFINITY_CLOUD_PROMETHEUS` (`.ci/fetch-prometheus`); promtool is
shipped beside it."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import FAKE, free_port
from test_autoscaling import operator_scrape_job, process, prometheus_program

from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.targets.kubernetes import alerts, manifests
from infinity_cloud.targets.kubernetes.spec import KubernetesSpec

SCRAPE_S = 1


def promtool() -> Path:
    found = Path(prometheus_program()).with_name("promtool")
    if not found.exists():
        pytest.fail(f"promtool is shipped beside prometheus, but {found} is missing")
    return found


def rules_file(rule: dict[str, Any], folder: Path) -> Path:
    """The PrometheusRule's groups as a Prometheus rules file (what the operator hands Prometheus)."""
    path = folder / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


@pytest.mark.parametrize("settings", [
    KubernetesSpec(),
    KubernetesSpec(autoscaler="none", min_replicas=3, namespace="search", name="emb", alert_p95_ms=250),
], ids=["default", "fixed-replicas"])
def test_the_rule_groups_pass_promtool(settings: KubernetesSpec, tmp_path: Path) -> None:
    spec = DeploymentSpec(models=(ModelSpec(model_id="sentence-transformers/all-MiniLM-L6-v2"),))
    rule = manifests.components(spec, settings)["alerts"]
    assert "alerts" in manifests.chosen_components(settings)
    done = subprocess.run([promtool(), "check", "rules", rules_file(rule, tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts.alerts(settings, 1))} rules found" in done.stdout + done.stderr
    # The check is real: a rule Prometheus cannot parse fails it.
    rule["spec"]["groups"][0]["rules"][0]["expr"] += " +"
    broken = subprocess.run([promtool(), "check", "rules", rules_file(rule, tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert broken.returncode != 0


def test_no_service_monitor_no_rule() -> None:
    assert "alerts" not in manifests.chosen_components(KubernetesSpec(service_monitor=False))


def prometheus_get(prometheus: str, path: str, **params: str) -> Any:
    answer = httpx.get(f"{prometheus}{path}", params=params, timeout=5).json()
    assert answer["status"] == "success", answer
    return answer["data"]


def test_prometheus_loads_the_rules_and_evaluates_them_against_a_real_server(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    program = prometheus_program()
    # Thresholds a slow, backlogged replica passes: a p95 over 1 ms, over one queued token.
    settings = KubernetesSpec(min_replicas=1, max_replicas=1, target_queued_tokens=1, alert_p95_ms=1)
    spec = DeploymentSpec(models=(ModelSpec(model_id=str(tiny_embedder)),))
    rule = manifests.components(spec, settings)["alerts"]
    objects = [*manifests.base_objects(spec, settings, ""), manifests.service_monitor(spec, settings)]
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump({"models": [{
        "model_id": str(tiny_embedder), "served_model_name": "emb", "backend": FAKE,
        "max_batch_size": 2, "backend_options": {"delay_s": 0.2}, "deadline_s": 600,
    }]}))
    port, prometheus_port = free_port(), free_port()
    scrape = tmp_path / "prometheus.yml"
    scrape.write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(rules_file(rule, tmp_path))],
        "scrape_configs": [operator_scrape_job(objects, [port], SCRAPE_S)],
    }))
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    serve = [sys.executable, "-m", "infinity_cloud", "serve", "--config", str(config), "--host", "127.0.0.1",
             "--port", str(port)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(process(serve, tmp_path / "server.log", f"http://127.0.0.1:{port}/health"))
        stack.enter_context(process(
            [program, f"--config.file={scrape}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            tmp_path / "prometheus.log", f"{prometheus}/-/ready",
        ))
        (group,) = prometheus_get(prometheus, "/api/v1/rules")["groups"]
        assert [r["name"] for r in group["rules"]] == [a.name for a in alerts.alerts(settings, 1)]

        stop = threading.Event()
        answered: list[int] = []

        def client() -> None:
            texts = [f"passage {i} about alerting on an embedding fleet" for i in range(8)]
            with httpx.Client(timeout=120) as http:
                while not stop.is_set():
                    answered.append(http.post(f"http://127.0.0.1:{port}/v1/embeddings",
                                              json={"model": "emb", "input": texts}).status_code)

        clients = [threading.Thread(target=client) for _ in range(6)]
        for thread in clients:
            thread.start()
        wanted = {"InfinityCloudLatencyHigh", "InfinityCloudQueueBacklog"}
        pending: dict[str, dict[str, Any]] = {}
        try:
            deadline = time.monotonic() + 60  # bounded: at most a minute of load
            while not wanted <= set(pending):
                if time.monotonic() > deadline:  # its log read as UTF-8 whatever the locale says
                    log = (tmp_path / "prometheus.log").read_text(encoding="utf-8", errors="replace")
                    raise AssertionError((pending, log[-3000:]))
                time.sleep(SCRAPE_S)
                for alert in prometheus_get(prometheus, "/api/v1/alerts")["alerts"]:
                    pending.setdefault(alert["labels"]["alertname"], alert)
        finally:
            stop.set()
            for thread in clients:
                thread.join(120)
        assert set(answered) == {200}, sorted(set(answered))
        assert wanted == set(pending)  # no 5xx, no 429: those two stay quiet
        latency = pending["InfinityCloudLatencyHigh"]
        assert latency["state"] == "pending"  # `for: 10m` keeps it from firing within the test
        assert latency["labels"]["model"] == "emb" and latency["labels"]["severity"] == "warning"

        # Every rule evaluated without error against the scraped series.
        (group,) = prometheus_get(prometheus, "/api/v1/rules")["groups"]
        for loaded in group["rules"]:
            assert loaded["health"] == "ok", loaded
            assert loaded["lastEvaluation"] > "2000"
        # The p95 itself, as the rule computes it, is a latency the load really had.
        p95 = next(a.signal for a in alerts.alerts(settings, 1) if a.name == "InfinityCloudLatencyHigh")
        (series,) = prometheus_get(prometheus, "/api/v1/query", query=p95)["result"]
        assert series["metric"]["model"] == "emb"
        assert 0.2 <= float(series["value"][1]) <= 60 and math.isfinite(float(series["value"][1]))
