"""The Kubernetes target: `build kubernetes` renders a Kustomize folder (a base, a component
per optional part, and the server's image), `deploy` applies the same objects with the
user's kubectl (server-side apply) and waits for the rollout, `status`, `invoke`, `delete`
and `smoke` work on what it applied, found by its labels."""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.targets import container
from infinity_cloud.targets.base import CLIENT_KEY_ENV, Deployment, Endpoint, Target, TargetError
from infinity_cloud.targets.kubernetes import kubectl, manifests
from infinity_cloud.targets.kubernetes.spec import KubernetesSpec
from infinity_cloud.targets.local.target import SPEC_FILE, server_image

BASE_IMAGE = "python:3.11-slim"
IMAGE_DIR = "image"
# Where each kind is written in the base, and the API group a kind is deleted by.
_FILE_OF = {
    "ServiceAccount": "serviceaccount.yaml", "ConfigMap": "configmap.yaml", "Deployment": "deployment.yaml",
    "Service": "service.yaml", "PodDisruptionBudget": "poddisruptionbudget.yaml",
    "PersistentVolumeClaim": "persistentvolumeclaim.yaml", "Job": "job.yaml",
}
_PLURAL = {
    "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps", "Deployment": "deployments.apps",
    "Service": "services", "PodDisruptionBudget": "poddisruptionbudgets.policy",
    "PersistentVolumeClaim": "persistentvolumeclaims", "Job": "jobs.batch",
    "ScaledObject": "scaledobjects.keda.sh",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers.autoscaling",
    "ServiceMonitor": "servicemonitors.monitoring.coreos.com",
    "PrometheusRule": "prometheusrules.monitoring.coreos.com",
    "NetworkPolicy": "networkpolicies.networking.k8s.io",
    "InterceptorRoute": "interceptorroutes.http.keda.sh",
}
# The custom resources a component needs the cluster to know, and what installs them.
_NEEDS = {
    "ScaledObject": ("keda.sh", "KEDA (https://keda.sh/docs/deploy/)", "--autoscaler hpa-cpu or none"),
    "ServiceMonitor": ("monitoring.coreos.com", "the Prometheus operator (kube-prometheus-stack)",
                       "--no-service-monitor"),
    "InterceptorRoute": ("http.keda.sh", "KEDA's HTTP add-on, 0.14 or newer (https://keda.sh/http-add-on/)",
                         "--min-replicas 1"),
}
_FORWARDED = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+)")


def yaml_stream(objects: list[dict[str, Any]]) -> str:
    import yaml

    return "".join(f"---\n{yaml.safe_dump(o, sort_keys=False)}" for o in objects)


