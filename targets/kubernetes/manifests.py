"""The Kubernetes objects of a deployment, as plain dicts, from the spec: the base every
deployment has (ServiceAccount, ConfigMap with the served spec, Deployment, Service,
PodDisruptionBudget, and the weights' claim) and the optional parts (autoscaler,
ServiceMonitor and its PrometheusRule, NetworkPolicy), each a Kustomize component in the
rendered folder.

The probes and the drain follow the server: `/health` is 503 while a model loads and when a
worker died; on SIGTERM the server stops taking connections (a probe then fails at once)
and answers what it admitted for `drain_s`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.targets.kubernetes import alerts
from infinity_cloud.targets.kubernetes.spec import PRODUCT_LABEL, KubernetesSpec
from infinity_cloud.targets.local.target import IMAGE_HF_HOME, WEIGHTS_DIR

# The server's own metric (server/metrics.py) that the autoscalers divide by a replica's
# share: tokens waiting for a batch, per model, summed over the replica's models.
SCALE_METRIC = "infinity_cloud_queued_tokens"
# KEDA's HTTP add-on (0.14+, https://keda.sh/http-add-on/): its external scaler, which wakes a
# deployment scaled to zero when its interceptor holds a request for it, and that interceptor.
# Both in KEDA's namespace (--keda-namespace).
HTTP_ADDON_SCALER = "keda-add-ons-http-external-scaler.{namespace}:9090"
HTTP_ADDON_PROXY = "keda-add-ons-http-interceptor-proxy.{namespace}:8080"
# In-flight requests per replica the add-on's own metric aims for (the queued-tokens trigger
# does the scaling once a replica runs; this one only has to be met from zero).
ZERO_CONCURRENCY = 100
MANAGED_BY = "infinity-cloud"
# Where the served spec and the secrets are mounted in the container.
CONFIG_DIR = "/etc/infinity-cloud"
SPEC_KEY = "infinity-cloud.yaml"
SECRETS_DIR = "/var/run/secrets/infinity-cloud"
# An unprivileged uid the image's files are readable by (the image sets it as its USER).
RUN_AS = 10001
# Seconds between a pod's removal from the Service and its SIGTERM: endpoints controllers
# and proxies on every node take a moment to stop sending it new connections.
PRESTOP_S = 5
PROBE_PERIOD_S = 5
# The one writable folder of the container (an emptyDir): what OpenVINO compiles for this
# CPU where the exports are read-only, and Python's temporary files.
TEMP_DIR = "/tmp"
# The label of a node's name and of its zone (well-known labels): replicas spread over both.
SPREAD_OVER = ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
# With --weights volume, the weights Job writes this file last, per served spec: replicas
# wait for it, so none reads a half-written volume and none writes it.
WEIGHTS_READY = ".infinity-cloud-weights-ready-{digest}"


def labels(settings: KubernetesSpec) -> dict[str, str]:
    """The labels every object carries: `delete` removes exactly what has them."""
    return {
        "app.kubernetes.io/name": "infinity-cloud",
        "app.kubernetes.io/instance": settings.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector(settings: KubernetesSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "infinity-cloud", "app.kubernetes.io/instance": settings.name}


def _meta(settings: KubernetesSpec, name: str | None = None) -> dict[str, Any]:
    return {"name": name or settings.name, "namespace": settings.namespace, "labels": labels(settings)}


def spec_digest(served_spec: str) -> str:
    return hashlib.sha256(served_spec.encode()).hexdigest()[:16]


def default_target_tokens(spec: DeploymentSpec, settings: KubernetesSpec) -> int:
    """Queued tokens a replica should hold before another is started: two batches of the
    first model for each of its GPUs (each an engine replica batching at once), which it
    clears within two batch times."""
    return 2 * spec.models[0].batch_tokens * settings.gpu_count


def base_objects(spec: DeploymentSpec, settings: KubernetesSpec, served_spec: str) -> list[dict[str, Any]]:
    """What every deployment has. `served_spec`: the YAML the server reads (no keys in it)."""
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(settings),
         "automountServiceAccountToken": False},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(settings, f"{settings.name}-spec"),
         "data": {SPEC_KEY: served_spec}},
        deployment(spec, settings, served_spec),
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(settings),
         "spec": {"type": "ClusterIP", "selector": selector(settings),
                  "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}},
        # One replica down at a time (a node drain, an upgrade); minAvailable would block a
        # drain for ever where only one replica runs.
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(settings),
         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(settings)}}},
    ]
    if settings.weights == "volume":
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": settings.volume_size}},
        }
        if settings.storage_class:
            claim["storageClassName"] = settings.storage_class
        objects.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": _meta(settings, f"{settings.name}-weights"), "spec": claim})
        objects.append(weights_job(settings, served_spec))
    return objects


def grace_period_s(settings: KubernetesSpec) -> int:
    """Longer than the preStop pause and the server's drain together, so Kubernetes' SIGKILL
    never cuts an admitted request short."""
    return PRESTOP_S + settings.drain_s + 10


def _env(spec: DeploymentSpec, settings: KubernetesSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "INFINITY_CLOUD_CONFIG", "value": f"{CONFIG_DIR}/{SPEC_KEY}"},
        {"name": "INFINITY_CLOUD_DRAIN_S", "value": str(settings.drain_s)},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "TMPDIR", "value": TEMP_DIR},
    ]
    if settings.api_key_secret:
        env.append({"name": "INFINITY_CLOUD_API_KEY_FILE", "value": f"{SECRETS_DIR}/api/api-keys"})
    if settings.admin_key_secret:
        env.append({"name": "INFINITY_CLOUD_ADMIN_KEY_FILE", "value": f"{SECRETS_DIR}/admin/admin-keys"})
    if settings.weights == "oci":  # the weights image's hub cache and exports (image/Dockerfile)
        env += [{"name": "HF_HOME", "value": f"{WEIGHTS_DIR}/hub"},
                {"name": "INFINITY_CLOUD_CACHE", "value": f"{WEIGHTS_DIR}/exports"}]
    if settings.cache_url_secret:
        env.append({"name": "INFINITY_CLOUD_CACHE_URL", "valueFrom": {
            "secretKeyRef": {"name": settings.cache_url_secret, "key": "url"}}})
    return env


def _volumes(settings: KubernetesSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the server's mounts: the spec, a writable temporary folder
    (the root filesystem is read-only), the secrets as files, the weights."""
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": f"{settings.name}-spec"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TEMP_DIR},
    ]
    for secret, name in ((settings.api_key_secret, "api"), (settings.admin_key_secret, "admin")):
        if secret:
            volumes.append({"name": f"{name}-keys", "secret": {"secretName": secret}})
            mounts.append({"name": f"{name}-keys", "mountPath": f"{SECRETS_DIR}/{name}", "readOnly": True})
    if settings.weights == "volume":
        claim = {"claimName": f"{settings.name}-weights", "readOnly": True}
        volumes.append({"name": "weights", "persistentVolumeClaim": claim})
        mounts.append({"name": "weights", "mountPath": IMAGE_HF_HOME, "readOnly": True})
    elif settings.weights == "oci":  # the kubelet pulls it as it pulls the server's image
        volumes.append({"name": "weights", "image": {"reference": settings.weights_image,
                                                     "pullPolicy": "IfNotPresent"}})
        mounts.append({"name": "weights", "mountPath": WEIGHTS_DIR, "readOnly": True})
    return volumes, mounts


