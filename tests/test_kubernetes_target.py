"""The Kubernetes target, short of a cluster (none can run here): every rendered variant is
rendered by Kustomize (the `kubectl kustomize` on this machine) into exactly the objects
`deploy --dry-run` prints, validated strictly against the Kubernetes API's schemas of the
oldest release we support and the newest (kubernetes-validate), the KEDA and Prometheus
operator objects against those projects' published models (npm packages generated from their
CRDs), and the promises the manifests make are checked against a real server process: the
probes' path and answers, the drain on SIGTERM, the metric the autoscalers query.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from infinity_cloud.cli import app as cli

runner = CliRunner()
# The oldest Kubernetes release the manifests are for, and the newest the validator knows.
OLDEST, NEWEST = "1.30.0", "1.37.0"

VARIANTS: dict[str, list[str]] = {
    "cpu": [],
    "gpu-volume-keys-cache": ["--gpu", "L4", "--weights", "volume", "--storage-class", "efs-sc",
                              "--api-key-secret", "emb-keys", "--admin-key-secret", "emb-admin",
                              "--cache-url-secret", "emb-redis", "--url-prefix", "/api"],
    "hpa-network-policy": ["--autoscaler", "hpa", "--network-policy", "--min-replicas", "2",
                           "--max-replicas", "8", "--target-queued-tokens", "20000"],
    "cpu-autoscaler-no-monitor": ["--autoscaler", "hpa-cpu", "--no-service-monitor", "--namespace", "search"],
    "mig-fixed": ["--gpu-resource", "nvidia.com/mig-1g.10gb", "--autoscaler", "none", "--min-replicas", "3",
                  "--node-selector", "pool=inference"],
    "cpu-oci-weights": ["--weights", "oci", "--weights-image", "registry.example/emb-weights:1"],
    "keda-from-zero": ["--min-replicas", "0", "--zero-hosts", "embed.example.com"],
    # Scale-from-zero behind its own NetworkPolicy, with kube-prometheus-stack's Prometheus in
    # another namespace and two ingress controllers' namespaces admitted.
    "zero-network-policy": ["--min-replicas", "0", "--network-policy", "--prometheus-url",
                            "http://kps-prometheus.observability.svc.cluster.local:9090",
                            "--ingress-from", "ingress-nginx", "--ingress-from", "gateway-system"],
    "labelled-monitor": ["--monitor-label", "release=kps", "--monitor-label", "team=search"],
    "gpu-family-cuda12": ["--gpu", "A100", "--cuda", "12", "--priority-class", "inference-high",
                          "--tmp-size", "4Gi"],
    "multi-gpu": ["--gpu", "A10G", "--gpu-count", "4"],
}
# Variants whose objects need a newer Kubernetes than OLDEST: image volumes came in 1.31.
NEWER_THAN_OLDEST = {"cpu-oci-weights": "1.31.0"}


def dry_run(out: Path, model: Path, *args: str) -> tuple[list[dict[str, Any]], str]:
    """`deploy kubernetes --dry-run`: it builds the folder, prints the objects it would apply
    (stdout) and the commands it would run (stderr)."""
    argv = ["deploy", "kubernetes", "--dry-run", "--out", str(out), "--model-id", str(model), *args]
    result = runner.invoke(cli, argv)
    assert result.exit_code == 0, result.output
    objects = [doc for doc in yaml.safe_load_all(result.stdout.split("nothing deployed")[0]) if doc]
    return objects, result.stderr


@pytest.fixture(scope="module")
def built(
    tiny_embedder: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, list[dict]]]:
    """Each variant: its folder, and the objects `deploy` applies."""
    out = {}
    for name, args in VARIANTS.items():
        folder = tmp_path_factory.mktemp(name)
        objects, _ = dry_run(folder, tiny_embedder, *args)
        out[name] = (folder, objects)
    return out


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def server_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


# -- what Kustomize renders is what deploy applies, and both are valid ----------------------


def kustomize(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (which renders Kustomize folders) is not installed here")
    done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def key(o: dict[str, Any]) -> tuple[str, str]:
    return o["kind"], o["metadata"]["name"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_folder_renders_to_what_deploy_applies(built: dict, name: str) -> None:
    folder, applied = built[name]
    rendered = kustomize(folder)
    assert sorted(rendered, key=key) == sorted(applied, key=key)


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_object_is_valid_for_kubernetes(built: dict, name: str, version: str) -> None:
    import kubernetes_validate

    _, applied = built[name]
    version = NEWER_THAN_OLDEST.get(name, version) if version == OLDEST else version
    checked = 0
    for obj in applied:
        if obj["apiVersion"] in ("keda.sh/v1alpha1", "monitoring.coreos.com/v1", "http.keda.sh/v1beta1"):
            continue  # custom resources: their own projects' schemas (or documentation), below
        kubernetes_validate.validate(obj, version, strict=True)  # raises on any unknown or bad field
        checked += 1
    assert checked >= 5


def test_a_bad_field_would_be_caught(built: dict) -> None:
    """The validation above is strict: an unknown field or a wrong type fails it."""
    import kubernetes_validate

    deployment = json.loads(json.dumps(by_kind(built["cpu"][1])["Deployment"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, NEWEST, strict=True)


# The published models of KEDA's and the Prometheus operator's objects (generated from their
# CRDs' schemas, with a validate() that checks types, enums and required fields).
CRD_MODELS = {
    "ScaledObject": ("@kubernetes-models/keda@2.0.0",
                     "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject"),
    "ServiceMonitor": ("@kubernetes-models/prometheus-operator@6.0.0",
                       "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor"),
    "PrometheusRule": ("@kubernetes-models/prometheus-operator@6.0.0",
                       "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule"),
}
VALIDATE_JS = """
const [kind, module, file] = process.argv.slice(2);
const Model = (await import(module))[kind];
const objects = JSON.parse((await import("node:fs")).readFileSync(file, "utf8"));
for (const obj of objects) { new Model(obj).validate(); }
console.log(`${objects.length} valid`);
"""


@pytest.fixture(scope="module")
def crd_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The npm packages, installed from the registry into a folder of their own."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        if os.environ.get("CI"):
            pytest.fail("CI has node and npm, which validate the custom resources")
        pytest.skip("node and npm are not installed here")
    folder = tmp_path_factory.mktemp("crd-models")
    (folder / "package.json").write_text('{"type": "module", "private": true}')
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", *(p for p, _ in CRD_MODELS.values())],
                          cwd=folder, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"CI reaches the npm registry, but npm could not install: {done.stderr[-2000:]}")
        pytest.skip(f"the npm registry is not reachable here: {done.stderr[-500:]}")
    (folder / "validate.mjs").write_text(VALIDATE_JS)
    return folder


def validate_custom(
    folder: Path, kind: str, objects: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    data = folder / f"{kind}.json"
    data.write_text(json.dumps(objects))
    return subprocess.run(["node", "validate.mjs", kind, CRD_MODELS[kind][1], str(data)], cwd=folder,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", list(CRD_MODELS))
def test_custom_resources_match_their_projects_schemas(built: dict, crd_models: Path, kind: str) -> None:
    found = [o for _, objects in built.values() for o in objects if o["kind"] == kind]
    # Every folder holds every component, chosen or not: validate those too.
    for folder, _ in built.values():
        files = (folder / "components").glob(f"*/{kind.lower()}.yaml")
        found += [yaml.safe_load(p.read_text()) for p in files]
    assert found
    done = validate_custom(crd_models, kind, found)
    assert done.returncode == 0, done.stderr[-3000:]
    broken = json.loads(json.dumps(found[0]))
    if kind == "ScaledObject":
        broken["spec"]["minReplicaCount"] = "one"
    elif kind == "PrometheusRule":
        broken["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"  # not a Prometheus duration
    else:
        broken["spec"]["endpoints"][0]["interval"] = 15  # a duration is a string
    assert validate_custom(crd_models, kind, [broken]).returncode != 0


# -- field by field: what each object must say -----------------------------------------------


def test_the_keda_trigger_queries_the_servers_own_metric(built: dict, tiny_embedder: Path) -> None:
    """KEDA's Prometheus scaler (keda.sh/docs/scalers/prometheus): `serverAddress`, `query`,
    and `threshold`, a string, the value per replica; desired = ceil(query / threshold)."""
    scaled = by_kind(built["cpu"][1])["ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"] == {"name": "infinity-cloud"}
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 4)
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert meta["query"] == 'sum(infinity_cloud_queued_tokens{namespace="default",service="infinity-cloud"})'
    assert meta["threshold"] == str(2 * 16384)  # two batches of the default batch_tokens
    assert meta["serverAddress"].startswith("http://")
    # The Deployment leaves the count to the autoscaler: an apply must not reset it.
    assert "replicas" not in by_kind(built["cpu"][1])["Deployment"]["spec"]


def test_the_hpa_reads_the_same_metric_per_pod(built: dict) -> None:
    hpa = by_kind(built["hpa-network-policy"][1])["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    (metric,) = hpa["spec"]["metrics"]
    assert metric == {"type": "Pods", "pods": {"metric": {"name": "infinity_cloud_queued_tokens"},
                                               "target": {"type": "AverageValue", "averageValue": "20000"}}}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    cpu = by_kind(built["cpu-autoscaler-no-monitor"][1])["HorizontalPodAutoscaler"]
    assert cpu["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "ServiceMonitor" not in by_kind(built["cpu-autoscaler-no-monitor"][1])


def test_the_metric_the_autoscalers_query_is_one_the_server_exports(built: dict, tiny_embedder: Path) -> None:
    """The name in the manifests is read from /metrics of a real app, not restated."""
    import asyncio

    from conftest import serve_in_process, spec_of
    from prometheus_client.parser import text_string_to_metric_families

    from infinity_cloud.core.config import ModelSpec

    async def names() -> set[str]:
        spec = spec_of(ModelSpec(model_id=str(tiny_embedder), backend="torch"))
        async with serve_in_process(spec) as client:
            text = (await client.get("/metrics")).text
        return {family.name for family in text_string_to_metric_families(text)}

    exported = asyncio.run(names())
    hpa = by_kind(built["hpa-network-policy"][1])["HorizontalPodAutoscaler"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] in exported
    query = by_kind(built["cpu"][1])["ScaledObject"]["spec"]["triggers"][0]["metadata"]["query"]
    assert query.removeprefix("sum(").split("{")[0] in exported


def test_gpu_replicas_take_one_gpu_on_a_gpu_node(built: dict) -> None:
    objects = built["gpu-volume-keys-cache"][1]
    pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    server = server_container(objects)
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nodeSelector" not in pod  # the GPU's node affinity instead (below)
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = required["nodeSelectorTerms"]
    assert term == {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                          "values": ["NVIDIA-L4"]}]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    mig = built["mig-fixed"][1]
    mig_server = server_container(mig)
    assert mig_server["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == 1
    assert "nvidia.com/gpu" not in mig_server["resources"]["limits"]
    assert by_kind(mig)["Deployment"]["spec"]["replicas"] == 3  # no autoscaler: the count is ours
    assert by_kind(mig)["Deployment"]["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "inference"}
    assert "affinity" not in by_kind(mig)["Deployment"]["spec"]["template"]["spec"]
    cpu_server = server_container(built["cpu"][1])
    assert set(cpu_server["resources"]["limits"]) == {"memory"}
    assert "nodeSelector" not in by_kind(built["cpu"][1])["Deployment"]["spec"]["template"]["spec"]


def test_secrets_are_referenced_never_written(built: dict, tiny_embedder: Path, tmp_path: Path) -> None:
    objects = built["gpu-volume-keys-cache"][1]
    server = server_container(objects)
    env = {e["name"]: e for e in server["env"]}
    secret = {"secretKeyRef": {"name": "emb-redis", "key": "url"}}
    assert env["INFINITY_CLOUD_CACHE_URL"]["valueFrom"] == secret
    files = {env["INFINITY_CLOUD_API_KEY_FILE"]["value"], env["INFINITY_CLOUD_ADMIN_KEY_FILE"]["value"]}
    mounts = {m["mountPath"] for m in server["volumeMounts"]}
    assert all(str(Path(f).parent) in mounts for f in files)
    volumes = {v["name"]: v for v in by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["api-keys"]["secret"] == {"secretName": "emb-keys"}
    monitor = by_kind(objects)["ServiceMonitor"]["spec"]["endpoints"][0]
    assert monitor["path"] == "/api/metrics"
    assert monitor["authorization"]["credentials"] == {"name": "emb-keys", "key": "metrics-key"}
    # Keys or a password given in the spec would land in a manifest: refused.
    for flags, fix in ((["--api-key", "sk-123"], "--api-key-secret"),
                       (["--admin-key", "ad-123"], "--admin-key-secret"),
                       (["--cache-url", "redis://:hunter2@redis:6379/0"], "--cache-url-secret")):
        result = runner.invoke(cli, ["build", "kubernetes", "--out", str(tmp_path / flags[0][2:]),
                                     "--model-id", str(tiny_embedder), *flags])
        assert result.exit_code != 0 and fix in result.output, result.output
        assert not (tmp_path / flags[0][2:] / "base").exists()


def test_the_pods_run_restricted(built: dict) -> None:
    """The `restricted` Pod Security Standard: non-root, no privilege escalation, every
    capability dropped, the runtime's seccomp profile; and a read-only root filesystem with
    one writable temporary folder."""
    for _, objects in built.values():
        pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
        pods = [pod, *(o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Job")]
        for each in pods:
            assert each["securityContext"]["runAsNonRoot"] and each["securityContext"]["runAsUser"] >= 1000
            assert each["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert each["automountServiceAccountToken"] is False
            for container in [*each["containers"], *each.get("initContainers", [])]:
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False
                assert context["readOnlyRootFilesystem"] is True
                assert context["capabilities"] == {"drop": ["ALL"]}
                if container["name"] != "wait-for-weights":  # it only reads: no file of its own
                    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        memory = pod["containers"][0]["resources"]
        assert memory["requests"]["memory"] == memory["limits"]["memory"]  # the server budgets 90 % of it


def test_weights_on_a_volume_are_written_once_by_a_job_and_mounted_read_only(built: dict) -> None:
    """--weights volume: one writer, a Job (named for the served spec: a Job's template cannot
    change), fetches the weights into the claim and marks them complete for that spec; every
    replica mounts the claim read-only and its init container only waits for that mark, so
    replicas starting together never write the volume at once."""
    folder, objects = built["gpu-volume-keys-cache"]
    claim = by_kind(objects)["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "efs-sc"
    pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    digest = by_kind(objects)["Deployment"]["spec"]["template"]["metadata"]["annotations"][
        "infinity-cloud/spec-sha256"]
    ready = f"/models/hub/.infinity-cloud-weights-ready-{digest}"
    writers = [o for o in objects if o["kind"] == "Job"]
    (job,) = writers
    assert job["metadata"]["name"] == f"infinity-cloud-weights-{digest[:10]}"
    job_pod = job["spec"]["template"]["spec"]
    (fetch,) = job_pod["containers"]
    # On a GPU the precision check needs the GPU: it runs at the server's start.
    download = "python -m infinity_cloud download --files-only"
    assert fetch["command"] == ["sh", "-c", f"{download} && touch {ready}"]
    assert {"name": "weights", "mountPath": "/models/hub"} in fetch["volumeMounts"]  # the one writer
    claimed = {"name": "weights", "persistentVolumeClaim": {"claimName": "infinity-cloud-weights"}}
    assert claimed in job_pod["volumes"]
    # Its pod is no replica: the Deployment's (and Service's, PDB's) selector does not match it.
    selector = by_kind(objects)["Deployment"]["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    (wait,) = pod["initContainers"]
    assert wait["command"][:2] == ["sh", "-c"] and f"until [ -e {ready} ]" in wait["command"][2]
    assert wait["volumeMounts"] == [{"name": "weights", "mountPath": "/models/hub", "readOnly": True}]
    assert {"name": "weights", "persistentVolumeClaim": {"claimName": "infinity-cloud-weights",
                                                         "readOnly": True}} in pod["volumes"]
    mounted = {"name": "weights", "mountPath": "/models/hub", "readOnly": True}
    assert mounted in pod["containers"][0]["volumeMounts"]
    for container in pod["containers"] + pod["initContainers"]:  # no replica writes the claim
        assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] == "weights")
    # On a CPU the Job runs in the replicas' pool (it builds their exports); on a GPU it fetches
    # files only, anywhere: the GPU pool's taint would keep out a pod that asks for no GPU.
    from infinity_cloud.targets.kubernetes.manifests import weights_job
    from infinity_cloud.targets.kubernetes.spec import KubernetesSpec

    for gpu, placed in ((None, {"pool": "batch"}), ("L4", None)):
        settings = KubernetesSpec(gpu=gpu, weights="volume", node_selector=["pool=batch"])
        assert weights_job(settings, "models: []")["spec"]["template"]["spec"].get("nodeSelector") == placed
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in pod["containers"][0]["env"]
    dockerfile = (folder / "image" / "Dockerfile").read_text()
    assert "RUN python -m infinity_cloud download" not in dockerfile
    assert "USER 10001:10001" in dockerfile
    baked = (built["cpu"][0] / "image" / "Dockerfile").read_text()
    assert "python -m infinity_cloud download --config" in baked and "PersistentVolumeClaim" not in by_kind(
        built["cpu"][1])


def test_weights_from_an_image_volume_are_their_own_image_mounted_read_only(built: dict) -> None:
    """--weights oci: the Dockerfile's `weights` target is the hub models and every model's
    exports alone (FROM scratch), fetched and converted in a stage of their own; each replica
    mounts it read-only where the server looks for them, and the server's image (the default
    target) holds no weights and, on a CPU, no torch."""
    folder, objects = built["cpu-oci-weights"]
    pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "weights", "image": {"reference": "registry.example/emb-weights:1",
                                         "pullPolicy": "IfNotPresent"}} in pod["volumes"]
    server = server_container(objects)
    assert {"name": "weights", "mountPath": "/weights", "readOnly": True} in server["volumeMounts"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["HF_HOME"] == "/weights/hub" and env["INFINITY_CLOUD_CACHE"] == "/weights/exports"
    assert env["HF_HUB_OFFLINE"] == "1" and "initContainers" not in pod
    assert "PersistentVolumeClaim" not in by_kind(objects)
    dockerfile = (folder / "image" / "Dockerfile").read_text()
    fetch, weights, server_stage = re.split(r"^FROM ", dockerfile, flags=re.M)[1:]
    assert fetch.startswith("python:3.11-slim AS fetch") and "HF_HOME=/weights/hub" in fetch
    assert "INFINITY_CLOUD_CACHE=/weights/exports" in fetch and "infinity_cloud download --config" in fetch
    assert weights.startswith("scratch AS weights") and "COPY --from=fetch /weights /" in weights
    assert "torch" not in server_stage.replace("no torch", "") and "--from=" not in server_stage
    assert "requirements-serving.txt" in server_stage and "USER 10001:10001" in server_stage
    assert server["startupProbe"]["periodSeconds"] * server["startupProbe"]["failureThreshold"] <= 300


@pytest.mark.parametrize("args", [["--weights", "oci"], ["--weights-image", "registry.example/w:1"]])
def test_an_image_volume_needs_both_its_mode_and_its_image(tmp_path: Path, tiny_embedder: Path,
                                                           args: list[str]) -> None:
    argv = ["build", "kubernetes", "--out", str(tmp_path / "o"), "--model-id", str(tiny_embedder), *args]
    result = runner.invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert "--weights oci mounts the image named by --weights-image" in " ".join(result.output.split())


def test_scaling_to_zero_wakes_through_kedas_http_add_on(built: dict) -> None:
    """--min-replicas 0: at zero no server queues anything, so the queued-tokens trigger cannot
    wake the fleet. The ScaledObject gains the HTTP add-on's external-push trigger naming an
    InterceptorRoute, which routes the given hosts to the Service and holds a request while a
    replica loads. Field by field, as the add-on's documentation gives them (no registry
    package holds its schema): https://keda.sh/http-add-on/latest/reference/interceptorroute/
    and its migration guide's ScaledObject (trigger metadata `scalerAddress`, `interceptorRoute`)."""
    _, objects = built["keda-from-zero"]
    kinds = [o["kind"] for o in objects]
    assert kinds.index("InterceptorRoute") < kinds.index("ScaledObject")  # the route first, as they ask
    scaled = by_kind(objects)["ScaledObject"]["spec"]
    assert scaled["minReplicaCount"] == 0 and scaled["triggers"][0]["type"] == "prometheus"
    assert scaled["triggers"][1] == {"type": "external-push", "metadata": {
        "scalerAddress": "keda-add-ons-http-external-scaler.keda:9090", "interceptorRoute": "infinity-cloud"}}
    route = by_kind(objects)["InterceptorRoute"]
    assert route["apiVersion"] == "http.keda.sh/v1beta1" and route["metadata"]["name"] == "infinity-cloud"
    assert set(route["spec"]) <= {"target", "rules", "scalingMetric", "coldStart", "timeouts"}
    assert route["spec"]["target"] == {"service": "infinity-cloud", "port": 80}  # port, or portName: one
    assert route["spec"]["rules"] == [{"hosts": ["embed.example.com"]}]
    assert route["spec"]["scalingMetric"]["concurrency"]["targetValue"] >= 1  # required since 0.14
    server = server_container(objects)
    allowance = server["startupProbe"]["periodSeconds"] * server["startupProbe"]["failureThreshold"]
    assert route["spec"]["timeouts"] == {"readiness": f"{allowance}s"}  # a request waits out the load
    assert "replicas" not in by_kind(objects)["Deployment"]["spec"]  # KEDA owns the count
    assert "InterceptorRoute" not in [o["kind"] for o in built["cpu"][1]]