class KubernetesTarget(Target[KubernetesSpec]):
    name = "kubernetes"
    spec_class = KubernetesSpec
    verbs = ("build", "deploy", "invoke", "status", "delete", "smoke")
    planner = "infinity_cloud.targets.kubernetes.plan:PLANNER"

    def describe(self, spec: DeploymentSpec) -> str:
        settings = self.settings(spec)
        return f"Kubernetes deployment {settings.namespace}/{settings.name}"

    # -- build ---------------------------------------------------------------------------

    def objects(self, spec: DeploymentSpec, served_spec: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The base's objects, and every component's object by name."""
        settings = self.settings(spec)
        return manifests.base_objects(spec, settings, served_spec), manifests.components(spec, settings)

    def applied(self, spec: DeploymentSpec, out_dir: Path) -> list[dict[str, Any]]:
        """What `deploy` applies from a built folder: the base and the chosen components."""
        settings = self.settings(spec)
        base, parts = self.objects(spec, (Path(out_dir) / IMAGE_DIR / SPEC_FILE).read_text(encoding="utf-8"))
        return [*base, *(parts[name] for name in manifests.chosen_components(settings))]

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """image/ (the server's image, as `build local` makes it, run as an unprivileged user),
        base/ (the objects every deployment has), components/ (each optional part), and a
        kustomization.yaml that takes the base and the chosen components."""
        import yaml

        settings = self.settings(spec)
        _refuse_secrets_in_spec(spec)
        out_dir = Path(out_dir)
        written = server_image(
            spec, out_dir / IMAGE_DIR, BASE_IMAGE, settings.device == "cuda",
            bake_models=settings.weights == "image", user=manifests.RUN_AS, rendered_by=self.name,
            weights_image=settings.weights == "oci", extra=_torch_build(settings),
        )
        base, parts = self.objects(spec, (out_dir / IMAGE_DIR / SPEC_FILE).read_text(encoding="utf-8"))

        def write(path: Path, data: Any) -> Path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False),
                            encoding="utf-8")
            written.append(path)
            return path

        files = [write(out_dir / "base" / _FILE_OF[o["kind"]], o).name for o in base]
        write(out_dir / "base" / "kustomization.yaml", {
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": files,
        })
        for name, part in parts.items():
            file = f"{part['kind'].lower()}.yaml"
            write(out_dir / "components" / name / file, part)
            write(out_dir / "components" / name / "kustomization.yaml", {
                "apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component", "resources": [file],
            })
        chosen = manifests.chosen_components(settings)
        header = (f"# Rendered by `infinity-cloud build kubernetes`. Apply: kubectl apply --server-side -k "
                  f"{out_dir}\n# Optional parts: {', '.join(parts)} (components/); list the ones wanted "
                  "below.\n")
        top: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": ["base"],
        }
        if chosen:
            top["components"] = [f"components/{name}" for name in chosen]
        write(out_dir / "kustomization.yaml", header + yaml.safe_dump(top, sort_keys=False))
        return written

    # -- deploy and the rest ----------------------------------------------------------------

    def deploy(self, spec: DeploymentSpec, out_dir: Path, *, dry_run: bool = False) -> Deployment | None:
        """Build, check the cluster knows every kind, apply (server-side), wait for the rollout."""
        settings = self.settings(spec)
        self.build(spec, out_dir)
        objects = self.applied(spec, out_dir)
        apply = kubectl.command(settings, "apply", "--server-side", "--field-manager", kubectl.FIELD_MANAGER,
                                "-f", "-")
        wait = self._rollout(settings)
        if dry_run:
            sys.stdout.write(yaml_stream(objects))
            for argv in (apply, wait):
                print(f"would run: {kubectl.shown(argv)}", file=sys.stderr)
            return None
        self._check_kinds(settings, objects)
        kubectl.run(apply, stdin=yaml_stream(objects))
        kubectl.run(wait, timeout=settings.startup_limit_s + 120)
        inside = f"http://{settings.name}.{settings.namespace}.svc.cluster.local{spec.server.url_prefix}"
        notes = [f"the Service answers inside the cluster; from here: kubectl port-forward -n "
                 f"{settings.namespace} service/{settings.name} 8080:80, then http://127.0.0.1:8080"
                 f"{spec.server.url_prefix}"]
        if settings.min_replicas == 0:  # only what goes through the interceptor wakes it
            notes.append(f"it scales to zero when idle: call it through KEDA's interceptor, "
                         f"http://{manifests.HTTP_ADDON_PROXY.format(namespace=settings.keda_namespace)}"
                         f"{spec.server.url_prefix} with the header "
                         f"'Host: {settings.routed_hosts[0]}' (or route your Ingress there); a call straight "
                         "to the Service finds no replica while it is at zero")
        if settings.service_monitor and settings.autoscaler != "none":
            notes.append(f"check that Prometheus scrapes it (an empty result: it does not, and the "
                         f"autoscaler reports its query as failing): {scrape_check(settings)}")
        return Deployment(self.name, settings.name, inside, api_key=settings.api_key_secret is not None,
                          notes=tuple(notes))

    @staticmethod
    def _rollout(settings: KubernetesSpec) -> list[str]:
        return kubectl.command(settings, "rollout", "status", f"deployment/{settings.name}",
                               f"--timeout={settings.startup_limit_s + 60}s")

    @staticmethod
    def _check_kinds(settings: KubernetesSpec, objects: list[dict[str, Any]]) -> None:
        """A custom kind the cluster lacks is said before anything is applied, with its fix."""
        for kind, (group, installer, instead) in _NEEDS.items():
            if not any(o["kind"] == kind for o in objects):
                continue
            asked = kubectl.command(settings, "api-resources", "--api-group", group, "-o", "name")
            known = kubectl.run(asked)
            if not known.strip():
                raise TargetError(f"this cluster has no {kind} ({group}): install {installer}, or deploy "
                                  f"with {instead}")

    def _kinds(self, settings: KubernetesSpec) -> list[str]:
        volume = ("PersistentVolumeClaim", "Job")  # the weights' claim and its writer
        kinds = [_PLURAL[k] for k in _FILE_OF if k not in volume or settings.weights == "volume"]
        chosen = manifests.chosen_components(settings)
        kinds += [_PLURAL[manifests.COMPONENT_KINDS[name]] for name in chosen]
        return kinds

    def _selector(self, settings: KubernetesSpec) -> str:
        return ",".join(f"{k}={v}" for k, v in manifests.labels(settings).items())

    def exists(self, spec: DeploymentSpec) -> bool:
        settings = self.settings(spec)
        found = kubectl.run(kubectl.command(settings, "get", "deployments.apps", settings.name,
                                            "--ignore-not-found", "-o", "name"))
        return bool(found.strip())

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        """Replicas (wanted, up to date, ready), each pod's state, the autoscaler's view."""
        settings = self.settings(spec)
        deployment = kubectl.get_json(kubectl.command(settings, "get", "deployments.apps", settings.name,
                                                      "-o", "json"))
        state = deployment.get("status", {})
        facts: dict[str, Any] = {
            "deployment": f"{settings.namespace}/{settings.name}",
            "replicas": f"{state.get('readyReplicas', 0)} ready, {state.get('updatedReplicas', 0)} up to "
                        f"date, {deployment.get('spec', {}).get('replicas', 0)} wanted",
        }
        pods = kubectl.get_json(kubectl.command(settings, "get", "pods", "-l", self._selector(settings),
                                                "-o", "json"))
        for pod in pods.get("items", []):
            statuses = pod.get("status", {}).get("containerStatuses", [])
            ready = all(s.get("ready") for s in statuses) and bool(statuses)
            restarts = sum(s.get("restartCount", 0) for s in statuses)
            facts[f"pod {pod['metadata']['name']}"] = (
                f"{pod.get('status', {}).get('phase', '?')}, {'ready' if ready else 'not ready'}, "
                f"{restarts} restarts"
            )
        if settings.autoscaler != "none":
            kind = "horizontalpodautoscalers.autoscaling"
            name = f"keda-hpa-{settings.name}" if settings.autoscaler == "keda" else settings.name
            hpa = kubectl.get_json(kubectl.command(settings, "get", kind, name, "-o", "json"))
            seen = hpa.get("status", {})
            facts["autoscaler"] = (f"{settings.autoscaler}: {seen.get('currentReplicas', '?')} running, "
                                   f"{seen.get('desiredReplicas', '?')} wanted, between "
                                   f"{hpa.get('spec', {}).get('minReplicas', '?')} and "
                                   f"{hpa.get('spec', {}).get('maxReplicas', '?')}")
        return facts

    def delete(self, spec: DeploymentSpec) -> None:
        """Remove what deploy made, found by its labels (the weights' claim too)."""
        settings = self.settings(spec)
        kubectl.run(kubectl.command(settings, "delete", ",".join(self._kinds(settings)),
                                    "-l", self._selector(settings), "--ignore-not-found", "--wait=false"))

    def endpoint(self, spec: DeploymentSpec, api_key: str | None) -> Endpoint:
        """The Service through `kubectl port-forward` on a free local port, for this process."""
        settings = self.settings(spec)
        argv = kubectl.command(settings, "port-forward", f"service/{settings.name}", ":80")
        forward = subprocess.Popen([kubectl.program(), *argv[1:]], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        atexit.register(forward.terminate)
        first = forward.stdout.readline() if forward.stdout else ""
        port = _FORWARDED.search(first)
        if port is None:
            forward.terminate()
            raise TargetError(f"`{kubectl.shown(argv)}` failed: {first.strip() or 'no answer'}")
        key = api_key or os.environ.get(CLIENT_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return Endpoint(f"http://127.0.0.1:{port.group(1)}{spec.server.url_prefix}", headers)


def _torch_build(settings: KubernetesSpec) -> dict[str, Any]:
    """A GPU image's torch from PyTorch's index for the chosen CUDA build (--cuda), which must
    publish one for the torch release the image pins."""
    if settings.device != "cuda":
        return {}
    release = ".".join(container.torch_version().split(".")[:2])
    builds = container.TORCH_CUDA_BUILDS.get(release)
    if builds is not None and settings.torch_cuda not in builds:
        raise ConfigError(f"PyTorch publishes no {settings.torch_cuda} build of torch {release} (only "
                          f"{', '.join(builds)}): choose another --cuda")
    return {"torch_index": container.TORCH_INDEX.format(build=settings.torch_cuda)}


def scrape_check(settings: KubernetesSpec) -> str:
    """One command that asks the Prometheus the autoscaler queries for the series it reads,
    from a throwaway pod in the deployment's namespace: a count, or an empty result."""
    series = f'{{namespace="{settings.namespace}",service="{settings.name}"}}'
    query = f"count({manifests.SCALE_METRIC}{series})"
    return (f"kubectl -n {settings.namespace} run scrape-check --rm -i --restart=Never "
            f"--image=curlimages/curl -- -sG {settings.prometheus_url.rstrip('/')}/api/v1/query "
            f"--data-urlencode 'query={query}'")


def _refuse_secrets_in_spec(spec: DeploymentSpec) -> None:
    """Keys and a Redis password would be written into the manifests: they come from Secrets."""
    container.refuse_spec_keys(spec, "put them in a Secret and name it: --api-key-secret NAME")
    if spec.server.admin_keys:
        raise ConfigError("admin keys given in the spec would be written into the manifests; put them in "
                          "a Secret and name it: --admin-key-secret NAME")
    url = spec.server.cache_url or ""
    if re.match(r"^rediss?://[^@/]*:[^@/]+@", url):
        raise ConfigError("the cache URL's password would be written into the manifests; put the URL in a "
                          "Secret (key `url`) and name it: --cache-url-secret NAME")