def _security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def _probe(path: str, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": timeout}


def deployment(spec: DeploymentSpec, settings: KubernetesSpec, served_spec: str) -> dict[str, Any]:
    health = f"{spec.server.url_prefix}/health"
    volumes, mounts = _volumes(settings)
    memory = f"{settings.memory_mib}Mi"
    resources: dict[str, Any] = {"requests": {"cpu": _cores(settings.cpu), "memory": memory},
                                 "limits": {"memory": memory}}
    if settings.device == "cuda":  # the server serves on every GPU the device plugin hands it
        resources["requests"][settings.gpu_resource] = settings.gpu_count
        resources["limits"][settings.gpu_resource] = settings.gpu_count
    server: dict[str, Any] = {
        "name": "server",
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": spec.server.port, "protocol": "TCP"}],
        "env": _env(spec, settings),
        "resources": resources,
        "securityContext": _security(),
        "volumeMounts": mounts,
        # The load: the export is in the image (or volume), or built here at the first start.
        "startupProbe": _probe(health, PROBE_PERIOD_S, -(-settings.startup_limit_s // PROBE_PERIOD_S)),
        # Out of the Service as soon as it is unwell; a refused connection (a drain) fails it too.
        "readinessProbe": _probe(health, PROBE_PERIOD_S, 1),
        # /health answers from the event loop, never behind the batches: a busy replica
        # passes; one whose worker died (503) is restarted after a minute.
        "livenessProbe": _probe(health, 10, 6, timeout=5),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_S)]}}},
    }
    digest = spec_digest(served_spec)
    pod: dict[str, Any] = {
        **_pod_identity(settings),
        "terminationGracePeriodSeconds": grace_period_s(settings),
        "containers": [server],
        "volumes": volumes,
    }
    if settings.weights == "volume":
        pod["initContainers"] = [_wait_for_weights(settings, digest)]
    _place(settings, pod)
    body: dict[str, Any] = {
        "selector": {"matchLabels": selector(settings)},
        "revisionHistoryLimit": 3,
        # A new replica is ready before an old one stops: no capacity lost while rolling.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            # A changed spec (the ConfigMap) rolls the replicas.
            "metadata": {"labels": labels(settings), "annotations": {"infinity-cloud/spec-sha256": digest}},
            "spec": pod,
        },
    }
    if settings.autoscaler == "none":  # else the autoscaler owns the count, and an apply must not reset it
        body["replicas"] = settings.min_replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(settings), "spec": body}


