"""A stand-in for a Kubernetes API server, for the real `kubectl` to talk to over HTTP: no
cluster can run here (no container runtime, no kube-apiserver binary from a registry).

What it does, as an API server does: `/version`; discovery (legacy: `/api`, `/apis`, each
group version's resources); the OpenAPI v3 index and documents that tell kubectl every
PATCH takes `fieldValidation`, so kubectl leaves validation to the server; server-side apply
(PATCH `application/apply-patch+yaml`), which it validates strictly against the API's own
schemas (kubernetes-validate) for built-in kinds and refuses with a 422 as the API server
would, stores with a generation and the field manager, and answers with; GET, LIST (label
and field selectors; a watch is held open, empty), DELETE. As the controllers would, it marks
an applied Deployment rolled out, with pods, and makes the HPA that KEDA makes for a
ScaledObject.

What it does not: merge applies field by field or detect conflicts between managers (an apply
replaces the object), admission (Pod Security, quotas), CRD schema validation, scheduling,
and anything that runs a container.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

VERSION = "1.37.0"
# (group, version) -> [(plural, kind)]; "" is the core group.
BUILT_IN = {
    ("", "v1"): [
        ("serviceaccounts", "ServiceAccount"),
        ("configmaps", "ConfigMap"),
        ("services", "Service"),
        ("persistentvolumeclaims", "PersistentVolumeClaim"),
        ("pods", "Pod"),
        ("secrets", "Secret"),
    ],
    ("apps", "v1"): [("deployments", "Deployment")],
    ("batch", "v1"): [("jobs", "Job")],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget")],
    ("autoscaling", "v2"): [("horizontalpodautoscalers", "HorizontalPodAutoscaler")],
    ("networking.k8s.io", "v1"): [("networkpolicies", "NetworkPolicy")],
}
CUSTOM = {
    ("keda.sh", "v1alpha1"): [("scaledobjects", "ScaledObject")],
    ("monitoring.coreos.com", "v1"): [
        ("servicemonitors", "ServiceMonitor"), ("prometheusrules", "PrometheusRule"),
    ],
}


@dataclass
class ApiServer:
    """The stand-in's state: objects by (group, plural, namespace, name); every request seen."""

    custom: bool = True  # whether KEDA's and the Prometheus operator's CRDs are installed
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, list[str]]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    revision: int = 1

    @property
    def groups(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        return {**BUILT_IN, **(CUSTOM if self.custom else {})}

    def kind_of(self, group: str, version: str, plural: str) -> str | None:
        return next((k for p, k in self.groups.get((group, version), []) if p == plural), None)

    def applied(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [o for o in self.objects.values() if o["kind"] == kind]

    def store(self, group: str, plural: str, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        meta = obj["metadata"]
        key = (group, plural, meta.get("namespace", ""), meta["name"])
        with self.lock:
            self.revision += 1
            old = self.objects.get(key)
            if old and obj["kind"] == "Deployment" and "replicas" not in obj["spec"]:
                obj["spec"]["replicas"] = old["spec"]["replicas"]  # an autoscaler's field stays its own
            meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
            changed = old is None or old.get("spec") != obj.get("spec")
            meta["generation"] = (old["metadata"]["generation"] + changed) if old else 1
            meta["resourceVersion"] = str(self.revision)
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"] if old else _now()
            meta["managedFields"] = [
                {"manager": manager, "operation": "Apply", "apiVersion": obj["apiVersion"], "time": _now()}
            ]
            self.objects[key] = obj
        self._control(obj)
        return obj

    def _control(self, obj: dict[str, Any]) -> None:
        """What the controllers would do next, at once: a Deployment rolled out with its pods
        ready; KEDA's HPA for a ScaledObject; an HPA's minimum of replicas."""
        meta = obj["metadata"]
        if obj["kind"] == "Deployment":
            self._roll_out(obj, obj["spec"].get("replicas") or 1)
        if obj["kind"] == "ScaledObject":
            spec = obj["spec"]
            low = spec.get("minReplicaCount", 1)
            name = f"keda-hpa-{meta['name']}"
            self.objects[("autoscaling", "horizontalpodautoscalers", meta["namespace"], name)] = {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "uid": str(uuid.uuid4()),
                    "resourceVersion": str(self.revision),
                    "labels": {"scaledobject.keda.sh/name": meta["name"]},
                },
                "spec": {
                    "minReplicas": low,
                    "maxReplicas": spec.get("maxReplicaCount"),
                    "scaleTargetRef": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": spec["scaleTargetRef"]["name"],
                    },
                },
                "status": {"currentReplicas": low, "desiredReplicas": low},
            }
        if obj["kind"] in ("ScaledObject", "HorizontalPodAutoscaler"):
            target = obj["spec"]["scaleTargetRef"]["name"]
            low = obj["spec"].get("minReplicaCount", obj["spec"].get("minReplicas", 1))
            deployment = self.objects.get(("apps", "deployments", meta["namespace"], target))
            if deployment is not None and deployment["spec"]["replicas"] < low:
                self._roll_out(deployment, low)

    def _roll_out(self, obj: dict[str, Any], replicas: int) -> None:
        meta = obj["metadata"]
        obj["spec"]["replicas"] = replicas
        counts = dict.fromkeys(
            ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas"), replicas
        )
        obj["status"] = {
            "observedGeneration": meta["generation"],
            **counts,
            "conditions": [
                {"type": "Available", "status": "True"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        }
        labels = obj["spec"]["template"]["metadata"]["labels"]
        for i in range(replicas):
            name = f"{meta['name']}-{i}"
            ready = [{"name": "server", "ready": True, "restartCount": 0}]
            self.objects[("", "pods", meta["namespace"], name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "labels": dict(labels),
                    "uid": str(uuid.uuid4()),
                    "resourceVersion": str(self.revision),
                },
                "status": {"phase": "Running", "containerStatuses": ready},
            }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    labels = obj["metadata"].get("labels", {})
    for term in filter(None, query.get("labelSelector", [""])[0].split(",")):
        name, _, value = term.partition("=")
        if labels.get(name) != value:
            return False
    for term in filter(None, query.get("fieldSelector", [""])[0].split(",")):
        name, _, value = term.partition("=")
        if name == "metadata.name" and obj["metadata"]["name"] != value:
            return False
    return True


def handler(server: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            server.requests.append((self.command, url.path, query))
            parts = [p for p in url.path.split("/") if p]
            if url.path == "/version":
                return self._send(
                    200, {"major": "1", "minor": VERSION.split(".")[1], "gitVersion": f"v{VERSION}"}
                )
            if url.path == "/api":
                return self._send(
                    200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
                )
            if url.path == "/apis":
                groups = sorted({g for g, _ in server.groups if g})
                return self._send(
                    200,
                    {
                        "kind": "APIGroupList",
                        "apiVersion": "v1",
                        "groups": [
                            {
                                "name": g,
                                "versions": [
                                    {"groupVersion": f"{g}/{v}", "version": v}
                                    for gg, v in server.groups
                                    if gg == g
                                ],
                                "preferredVersion": {
                                    "groupVersion": f"{g}/{next(v for gg, v in server.groups if gg == g)}",
                                    "version": next(v for gg, v in server.groups if gg == g),
                                },
                            }
                            for g in groups
                        ],
                    },
                )
            if url.path == "/openapi/v3":
                return self._send(
                    200,
                    {
                        "paths": {
                            (f"apis/{g}/{v}" if g else f"api/{v}"): {
                                "serverRelativeURL": f"/openapi/v3/{g or 'core'}/{v}"
                            }
                            for g, v in server.groups
                        }
                    },
                )
            if parts[:2] == ["openapi", "v3"] and len(parts) == 4:
                group = "" if parts[2] == "core" else parts[2]
                return self._send(200, self._openapi(group, parts[3]))
            core = parts[:1] == ["api"]
            if (core and len(parts) == 2) or (parts[:1] == ["apis"] and len(parts) == 3):
                group, version = ("", parts[1]) if core else (parts[1], parts[2])
                if (group, version) not in server.groups:
                    return self._send(
                        404, _status(404, "NotFound", "the server could not find the requested resource")
                    )
                return self._send(
                    200,
                    {
                        "kind": "APIResourceList",
                        "apiVersion": "v1",
                        "groupVersion": f"{group}/{version}" if group else version,
                        "resources": [
                            {
                                "name": p,
                                "singularName": k.lower(),
                                "namespaced": True,
                                "kind": k,
                                "verbs": [
                                    "create",
                                    "delete",
                                    "deletecollection",
                                    "get",
                                    "list",
                                    "patch",
                                    "update",
                                    "watch",
                                ],
                            }
                            for p, k in server.groups[(group, version)]
                        ],
                    },
                )
            return self._objects(parts, query, body)

        def _openapi(self, group: str, version: str) -> dict[str, Any]:
            prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
            paths = {}
            for plural, kind in server.groups.get((group, version), []):
                gvk = {"group": group, "version": version, "kind": kind}
                parameters = [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                ]
                paths[f"{prefix}/namespaces/{{namespace}}/{plural}/{{name}}"] = {
                    "patch": {
                        "parameters": parameters,
                        "x-kubernetes-group-version-kind": gvk,
                        "x-kubernetes-action": "patch",
                        "responses": {},
                    },
                }
            return {
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": f"v{VERSION}"},
                "paths": paths,
                "components": {"schemas": {}},
            }

        def _objects(self, parts: list[str], query: dict[str, list[str]], body: bytes) -> None:
            core = parts[0] == "api"
            group, version, rest = ("", parts[1], parts[2:]) if core else (parts[1], parts[2], parts[3:])
            if len(rest) < 3 or rest[0] != "namespaces":
                return self._send(404, _status(404, "NotFound", f"no such path {self.path}"))
            namespace, plural, name = rest[1], rest[2], rest[3] if len(rest) > 3 else None
            kind = server.kind_of(group, version, plural)
            if kind is None:
                return self._send(
                    404, _status(404, "NotFound", "the server could not find the requested resource")
                )
            key = (group, plural, namespace, name or "")
            if self.command == "PATCH" and name:
                obj = yaml.safe_load(body)
                if query.get("fieldValidation", ["Strict"])[0] == "Strict" and (group, version) in BUILT_IN:
                    import kubernetes_validate

                    try:
                        kubernetes_validate.validate(obj, VERSION, strict=True)
                    except kubernetes_validate.ValidationError as exc:
                        message = f'{kind} "{name}" is invalid: {exc.message}'
                        return self._send(422, _status(422, "Invalid", message))
                obj.setdefault("metadata", {})["namespace"] = namespace
                manager = query.get("fieldManager", [""])[0]
                if not manager:
                    return self._send(422, _status(422, "Invalid", "PATCH apply needs a fieldManager"))
                return self._send(200, server.store(group, plural, obj, manager))
            if self.command == "GET" and name:
                found = server.objects.get(key)
                if found is None:
                    return self._send(
                        404, _status(404, "NotFound", f'{plural}.{group or "core"} "{name}" not found')
                    )
                return self._send(200, found)
            if self.command == "GET":
                if query.get("watch", ["false"])[0] in ("true", "1"):
                    return self._watch()
                items = [
                    o
                    for (g, p, ns, _), o in list(server.objects.items())
                    if (g, p, ns) == (group, plural, namespace) and _matches(o, query)
                ]
                return self._send(
                    200,
                    {
                        "kind": f"{kind}List",
                        "apiVersion": f"{group}/{version}" if group else version,
                        "metadata": {"resourceVersion": str(server.revision)},
                        "items": items,
                    },
                )
            if self.command == "DELETE" and name:
                with server.lock:
                    gone = server.objects.pop(key, None)
                if gone is None:
                    return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
                return self._send(
                    200,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Success",
                        "details": {"name": name, "kind": plural},
                    },
                )
            return self._send(405, _status(405, "MethodNotAllowed", f"{self.command} {self.path}"))

        def _watch(self) -> None:
            """A watch with no events, held a few seconds (kubectl decides from the list)."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            time.sleep(2)
            self.wfile.write(b"0\r\n\r\n")

        do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _route

    return Handler


class Running:
    """The stand-in served on a free local port, with a kubeconfig that points kubectl at it."""

    def __init__(self, state: ApiServer, folder: Any) -> None:
        self.state = state
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "standin",
                    "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                    "users": [{"name": "user", "user": {"token": "standin-token"}}],
                    "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "user"}}],
                }
            )
        )
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()