@pytest.mark.parametrize(("args", "message"), [
    (["--min-replicas", "0", "--autoscaler", "hpa"],
     "--min-replicas 0 scales to zero through KEDA's HTTP add-on"),
    (["--zero-hosts", "a.example.com"], "--zero-hosts names the hosts routed through KEDA's HTTP add-on"),
])
def test_scaling_to_zero_needs_keda(
    tmp_path: Path, tiny_embedder: Path, args: list[str], message: str
) -> None:
    argv = ["build", "kubernetes", "--out", str(tmp_path / "o"), "--model-id", str(tiny_embedder), *args]
    result = runner.invoke(cli, argv)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_probes_and_drain_match_the_server(built: dict) -> None:
    objects = built["gpu-volume-keys-cache"][1]
    server = server_container(objects)
    pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/api/health", "port": "http"}
    # Weights fetched and exported at the first start: a longer allowance than baked ones.
    allowed = server["startupProbe"]["periodSeconds"] * server["startupProbe"]["failureThreshold"]
    cpu = server_container(built["cpu"][1])
    baked = cpu["startupProbe"]["periodSeconds"] * cpu["startupProbe"]["failureThreshold"]
    assert allowed >= 1200 and baked >= 300
    assert server["readinessProbe"]["failureThreshold"] == 1
    assert server["livenessProbe"]["failureThreshold"] * server["livenessProbe"]["periodSeconds"] >= 60
    pause = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = int({e["name"]: e for e in server["env"]}["INFINITY_CLOUD_DRAIN_S"]["value"])
    assert pod["terminationGracePeriodSeconds"] > pause + drain
    strategy = by_kind(objects)["Deployment"]["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxUnavailable": 0, "maxSurge": 1}
    assert by_kind(objects)["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


def test_every_variable_the_pod_sets_is_one_the_server_reads(built: dict, tmp_path: Path) -> None:
    """Each INFINITY_CLOUD_* variable of the server container lands in the spec it serves
    (a misspelt one would be ignored, and a key file never read)."""
    server = server_container(built["gpu-volume-keys-cache"][1])
    (tmp_path / "keys").write_text("k1\n")
    values = {"INFINITY_CLOUD_CACHE_URL": "redis://redis:6379/0"}
    env = {e["name"]: values.get(e["name"], e.get("value")) for e in server["env"]}
    env = {k: str(tmp_path / "keys") if k.endswith("_FILE") else v for k, v in env.items()}
    env.pop("INFINITY_CLOUD_CONFIG")  # the ConfigMap's file, read below as the server reads it
    result = subprocess.run([sys.executable, "-m", "infinity_cloud", "config", "show", "--format", "json"],
                            env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)["server"]
    assert shown["drain_s"] == 30 and shown["cache_url"] == "redis://redis:6379/0"
    assert shown["api_key_file"] == shown["admin_key_file"] == str(tmp_path / "keys")


def test_dry_run_prints_the_commands_it_would_run(tiny_embedder: Path, tmp_path: Path) -> None:
    _, said = dry_run(tmp_path, tiny_embedder, "--namespace", "search", "--context", "prod")
    assert ("would run: kubectl --context prod --namespace search apply --server-side --field-manager "
            "infinity-cloud -f -") in said
    rollout = "would run: kubectl --context prod --namespace search rollout status deployment/infinity-cloud"
    assert rollout in said


def test_a_changed_spec_rolls_the_replicas(tiny_embedder: Path, tmp_path: Path) -> None:
    first, _ = dry_run(tmp_path / "a", tiny_embedder)
    second, _ = dry_run(tmp_path / "b", tiny_embedder, "--batch-tokens", "8192")

    def digest(objects: list[dict[str, Any]]) -> str:
        return by_kind(objects)["Deployment"]["spec"]["template"]["metadata"]["annotations"][
            "infinity-cloud/spec-sha256"]

    assert digest(first) != digest(second)
    assert "batch_tokens: 8192" in by_kind(second)["ConfigMap"]["data"]["infinity-cloud.yaml"]


def test_a_multi_gpu_replica_takes_every_gpu_and_is_sized_for_all_of_them(
    built: dict, tiny_embedder: Path, tmp_path: Path
) -> None:
    """--gpu-count 4 (issue 56): the pod asks the device plugin for 4 whole GPUs; its server,
    pinned to none of them (no device ids, no CUDA_VISIBLE_DEVICES), makes an engine replica on
    each. So a replica clears 4 times one GPU's load: the autoscaler's queued tokens per pod, and
    the CPU and memory it requests by default, are 4 times one GPU's (a given --memory stays)."""
    objects = built["multi-gpu"][1]
    server = server_container(objects)
    assert server["resources"]["requests"]["nvidia.com/gpu"] == 4
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 4
    resources = server["resources"]
    assert (resources["requests"]["cpu"], resources["limits"]["memory"]) == ("8", "16384Mi")
    assert "CUDA_VISIBLE_DEVICES" not in {e["name"] for e in server["env"]}
    served = yaml.safe_load(by_kind(objects)["ConfigMap"]["data"]["infinity-cloud.yaml"])
    for model in served["models"]:
        assert model.get("device", "auto") in ("auto", "cuda") and not model.get("device_ids")
    threshold = by_kind(objects)["ScaledObject"]["spec"]["triggers"][0]["metadata"]["threshold"]
    one = by_kind(built["gpu-volume-keys-cache"][1])["ScaledObject"]["spec"]["triggers"][0]["metadata"]
    assert int(threshold) == 4 * int(one["threshold"]) == 4 * 2 * 16384
    mine, _ = dry_run(tmp_path, tiny_embedder, "--gpu", "A10G", "--gpu-count", "2", "--memory", "6000")
    assert server_container(mine)["resources"]["limits"] == {"memory": "6000Mi", "nvidia.com/gpu": 2}
    assert server_container(mine)["resources"]["requests"]["cpu"] == "4"


@pytest.mark.parametrize(("flags", "said"), [
    # NVIDIA's MIG user guide ("CUDA Device Enumeration"): a CUDA process enumerates a single MIG
    # device however many the container is given, so the other slices would sit idle.
    (["--gpu-resource", "nvidia.com/mig-1g.10gb"], "CUDA lets a process use one MIG device"),
    # NVIDIA GPU Operator, "Time-Slicing GPUs in Kubernetes": a request for more than one time-sliced
    # GPU does not guarantee the pod a proportional amount of compute (the shares may be one GPU's).
    (["--gpu", "L4", "--gpu-resource", "nvidia.com/gpu.shared"], "may all be slices of one GPU"),
    ([], "asks for GPUs: give --gpu TYPE too"),
])
def test_several_gpus_are_whole_gpus(
    tiny_embedder: Path, tmp_path: Path, flags: list[str], said: str
) -> None:
    result = runner.invoke(cli, ["build", "kubernetes", "--out", str(tmp_path / "x"),
                                 "--model-id", str(tiny_embedder), "--gpu-count", "2", *flags])
    assert result.exit_code != 0 and said in result.output, result.output
    assert not (tmp_path / "x").exists()
    zero = runner.invoke(cli, ["build", "kubernetes", "--out", str(tmp_path / "x"),
                               "--model-id", str(tiny_embedder), "--gpu", "L4", "--gpu-count", "0"])
    assert zero.exit_code != 0 and "greater than or equal to 1" in zero.output, zero.output


def test_unknown_gpus_and_bad_names_are_refused_before_anything_is_written(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    for flags, said in ((["--gpu", "RTX9090"], "unknown GPU"),
                        (["--name", "My_Server"], "not a Kubernetes name"),
                        (["--gpu-resource", "amd.com/gpu"], "not an NVIDIA device plugin resource"),
                        (["--min-replicas", "5", "--max-replicas", "2"], "exceeds")):
        result = runner.invoke(cli, ["build", "kubernetes", "--out", str(tmp_path / "x"),
                                     "--model-id", str(tiny_embedder), *flags])
        assert result.exit_code != 0 and said in result.output, result.output
    assert not (tmp_path / "x").exists()




# -- issue 52: first contact with a real cluster's platform --------------------------------------


def policy_peers(objects: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[str]]:
    """The NetworkPolicy's peers, and the namespaces they admit by name."""
    (rule,) = by_kind(objects)["NetworkPolicy"]["spec"]["ingress"]
    names = {p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
             for p in rule["from"] if "namespaceSelector" in p}
    return rule["from"], names


def test_scale_from_zero_wakes_behind_its_own_network_policy(built: dict) -> None:
    """--min-replicas 0 --network-policy: the policy admits KEDA's namespace (its HTTP add-on's
    interceptor is the only way in at zero), the namespace of the Prometheus --prometheus-url
    names (observability here, read from the service's DNS name: no hard-coded `monitoring`),
    each --ingress-from namespace, and the namespace's own pods; nothing else. Rendered by
    Kustomize and validated with the other variants above (kubernetes-validate, the KEDA and
    Prometheus operator models, the add-on's CRD schema)."""
    folder, objects = built["zero-network-policy"]
    rendered = kustomize(folder)
    assert sorted(rendered, key=key) == sorted(objects, key=key)
    peers, names = policy_peers(rendered)
    assert {"podSelector": {}} in peers and len(peers) == 1 + len(names)
    assert names == {"keda", "observability", "ingress-nginx", "gateway-system"}
    policy = by_kind(rendered)["NetworkPolicy"]
    replicas = by_kind(rendered)["Deployment"]["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == replicas
    (port,) = server_container(rendered)["ports"]
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": port["containerPort"]}]
    # The interceptor's route and the ScaledObject's trigger are there, the scaler in KEDA's namespace.
    route = by_kind(rendered)["InterceptorRoute"]
    assert route["spec"]["target"] == {"service": "infinity-cloud", "port": 80}
    triggers = by_kind(rendered)["ScaledObject"]["spec"]["triggers"]
    assert triggers[1]["metadata"]["scalerAddress"] == "keda-add-ons-http-external-scaler.keda:9090"
    assert triggers[0]["metadata"]["serverAddress"] == "http://kps-prometheus.observability.svc.cluster.local:9090"
    # Without scaling to zero KEDA's namespace is not admitted; Prometheus's, by default, is `monitoring`'s.
    _, hpa_names = policy_peers(built["hpa-network-policy"][1])
    assert hpa_names == {"monitoring"}


@pytest.mark.parametrize(("url", "namespace"), [
    ("http://prometheus-operated.monitoring.svc:9090", "monitoring"),
    ("http://kps-prometheus.observability.svc.cluster.local:9090", "observability"),
    ("http://prometheus.metrics.svc.corp.internal:9090/", "metrics"),
    ("http://prometheus.metrics:9090", "metrics"),
    ("http://10.0.0.7:9090", None),
    ("http://prometheus:9090", None),
    ("https://prometheus.example.com", None),
])
def test_the_prometheus_namespace_is_read_from_its_service_name(url: str, namespace: str | None) -> None:
    from infinity_cloud.targets.kubernetes.spec import prometheus_namespace

    assert prometheus_namespace(url) == namespace


def test_a_prometheus_whose_namespace_cannot_be_read_is_refused_not_guessed(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    """A NetworkPolicy that admits the wrong namespace starves the autoscaler silently: a URL
    that names no namespace is refused, asking for --prometheus-namespace, which then wins."""
    base = ["build", "kubernetes", "--model-id", str(tiny_embedder), "--network-policy",
            "--prometheus-url", "http://10.0.0.7:9090"]
    refused = runner.invoke(cli, [*base, "--out", str(tmp_path / "a")])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "give --prometheus-namespace NAMESPACE" in said, refused.output
    assert not (tmp_path / "a" / "base").exists()
    objects, _ = dry_run(tmp_path / "b", tiny_embedder, "--network-policy", "--prometheus-url",
                         "http://10.0.0.7:9090", "--prometheus-namespace", "telemetry")
    assert policy_peers(objects)[1] == {"telemetry"}


def test_the_service_monitor_carries_the_labels_prometheus_selects(built: dict) -> None:
    """--monitor-label: kube-prometheus-stack's Prometheus selects ServiceMonitors by
    `release: <its release name>` (prometheus-community/helm-charts,
    charts/kube-prometheus-stack/templates/prometheus/prometheus.yaml: with
    serviceMonitorSelectorNilUsesHelmValues, true by default, `serviceMonitorSelector:
    matchLabels: release: {{ $.Release.Name }}`); an unlabelled monitor is never scraped."""
    folder, objects = built["labelled-monitor"]
    rendered = kustomize(folder)
    assert sorted(rendered, key=key) == sorted(objects, key=key)
    monitor = by_kind(rendered)["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["metadata"]["labels"]["team"] == "search"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "infinity-cloud"  # delete finds it
    # It still selects the Service it scrapes, whose labels are the deployment's own.
    service = by_kind(rendered)["Service"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # Its PrometheusRule too: the chart's ruleSelector matches the release label the same way.
    assert by_kind(rendered)["PrometheusRule"]["metadata"]["labels"] == monitor["metadata"]["labels"]


@pytest.mark.parametrize("bad", ["release", "=kps", "release=k p s"])
def test_a_monitor_label_must_be_a_label(tiny_embedder: Path, tmp_path: Path, bad: str) -> None:
    result = runner.invoke(cli, ["build", "kubernetes", "--out", str(tmp_path / "o"), "--model-id",
                                 str(tiny_embedder), "--monitor-label", bad])
    assert result.exit_code == 2 and "is not KEY=VALUE" in " ".join(result.output.split()), result.output


def test_no_data_is_an_error_and_the_hpa_paces_the_scaling(built: dict) -> None:
    """KEDA's Prometheus scaler reads an empty result as 0 unless `ignoreNullValues` is "false"
    (keda.sh/docs/latest/scalers/prometheus: "Default is `true` ... Set to `false` the scaler
    will return error when Prometheus target is lost"): a fleet nobody scrapes must fail loudly,
    not sit at its minimum. KEDA's cooldownPeriod only governs 1 -> 0; the HPA's behavior paces
    every other step, so it is set explicitly, the same for KEDA's HPA and ours."""
    scaled = by_kind(built["cpu"][1])["ScaledObject"]["spec"]
    (trigger,) = scaled["triggers"]
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert all(p["periodSeconds"] > 0 and p["value"] > 0 for d in behavior.values() for p in d["policies"])
    hpa = by_kind(built["hpa-network-policy"][1])["HorizontalPodAutoscaler"]
    assert hpa["spec"]["behavior"] == behavior


def test_gpu_replicas_match_every_product_of_their_family(built: dict) -> None:
    """--gpu A100 lands on any A100 node, PCIe or SXM4, 40 or 80 GB: a required node affinity
    over every `nvidia.com/gpu.product` label GPU feature discovery gives that family (the
    NVML name with '-' for spaces), not one SKU's label in a nodeSelector."""
    from infinity_cloud.targets.kubernetes.spec import KubernetesSpec

    folder, objects = built["gpu-family-cuda12"]
    rendered = kustomize(folder)
    assert sorted(rendered, key=key) == sorted(objects, key=key)
    pod = by_kind(rendered)["Deployment"]["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = required["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == "nvidia.com/gpu.product" and expression["operator"] == "In"
    assert set(expression["values"]) == {"NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe",
                                         "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"}
    h100 = set(KubernetesSpec(gpu="H100").gpu_products)
    assert {"NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"} <= h100
    forty = {"NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"}
    assert set(KubernetesSpec(gpu="A100-40GB").gpu_products) == forty
    assert "Tesla-T4-SHARED" in KubernetesSpec(gpu="T4", gpu_resource="nvidia.com/gpu.shared").gpu_products
    # A product label given with --node-selector is the user's choice: no affinity beside it.
    pinned = KubernetesSpec(gpu="A100", node_selector=["nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB"])
    assert pinned.gpu_products == ()
    assert pinned.selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def test_the_cuda_build_picks_the_gpu_images_torch(built: dict, tiny_embedder: Path, tmp_path: Path) -> None:
    """--cuda 12 installs torch's cu126 wheels (NVIDIA driver 525 and newer, CUDA 12's minor
    version compatibility); the default, 13, the cu130 ones (driver 580 and newer), from
    PyTorch's index rather than whatever CUDA PyPI's torch was built for."""
    twelve = (built["gpu-family-cuda12"][0] / "image" / "Dockerfile").read_text()
    thirteen = (built["gpu-volume-keys-cache"][0] / "image" / "Dockerfile").read_text()
    assert "--index-url https://download.pytorch.org/whl/cu126" in twelve and "whl/cu130" not in twelve
    assert "--index-url https://download.pytorch.org/whl/cu130" in thirteen
    cpu = (built["cpu"][0] / "image" / "Dockerfile").read_text()
    assert "whl/cu1" not in cpu
    for flags, said in ((["--cuda", "12"], "give --gpu (or --gpu-resource)"),
                        (["--gpu", "B200", "--cuda", "12"], "use --cuda 13"),
                        (["--gpu", "L4", "--cuda", "11"], "kubernetes.cuda: Input should be '12' or '13'")):
        result = runner.invoke(cli, ["build", "kubernetes", "--out", str(tmp_path / "x"),
                                     "--model-id", str(tiny_embedder), *flags])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "x").exists()


def test_replicas_spread_over_nodes_and_zones_with_a_bounded_tmp(built: dict) -> None:
    """Replicas spread over nodes and zones as far as the cluster allows (ScheduleAnyway: a
    single-zone cluster still schedules them), take --priority-class, and their writable /tmp
    has a size limit, so a runaway cache evicts one replica rather than filling the node."""
    for name, (_, objects) in built.items():
        pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
        spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
        assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}, name
        for constraint in spread.values():
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway" and constraint["maxSkew"] == 1
            assert constraint["labelSelector"]["matchLabels"] == by_kind(objects)["Deployment"]["spec"][
                "selector"]["matchLabels"]
        tmp = {v["name"]: v for v in pod["volumes"]}["tmp"]
        size = "4Gi" if name == "gpu-family-cuda12" else "2Gi"
        assert tmp["emptyDir"] == {"sizeLimit": size}, name
        assert pod.get("priorityClassName") == ("inference-high" if name == "gpu-family-cuda12" else None)


def test_the_http_add_ons_route_matches_its_published_schema(built: dict) -> None:
    """The InterceptorRoute against the add-on's own CRD schema (vendored in tests/crd_schemas,
    with where it came from), as strictly as a server-side apply with fieldValidation=Strict:
    no unknown field anywhere, and the two CEL rules that apply to what we set."""
    import jsonschema

    schema = yaml.safe_load((Path(__file__).parent / "crd_schemas" /
                             "interceptorroutes.http.keda.sh-v1beta1.yaml").read_text())

    def strict(node: dict[str, Any]) -> dict[str, Any]:
        node = dict(node)
        if "properties" in node and node is not schema.get("properties", {}).get("metadata"):
            node["properties"] = {k: strict(v) for k, v in node["properties"].items()}
            node.setdefault("additionalProperties", False)
        if "items" in node:
            node["items"] = strict(node["items"])
        return node

    checker = jsonschema.Draft7Validator(strict(schema))

    def errors(route: dict[str, Any]) -> list[str]:
        found = [e.message for e in checker.iter_errors(route)]
        spec = route.get("spec", {})
        if ("port" in spec.get("target", {})) == ("portName" in spec.get("target", {})):
            found.append("exactly one of 'port' or 'portName' must be set")
        if not {"concurrency", "requestRate"} & set(spec.get("scalingMetric", {})):
            found.append("at least one of 'concurrency' or 'requestRate' must be set")
        return found

    routes = [o for _, objects in built.values() for o in objects if o["kind"] == "InterceptorRoute"]
    for folder, _ in built.values():  # every folder holds every component, chosen or not
        files = (folder / "components").glob("*/interceptorroute.yaml")
        routes += [yaml.safe_load(p.read_text()) for p in files]
    assert len(routes) > len(built)
    for route in routes:
        assert errors(route) == [], route
    broken = json.loads(json.dumps(routes[0]))
    broken["spec"]["target"]["portName"] = "http"  # both port and portName
    broken["spec"]["timeout"] = {}  # an unknown field
    assert len(errors(broken)) == 2


# -- the promises, against a real server process ----------------------------------------------


def test_a_replica_drains_as_the_manifests_promise(built: dict, tiny_embedder: Path, tmp_path: Path) -> None:
    """The server started with the Deployment's own environment and probed on its readiness
    path: while a slow batch runs, the liveness probe still answers within its timeout; on
    SIGTERM the readiness probe fails within one period, the request admitted before it is
    answered in full, and the process ends inside the grace period."""
    import signal
    import threading
    import time

    import httpx
    from conftest import FAKE, ROOT, free_port

    objects = built["gpu-volume-keys-cache"][1]
    server = server_container(objects)
    pod = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"model_id": str(tiny_embedder), "served_model_name": "slow", "backend": FAKE,
                    "backend_options": {"delay_s": 3.0}}],
        "server": {"url_prefix": "/api"},
    }))
    port = free_port()
    keep = {"INFINITY_CLOUD_DRAIN_S", "HF_HUB_OFFLINE"}  # the rest name files of the pod
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "infinity_cloud", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, **{k: v for k, v in env.items() if k in keep},
             "INFINITY_CLOUD_CONFIG": str(config)},
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    ready = f"{base}{server['readinessProbe']['httpGet']['path']}"
    live = f"{base}{server['livenessProbe']['httpGet']['path']}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(ready, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        answers: list[httpx.Response] = []
        call = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{base}/api/v1/embeddings", json={"model": "slow", "input": ["a", "b", "c"]}, timeout=60)))
        call.start()
        time.sleep(0.5)  # admitted: its batch runs for 3 s
        busy = httpx.get(live, timeout=server["livenessProbe"]["timeoutSeconds"])
        assert busy.status_code == 200, busy.text
        proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        failed_within = None
        while time.monotonic() - stopped_at < server["readinessProbe"]["periodSeconds"]:
            try:
                if httpx.get(ready, timeout=1).status_code == 503:
                    failed_within = time.monotonic() - stopped_at
                    break
            except httpx.TransportError:  # the listener closed: a probe fails the same way
                failed_within = time.monotonic() - stopped_at
                break
            time.sleep(0.1)
        assert failed_within is not None, "still ready a probe period after SIGTERM"
        call.join(60)
        (answer,) = answers
        assert answer.status_code == 200 and len(answer.json()["data"]) == 3, answer.text
        code = proc.wait(pod["terminationGracePeriodSeconds"])
        assert code in (0, -signal.SIGTERM), (tmp_path / "serve.log").read_text()
        assert time.monotonic() - stopped_at < pod["terminationGracePeriodSeconds"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