def _pod_identity(settings: KubernetesSpec) -> dict[str, Any]:
    """Who a pod of ours runs as: its service account without a token, the restricted
    profile's non-root user and seccomp."""
    return {
        "serviceAccountName": settings.name,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                            "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
    }


def _place(settings: KubernetesSpec, pod: dict[str, Any]) -> None:
    """Where a replica runs: the --node-selector labels; on a node of the GPU family (any of
    its product labels); spread over nodes and zones, as far as they allow (a replica is never
    left Pending for the spread); at the --priority-class."""
    if settings.selector:
        pod["nodeSelector"] = settings.selector
    if settings.gpu_products:
        term = {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In",
                                      "values": list(settings.gpu_products)}]}
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}}
    if settings.device == "cuda":  # GPU nodes are commonly tainted so that only GPU work lands there
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # pod-template-hash: the spread counts the replicas of one revision, so a rollout's new
    # replicas spread among themselves rather than around the old ones.
    pod["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": selector(settings)}, "matchLabelKeys": ["pod-template-hash"]}
        for key in SPREAD_OVER
    ]
    if settings.priority_class:
        pod["priorityClassName"] = settings.priority_class


def weights_job_name(settings: KubernetesSpec, served_spec: str) -> str:
    """One Job per served spec (a Job's pod template cannot be changed once applied); at most
    63 characters, as a Job's name must be."""
    return f"{settings.name[:42]}-weights-{spec_digest(served_spec)[:10]}"


def weights_job(settings: KubernetesSpec, served_spec: str) -> dict[str, Any]:
    """With --weights volume: the one writer of the shared claim. It fetches the hub models
    (and, on CPU, builds their exports) and then marks them complete for this spec; replicas
    mount the claim read-only and wait for the mark (`_wait_for_weights`), so however many
    start at once, the volume is written once."""
    digest = spec_digest(served_spec)
    command = "python -m infinity_cloud download"
    if settings.device == "cuda":  # the GPU's precision check needs the GPU: at the server's start
        command += " --files-only"
    fetch = {
        "name": "fetch-weights",
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", f"{command} && touch {IMAGE_HF_HOME}/{WEIGHTS_READY.format(digest=digest)}"],
        "env": [{"name": "INFINITY_CLOUD_CONFIG", "value": f"{CONFIG_DIR}/{SPEC_KEY}"},
                {"name": "HF_HUB_OFFLINE", "value": "0"}, {"name": "TMPDIR", "value": TEMP_DIR}],
        "resources": {"requests": {"cpu": _cores(settings.cpu), "memory": f"{settings.memory_mib}Mi"},
                      "limits": {"memory": f"{settings.memory_mib}Mi"}},
        "securityContext": _security(),
        "volumeMounts": [{"name": "spec", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": TEMP_DIR},
                         {"name": "weights", "mountPath": IMAGE_HF_HOME}],
    }
    pod: dict[str, Any] = {
        **_pod_identity(settings),
        "restartPolicy": "OnFailure",
        "containers": [fetch],
        "volumes": [{"name": "spec", "configMap": {"name": f"{settings.name}-spec"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size}},
                    {"name": "weights", "persistentVolumeClaim": {"claimName": f"{settings.name}-weights"}}],
    }
    # On a CPU, the replicas' node pool: the exports are built there. On a GPU it fetches files
    # only, on any node: the GPU pool's taint would keep a pod that asks for no GPU out.
    if settings.selector and settings.device != "cuda":
        pod["nodeSelector"] = settings.selector
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _meta(settings, weights_job_name(settings, served_spec)),
        # Its pod's labels are not the replicas' (no Service, PDB or spread counts it).
        "spec": {"backoffLimit": 4, "template": {"metadata": {"labels": {
            **labels(settings), "app.kubernetes.io/name": "infinity-cloud-weights"}}, "spec": pod}},
    }


