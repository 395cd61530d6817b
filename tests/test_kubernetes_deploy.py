"""`deploy`, `status` and `delete kubernetes` with the real `kubectl`, against a stand-in API
server (`kube_api_standin.py`: discovery, OpenAPI, server-side apply validated strictly
against the API's schemas, list, watch, delete; what it does not check is written there).
What kubectl sends, and what our commands make of the answers, is real; a cluster's own work
(scheduling, pulling, running the image, merging applies field by field) is not done here.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from kube_api_standin import ApiServer, Running
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli

runner = CliRunner()
pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")


def invoke(api: Running, *argv: str) -> Any:
    return runner.invoke(cli, list(argv), env={"KUBECONFIG": str(api.kubeconfig)})


def deploy(api: Running, out: Path, model: Path, *flags: str) -> Any:
    return invoke(api, "deploy", "kubernetes", "--out", str(out), "--model-id", str(model), *flags)


def stored(state: ApiServer) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in state.objects.values() if o["kind"] != "Pod"}


def test_deploy_applies_server_side_waits_and_says_how_to_reach_it(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    state = ApiServer()
    with Running(state, tmp_path) as api:
        result = deploy(api, tmp_path / "out", tiny_embedder, "--namespace", "search")
        assert result.exit_code == 0, result.output
    assert stored(state) == {
        ("ServiceAccount", "infinity-cloud"),
        ("ConfigMap", "infinity-cloud-spec"),
        ("Deployment", "infinity-cloud"),
        ("Service", "infinity-cloud"),
        ("PodDisruptionBudget", "infinity-cloud"),
        ("ScaledObject", "infinity-cloud"),
        ("ServiceMonitor", "infinity-cloud"),
        ("PrometheusRule", "infinity-cloud"),
        ("HorizontalPodAutoscaler", "keda-hpa-infinity-cloud"),
    }
    patches = [(path, query) for method, path, query in state.requests if method == "PATCH"]
    assert len(patches) == 8 and all("/namespaces/search/" in path for path, _ in patches)
    for _, query in patches:  # server-side apply, ours, strictly validated, never forced
        assert query["fieldManager"] == ["infinity-cloud"] and query["fieldValidation"] == ["Strict"]
        assert query["force"] == ["false"]
    assert all(
        o["metadata"]["managedFields"][0]["manager"] == "infinity-cloud"
        for o in state.objects.values()
        if o["kind"] != "Pod" and not o["metadata"]["name"].startswith("keda-hpa")
    )
    assert any(
        method == "GET" and query.get("watch") for method, _, query in state.requests
    )  # rollout status
    assert "http://infinity-cloud.search.svc.cluster.local" in result.output
    assert "kubectl port-forward -n search service/infinity-cloud 8080:80" in result.output


def test_a_cluster_without_keda_is_told_before_anything_is_applied(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    state = ApiServer(custom=False)
    with Running(state, tmp_path) as api:
        result = deploy(api, tmp_path / "out", tiny_embedder)
        assert result.exit_code != 0
        said = " ".join(result.output.split())
        assert "this cluster has no ScaledObject (keda.sh): install KEDA" in said
        assert "--autoscaler hpa-cpu or none" in said
        assert not [r for r in state.requests if r[0] == "PATCH"]
        fixed = deploy(
            api, tmp_path / "out", tiny_embedder, "--autoscaler", "hpa-cpu", "--no-service-monitor"
        )
        assert fixed.exit_code == 0, fixed.output
    assert ("HorizontalPodAutoscaler", "infinity-cloud") in stored(state)


def test_status_reads_replicas_pods_and_the_autoscaler(tiny_embedder: Path, tmp_path: Path) -> None:
    state = ApiServer()
    with Running(state, tmp_path) as api:
        assert deploy(api, tmp_path / "out", tiny_embedder, "--min-replicas", "2").exit_code == 0
        result = invoke(api, "status", "kubernetes", "--min-replicas", "2")
    assert result.exit_code == 0, result.output
    assert "replicas: 2 ready, 2 up to date, 2 wanted" in result.output
    assert "pod infinity-cloud-0: Running, ready, 0 restarts" in result.output
    assert "autoscaler: keda: 2 running, 2 wanted, between 2 and 4" in result.output


def test_delete_removes_exactly_what_deploy_made(tiny_embedder: Path, tmp_path: Path) -> None:
    state = ApiServer()
    with Running(state, tmp_path) as api:
        assert deploy(api, tmp_path / "a", tiny_embedder).exit_code == 0
        assert deploy(api, tmp_path / "b", tiny_embedder, "--name", "other").exit_code == 0
        mine = {
            key
            for key in state.objects
            if key[3].endswith("infinity-cloud") or key[3] == "infinity-cloud-spec"
        }
        refused = invoke(api, "delete", "kubernetes")  # not interactive: asks for --yes
        assert refused.exit_code != 0 and "--yes" in refused.output
        result = invoke(api, "delete", "kubernetes", "--yes")
        assert result.exit_code == 0, result.output
    left = {(o["kind"], o["metadata"]["name"]) for o in state.objects.values()}
    assert not {k for k in mine if k in state.objects and not k[3].startswith("keda-hpa")}, left
    assert ("Deployment", "other") in left and ("ScaledObject", "other") in left
    deleted = [path for method, path, _ in state.requests if method == "DELETE"]
    assert deleted and all("/other" not in path for path in deleted)


def test_a_redeploy_with_a_changed_spec_rolls_and_keeps_the_objects(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    state = ApiServer()
    with Running(state, tmp_path) as api:
        assert deploy(api, tmp_path / "out", tiny_embedder).exit_code == 0
        first = state.objects[("apps", "deployments", "default", "infinity-cloud")]
        uid, generation = first["metadata"]["uid"], first["metadata"]["generation"]
        assert deploy(api, tmp_path / "out", tiny_embedder, "--batch-tokens", "8192").exit_code == 0
    second = state.objects[("apps", "deployments", "default", "infinity-cloud")]
    assert second["metadata"]["uid"] == uid and second["metadata"]["generation"] == generation + 1
    config = state.objects[("", "configmaps", "default", "infinity-cloud-spec")]
    assert "batch_tokens: 8192" in config["data"]["infinity-cloud.yaml"]


def test_an_object_the_api_server_refuses_is_said_in_one_line(
    tiny_embedder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infinity_cloud.targets.kubernetes import manifests

    misspelt = {**manifests._security(), "runAsNonRot": True}
    monkeypatch.setattr(manifests, "_security", lambda: misspelt)
    state = ApiServer()
    with Running(state, tmp_path) as api:
        result = deploy(api, tmp_path / "out", tiny_embedder)
    assert result.exit_code != 0
    said = " ".join(result.output.split())
    assert "apply --server-side" in said and "failed" in said and "runAsNonRot" in said, said
    assert ("Deployment", "infinity-cloud") not in stored(state)


def test_deploy_with_a_policy_volume_weights_and_a_labelled_monitor(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """Applied as the API server validates them (strictly, for the built-in kinds): the
    NetworkPolicy with Prometheus's namespace read from --prometheus-url and an ingress
    namespace, the weights' one writer (a Job) beside the claim, the labelled ServiceMonitor;
    deploy then says how to check, in one command, that Prometheus scrapes the replicas; and
    delete removes the Job too."""
    flags = ("--network-policy", "--prometheus-url", "http://kps-prometheus.observability.svc:9090",
             "--ingress-from", "ingress-nginx", "--weights", "volume", "--monitor-label", "release=kps")
    state = ApiServer()
    with Running(state, tmp_path) as api:
        result = deploy(api, tmp_path / "out", tiny_embedder, *flags)
        assert result.exit_code == 0, result.output
        kinds = {kind for kind, _ in stored(state)}
        assert {"NetworkPolicy", "Job", "PersistentVolumeClaim", "ServiceMonitor"} <= kinds
        policy = state.objects[("networking.k8s.io", "networkpolicies", "default", "infinity-cloud")]
        peers = {p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                 for p in policy["spec"]["ingress"][0]["from"] if "namespaceSelector" in p}
        assert peers == {"observability", "ingress-nginx"}
        monitor = state.objects[("monitoring.coreos.com", "servicemonitors", "default", "infinity-cloud")]
        assert monitor["metadata"]["labels"]["release"] == "kps"
        said = " ".join(result.output.split())
        assert ("kubectl -n default run scrape-check --rm -i --restart=Never --image=curlimages/curl -- -sG "
                "http://kps-prometheus.observability.svc:9090/api/v1/query --data-urlencode "
                "'query=count(infinity_cloud_queued_tokens{namespace=\"default\",service=\"infinity-cloud\"})'"
                ) in said, said
        removed = invoke(api, "delete", "kubernetes", "--yes", *flags)
        assert removed.exit_code == 0, removed.output
    assert not {kind for kind, _ in stored(state)} & {"Job", "NetworkPolicy", "PersistentVolumeClaim"}