def _wait_for_weights(settings: KubernetesSpec, digest: str) -> dict[str, Any]:
    """A replica's init container: it waits, reading nothing, until the weights Job has marked
    the volume complete for this spec (seconds when it already has)."""
    ready = f"{IMAGE_HF_HOME}/{WEIGHTS_READY.format(digest=digest)}"
    return {
        "name": "wait-for-weights",
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", f"until [ -e {ready} ]; do echo waiting for the weights Job to finish; "
                                "sleep 5; done"],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
        "securityContext": _security(),
        "volumeMounts": [{"name": "weights", "mountPath": IMAGE_HF_HOME, "readOnly": True}],
    }


def _cores(cpu: float) -> str:
    return str(int(cpu)) if float(cpu).is_integer() else f"{int(cpu * 1000)}m"


def scale_query(settings: KubernetesSpec) -> str:
    """The PromQL the KEDA trigger asks: tokens queued over every replica of this deployment
    (Prometheus' `namespace` and `service` labels come from the ServiceMonitor's scrape)."""
    return f'sum({SCALE_METRIC}{{namespace="{settings.namespace}",service="{settings.name}"}})'


def autoscaler(spec: DeploymentSpec, settings: KubernetesSpec, kind: str) -> dict[str, Any]:
    """The autoscaler `kind` (keda, hpa, hpa-cpu) for this deployment."""
    target = settings.target_queued_tokens or default_target_tokens(spec, settings)
    scaled = {"apiVersion": "apps/v1", "kind": "Deployment", "name": settings.name}
    if kind == "keda":
        return {
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": _meta(settings),
            "spec": {
                "scaleTargetRef": {"name": settings.name},
                "minReplicaCount": settings.min_replicas,
                "maxReplicaCount": settings.max_replicas,
                "pollingInterval": 15,
                # How long idle before scaling 1 -> 0 (with --min-replicas 0) and nothing else:
                # the HPA's behavior below paces every other step.
                "cooldownPeriod": 300,
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": scaling_behavior()}},
                # desired = ceil(query / threshold): each replica holds about `threshold` tokens.
                "triggers": [{"type": "prometheus", "metadata": {
                    "serverAddress": settings.prometheus_url,
                    "query": scale_query(settings),
                    "threshold": str(target),
                    # No series (nothing scrapes the replicas) is an error on the ScaledObject
                    # and its HPA, not a 0 that keeps the fleet at its minimum unnoticed.
                    "ignoreNullValues": "false",
                }}, *_from_zero(settings)],
            },
        }
    behavior = scaling_behavior()
    if kind == "hpa":  # prometheus-adapter serves the metric per pod (docs/targets/kubernetes.md)
        metric = {"type": "Pods", "pods": {"metric": {"name": SCALE_METRIC},
                                           "target": {"type": "AverageValue", "averageValue": str(target)}}}
    else:
        utilization = {"type": "Utilization", "averageUtilization": 70}
        metric = {"type": "Resource", "resource": {"name": "cpu", "target": utilization}}
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _meta(settings),
        "spec": {"scaleTargetRef": scaled, "minReplicas": max(1, settings.min_replicas),
                 "maxReplicas": settings.max_replicas, "metrics": [metric], "behavior": behavior},
    }


def scaling_behavior() -> dict[str, Any]:
    """The HPA's pacing (KEDA's HPA or ours), explicit rather than the defaults: up at once, by
    up to double or 4 replicas per 15 s; down only to the highest count wanted over the last
    5 minutes, by at most half per minute, so a queue that drains between bursts does not
    shrink the fleet the next burst needs."""
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15},
            {"type": "Pods", "value": 4, "periodSeconds": 15}]},
        "scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Max", "policies": [
            {"type": "Percent", "value": 50, "periodSeconds": 60}]},
    }


def _from_zero(settings: KubernetesSpec) -> list[dict[str, Any]]:
    """At zero replicas no server queues anything, so the queued-tokens query cannot wake the
    fleet: the HTTP add-on's scaler does, from the requests its interceptor holds."""
    if settings.min_replicas != 0:
        return []
    scaler = HTTP_ADDON_SCALER.format(namespace=settings.keda_namespace)
    return [{"type": "external-push", "metadata": {"scalerAddress": scaler,
                                                   "interceptorRoute": settings.name}}]


def interceptor_route(settings: KubernetesSpec) -> dict[str, Any]:
    """KEDA HTTP add-on's route (http.keda.sh/v1beta1, its InterceptorRoute reference): the
    hosts it sends to the Service, and how long it holds a request while a replica starts
    (the model's load: the startup probe's allowance)."""
    return {
        "apiVersion": "http.keda.sh/v1beta1", "kind": "InterceptorRoute", "metadata": _meta(settings),
        "spec": {
            "target": {"service": settings.name, "port": 80},
            "rules": [{"hosts": list(settings.routed_hosts)}],
            "scalingMetric": {"concurrency": {"targetValue": ZERO_CONCURRENCY}},
            "timeouts": {"readiness": f"{settings.startup_limit_s}s"},
        },
    }


def monitoring_meta(settings: KubernetesSpec) -> dict[str, Any]:
    """The metadata of the objects the Prometheus operator selects (the ServiceMonitor, the
    PrometheusRule): with --monitor-label's labels, which its serviceMonitorSelector and
    ruleSelector match (kube-prometheus-stack: its release)."""
    meta = _meta(settings)
    meta["labels"] = {**meta["labels"], **settings.monitor_label_pairs}
    return meta


def service_monitor(spec: DeploymentSpec, settings: KubernetesSpec) -> dict[str, Any]:
    path = f"{spec.server.url_prefix}/metrics"
    endpoint: dict[str, Any] = {"port": "http", "path": path, "interval": "15s"}
    if settings.api_key_secret:  # /metrics asks for a key like every other route
        endpoint["authorization"] = {"type": "Bearer",
                                     "credentials": {"name": settings.api_key_secret, "key": "metrics-key"}}
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": monitoring_meta(settings),
        "spec": {"selector": {"matchLabels": selector(settings)}, "endpoints": [endpoint],
                 "namespaceSelector": {"matchNames": [settings.namespace]}},
    }


def admitted_namespaces(settings: KubernetesSpec) -> list[str]:
    """The namespaces besides its own whose pods reach the server: the Prometheus that scrapes
    it (--prometheus-url's, or --prometheus-namespace), KEDA's, whose HTTP add-on interceptor is
    the only way in at zero replicas, and each --ingress-from."""
    wanted = [settings.scrape_namespace] if settings.scraped else []
    if settings.min_replicas == 0:
        wanted.append(settings.keda_namespace)
    wanted += settings.ingress_from
    found: list[str] = []
    for namespace in wanted:  # None: a Prometheus outside the cluster (refused when the policy is chosen)
        if namespace and namespace != settings.namespace and namespace not in found:
            found.append(namespace)
    return found


def network_policy(spec: DeploymentSpec, settings: KubernetesSpec) -> dict[str, Any]:
    """Only the namespace's own pods and those of `admitted_namespaces` reach the port (by
    the namespace's own name label, which the API server sets)."""
    peers: list[dict[str, Any]] = [{"podSelector": {}}]
    peers += [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
              for namespace in admitted_namespaces(settings)]
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(settings),
        "spec": {
            "podSelector": {"matchLabels": selector(settings)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": spec.server.port}]}],
        },
    }


def components(spec: DeploymentSpec, settings: KubernetesSpec) -> dict[str, dict[str, Any]]:
    """Every optional part by its component's name, chosen or not (the rendered folder holds
    them all, so a user switches one on by a line)."""
    return {
        "keda": autoscaler(spec, settings, "keda"),
        "hpa": autoscaler(spec, settings, "hpa"),
        "hpa-cpu": autoscaler(spec, settings, "hpa-cpu"),
        "service-monitor": service_monitor(spec, settings),
        # What the monitor's series alert on (targets/kubernetes/alerts.py).
        "alerts": alerts.prometheus_rule(
            settings, settings.target_queued_tokens or default_target_tokens(spec, settings),
            monitoring_meta(settings),
        ),
        "network-policy": network_policy(spec, settings),
        "scale-from-zero": interceptor_route(settings),
    }


# The kind of each component's object.
COMPONENT_KINDS = {
    "keda": "ScaledObject", "hpa": "HorizontalPodAutoscaler", "hpa-cpu": "HorizontalPodAutoscaler",
    "service-monitor": "ServiceMonitor", "alerts": "PrometheusRule", "network-policy": "NetworkPolicy",
    "scale-from-zero": "InterceptorRoute",
}


def chosen_components(settings: KubernetesSpec) -> list[str]:
    chosen = [settings.autoscaler] if settings.autoscaler != "none" else []
    if settings.service_monitor:
        chosen.append("service-monitor")
        chosen.append("alerts")
    if settings.network_policy:
        chosen.append("network-policy")
    if settings.min_replicas == 0:  # its route before the ScaledObject that names it (the add-on's docs)
        chosen.insert(0, "scale-from-zero")
    return chosen

