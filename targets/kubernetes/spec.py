"""The `kubernetes:` section of the deployment spec: how `infinity-cloud build/deploy
kubernetes` lays the server out on the user's own cluster. Checked when the spec is built, so
a bad setting is refused before anything is rendered or applied. The CLI makes a flag of
each field."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

# GPU types, each a family, and every `nvidia.com/gpu.product` label NVIDIA's GPU feature
# discovery (part of the GPU operator) puts on a node with one of that family: the NVML
# device name with spaces as '-' (NVIDIA/gpu-feature-discovery#54, internal/lm/resource.go), so
# "NVIDIA A100 80GB PCIe" is NVIDIA-A100-80GB-PCIe. A replica may land on any of them.
_A100_40GB = ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB")
_A100_80GB = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe")
GPU_PRODUCTS: dict[str, tuple[str, ...]] = {
    "T4": ("Tesla-T4",),
    "L4": ("NVIDIA-L4",),
    "A10G": ("NVIDIA-A10G",),
    "A10": ("NVIDIA-A10",),
    "L40S": ("NVIDIA-L40S",),
    "A100": _A100_80GB + _A100_40GB,
    "A100-80GB": _A100_80GB,
    "A100-40GB": _A100_40GB,
    # SXM5 reports itself as "H100 80GB HBM3" (some boards "H100 SXM5 80GB"); PCIe; NVL (94 GB).
    "H100": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB", "NVIDIA-H100-SXM5-64GB", "NVIDIA-H100-PCIe",
             "NVIDIA-H100-NVL"),
    "H200": ("NVIDIA-H200", "NVIDIA-H200-NVL"),
    "B200": ("NVIDIA-B200",),
}
# Blackwell: no CUDA 12.6 build of torch has its kernels (sm_100), so it needs --cuda 13.
NEEDS_CUDA_13 = frozenset({"B200"})
# Time-sliced GPUs shared without renaming their resource carry the product label with this
# suffix (the device plugin's sharing configuration).
SHARED_SUFFIX = "-SHARED"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# What a replica asks the device plugin for: whole GPUs (--gpu-count of them); a MIG slice
# (nvidia.com/mig-1g.10gb, the plugin's "mixed" strategy); or a time-sliced share
# (nvidia.com/gpu.shared, its `renameByDefault` sharing). A slice or a share is one a replica.
WHOLE_GPU = "nvidia.com/gpu"
GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|gpu\.shared|mig-\d+g\.\d+gb)$")
# A replica's default CPU cores and memory, for each GPU it takes (one on a CPU replica).
CPU_PER_GPU = 2.0
MEMORY_MIB_PER_GPU = 4096
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_QUANTITY = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
# A label's key (an optional DNS-subdomain prefix and '/', then a name) and its value.
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def prometheus_namespace(url: str) -> str | None:
    """The namespace of the in-cluster Service a Prometheus URL names: NAME.NAMESPACE,
    NAME.NAMESPACE.svc, or NAME.NAMESPACE.svc.CLUSTER-DOMAIN; None for any other host (an IP,
    one label, a name outside the cluster)."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    parts = host.split(".")
    if len(parts) < 2 or not all(_DNS_LABEL.match(p) for p in parts[:2]):
        return None
    if len(parts) == 2 or parts[2] == "svc":
        return parts[1]
    return None


class KubernetesSpec(BaseModel):
    """How the server runs as a fleet on a Kubernetes cluster (see docs/targets/kubernetes.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("infinity-cloud", description="Name of every object (and their app label).")
    namespace: str = Field("default", description="Namespace the objects live in.")
    context: str | None = Field(
        None, description="kubectl context to deploy with (default: the current one)."
    )
    image: str = Field(
        "infinity-cloud:latest",
        description="The image the nodes pull: build it from the rendered image/ folder and push it "
        "to a registry the cluster reaches (REGISTRY/NAME:TAG).",
    )
    gpu: str | None = Field(
        None, description="GPU type of a replica's GPUs (L4, A10G, A100, H100, ...; --gpu-count of them); "
        "none: CPU.",
    )
    gpu_count: int = Field(
        1, ge=1, description="GPUs a replica takes (whole nvidia.com/gpu devices, on one node): its server "
        "makes an engine replica on each, so a replica clears that many times one GPU's load, and its "
        "default --cpu, --memory and --target-queued-tokens grow as much.",
    )
    gpu_resource: str = Field(
        WHOLE_GPU,
        description="The device plugin's resource a replica takes one of: nvidia.com/gpu, a MIG slice "
        "(nvidia.com/mig-1g.10gb) or a time-sliced share (nvidia.com/gpu.shared).",
    )
    cuda: Literal["12", "13"] | None = Field(
        None, description="The CUDA build of torch a GPU image installs: 13 (the default) needs NVIDIA "
        "driver 580 or newer, 12 (torch's cu126 wheels) runs on driver 525 and newer.",
    )
    node_selector: tuple[str, ...] = Field(
        (), description="KEY=VALUE labels a node must have (repeatable); --gpu adds a node affinity for "
        "every product label of its family.",
    )
    priority_class: str | None = Field(
        None, description="PriorityClass of the replicas (priorityClassName), so they preempt batch work.",
    )
    tmp_size: str = Field(
        "2Gi", description="Size limit of the writable /tmp (an emptyDir): OpenVINO's compiled cache and "
        "Python's temporary files; a replica that outgrows it is evicted.",
    )
    cpu: float = Field(
        CPU_PER_GPU, gt=0, description="CPU cores a replica requests (and is limited to); default 2 for each "
        "of its GPUs (tokenizing feeds each).",
    )
    memory_mib: int = Field(
        MEMORY_MIB_PER_GPU, ge=512, description="Memory a replica requests and is limited to, MiB (default "
        "4096 for each of its GPUs: every GPU's engine replica batches at once); the server's own "
        "budget is 90% of it, so it refuses work before the kernel kills it.",
        json_schema_extra={"flag": "--memory"},
    )
    min_replicas: int = Field(
        1, ge=0, description="Replicas when idle; 0 (with --autoscaler keda) scales to zero through KEDA's "
        "HTTP add-on, whose interceptor holds a request while a replica starts.",
    )
    zero_hosts: tuple[str, ...] = Field(
        (), description="With --min-replicas 0: the Host names the HTTP add-on's interceptor routes to this "
        "deployment (repeatable; default: the Service's in-cluster names).",
    )
    max_replicas: int = Field(4, ge=1, description="Most replicas the autoscaler may run.")
    autoscaler: Literal["keda", "hpa", "hpa-cpu", "none"] = Field(
        "keda",
        description="keda: a ScaledObject on the server's queued tokens (Prometheus); hpa: an "
        "autoscaling/v2 HPA on the same metric through prometheus-adapter; hpa-cpu: on CPU use "
        "(no metrics stack, a poorer signal); none: min-replicas, fixed.",
    )
    target_queued_tokens: int | None = Field(
        None, ge=1, description="Queued tokens per replica the autoscaler aims for (default: two "
        "batches' worth of the first model).",
    )
    prometheus_url: str = Field(
        "http://prometheus-operated.monitoring.svc:9090",
        description="Where KEDA queries Prometheus (the Prometheus operator's service by default).",
    )
    prometheus_namespace: str | None = Field(
        None, description="Namespace Prometheus runs in, which --network-policy admits (default: read from "
        "--prometheus-url's service name, NAME.NAMESPACE.svc).",
    )
    keda_namespace: str = Field(
        "keda", description="Namespace of KEDA and its HTTP add-on, whose interceptor --network-policy "
        "admits with --min-replicas 0.",
    )
    weights: Literal["image", "volume", "oci"] = Field(
        "image",
        description="image: weights and exports built into the image; volume: fetched once by an "
        "init container into a PersistentVolumeClaim every replica mounts read-only; oci: an image of "
        "their own (--weights-image), mounted read-only as an image volume (Kubernetes 1.31+).",
    )
    weights_image: str | None = Field(
        None, description="With --weights oci: where the weights image is pushed (REGISTRY/NAME:TAG); "
        "`docker build --target weights` makes it from the rendered image/ folder.",
    )
    volume_size: str = Field("20Gi", description="Size of the weights' PersistentVolumeClaim.")
    storage_class: str | None = Field(
        None, description="StorageClass of the weights' claim (ReadWriteMany; default: the cluster's)."
    )
    service_monitor: bool = Field(
        True, description="A ServiceMonitor, so the Prometheus operator scrapes /metrics."
    )
    monitor_labels: tuple[str, ...] = Field(
        (), description="KEY=VALUE labels of the ServiceMonitor (repeatable), which the Prometheus's "
        "serviceMonitorSelector must match: kube-prometheus-stack's selects release=<its release name>.",
        json_schema_extra={"flag": "--monitor-label"},
    )
    alert_p95_ms: int = Field(
        1000, ge=1, description="With the ServiceMonitor, its PrometheusRule alerts when a model's p95 "
        "request latency (infinity_cloud_request_seconds) stays over this many ms for 10 minutes.",
    )
    network_policy: bool = Field(
        False, description="A NetworkPolicy: only pods of the namespace, Prometheus's, KEDA's interceptor "
        "(with --min-replicas 0) and --ingress-from namespaces reach the port.",
    )
    ingress_from: tuple[str, ...] = Field(
        (), description="With --network-policy: a namespace whose pods may call the server, such as the "
        "ingress controller's (repeatable).",
    )
    api_key_secret: str | None = Field(
        None, description="Secret whose key `api-keys` (one key a line) the server requires as bearer keys.",
    )
    admin_key_secret: str | None = Field(
        None, description="Secret whose key `admin-keys` opens the admin API (load/unload while serving).",
    )
    cache_url_secret: str | None = Field(
        None, description="Secret whose key `url` is the shared Redis (redis://:PASSWORD@HOST:6379/0), "
        "so replicas share rows; its key `secret`, if present, signs them.",
    )
    drain_s: int = Field(
        30, ge=1, le=3600, description="Seconds a stopping replica keeps answering what it admitted.",
    )
    startup_s: int | None = Field(
        None, ge=10, description="Longest a replica may take to load its models (default: 5 min with "
        "weights in the image, 20 min when fetched and exported at start).",
    )

    @model_validator(mode="before")
    @classmethod
    def _sized_for_gpus(cls, data: Any) -> Any:
        """--cpu and --memory, unless given, are one GPU's share times --gpu-count."""
        if not isinstance(data, dict):
            return data
        try:
            count = int(data.get("gpu_count") or 1)
        except (TypeError, ValueError):
            return data  # the field's own check says why
        if count <= 1:
            return data
        defaults = {"cpu": CPU_PER_GPU * count, "memory_mib": MEMORY_MIB_PER_GPU * count}
        return {**{k: v for k, v in defaults.items() if data.get(k) is None}, **data}

    @field_validator("name", "namespace", "keda_namespace", "prometheus_namespace")
    @classmethod
    def _dns_label(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_LABEL.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes name (lower-case letters, digits, '-', "
                             "at most 63, starting with a letter)")
        return value

    @field_validator("ingress_from", mode="before")
    @classmethod
    def _namespaces(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str) else list(value or ())
        for item in items:
            if not _DNS_LABEL.match(str(item)):
                raise ValueError(f"--ingress-from {item!r} is not a namespace name")
        return items

    @field_validator("cuda", mode="before")
    @classmethod
    def _cuda_major(cls, value: Any) -> Any:
        return None if value is None else str(value)  # 12 in a YAML spec is a number

    @field_validator("api_key_secret", "admin_key_secret", "cache_url_secret", "storage_class",
                     "priority_class")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        if value is not None and not _SECRET_NAME.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes object name")
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name = value.strip().upper()
        if name not in GPU_PRODUCTS:
            raise ValueError(f"unknown GPU {value!r}; choose one of {', '.join(GPU_PRODUCTS)}, or "
                             f"leave it out and select nodes with --node-selector")
        return name

    @field_validator("gpu_resource")
    @classmethod
    def _gpu_resource(cls, value: str) -> str:
        if not GPU_RESOURCE.match(value):
            raise ValueError(f"{value!r} is not an NVIDIA device plugin resource (nvidia.com/gpu, "
                             "nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb, ...)")
        return value

    @field_validator("volume_size", "tmp_size")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if not _QUANTITY.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (20Gi, 500Mi)")
        return value

    @field_validator("node_selector", "monitor_labels", mode="before")
    @classmethod
    def _pairs(cls, value: Any, info: ValidationInfo) -> Any:
        what = {"node_selector": "node selector", "monitor_labels": "monitor label"}[info.field_name or ""]
        items = [value] if isinstance(value, str) else list(value or ())
        for item in items:
            key, sep, label = str(item).partition("=")
            if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(label):
                raise ValueError(f"{what} {item!r} is not KEY=VALUE (a Kubernetes label)")
        return items

    @model_validator(mode="after")
    def _consistent(self) -> KubernetesSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})")
        if self.min_replicas == 0 and self.autoscaler != "keda":
            raise ValueError(f"--min-replicas 0 scales to zero through KEDA's HTTP add-on: use --autoscaler "
                             f"keda (the {self.autoscaler} autoscaler keeps at least one replica)")
        if self.zero_hosts and self.min_replicas != 0:
            raise ValueError("--zero-hosts names the hosts routed through KEDA's HTTP add-on, which only "
                             "--min-replicas 0 uses")
        if (self.weights == "oci") != (self.weights_image is not None):
            raise ValueError("--weights oci mounts the image named by --weights-image, and only it does: "
                             "give both, or neither")
        if self.gpu_count > 1 and self.device != "cuda":
            raise ValueError(f"--gpu-count {self.gpu_count} asks for GPUs: give --gpu TYPE too")
        if self.gpu_count > 1 and self.gpu_resource != WHOLE_GPU:
            # A CUDA process enumerates one MIG device only (NVIDIA's MIG user guide, "CUDA Device
            # Enumeration"), and N time-sliced shares may be N slices of one GPU, with no more
            # compute than one (NVIDIA GPU Operator, "Time-Slicing GPUs in Kubernetes").
            why = ("CUDA lets a process use one MIG device, so the others would sit idle"
                   if "mig-" in self.gpu_resource else
                   "time-sliced shares may all be slices of one GPU, which gives no more compute than one")
            raise ValueError(f"--gpu-count {self.gpu_count} takes whole GPUs ({WHOLE_GPU}), not "
                             f"{self.gpu_resource}: {why}; scale out with --max-replicas instead")
        if self.cuda is not None and self.device != "cuda":
            raise ValueError("--cuda picks the torch build of a GPU image: give --gpu (or --gpu-resource)")
        if self.cuda == "12" and self.gpu in NEEDS_CUDA_13:
            raise ValueError(f"--gpu {self.gpu} is Blackwell, whose kernels no CUDA 12.6 build of torch has: "
                             "use --cuda 13 (NVIDIA driver 580 or newer)")
        if self.ingress_from and not self.network_policy:
            raise ValueError("--ingress-from names namespaces the NetworkPolicy admits: add --network-policy")
        if self.monitor_labels and not self.service_monitor:
            raise ValueError("--monitor-label labels the ServiceMonitor, and --no-service-monitor drops it")
        if self.network_policy and self.scraped and self.scrape_namespace is None:
            raise ValueError(f"--network-policy admits the namespace Prometheus runs in, which cannot be "
                             f"read from --prometheus-url {self.prometheus_url} (not NAME.NAMESPACE.svc): "
                             "give --prometheus-namespace NAMESPACE")
        return self

    @property
    def device(self) -> str:
        return "cuda" if self.gpu or self.gpu_resource != WHOLE_GPU else "cpu"

    @property
    def selector(self) -> dict[str, str]:
        """The node labels given with --node-selector."""
        return dict(item.partition("=")[::2] for item in self.node_selector)

    @property
    def gpu_products(self) -> tuple[str, ...]:
        """The product labels a replica's node may have: every one of the --gpu family (none when
        --node-selector names the product label itself)."""
        if not self.gpu or PRODUCT_LABEL in self.selector:
            return ()
        products = GPU_PRODUCTS[self.gpu]
        if self.gpu_resource == "nvidia.com/gpu.shared":
            products += tuple(p + SHARED_SUFFIX for p in products)
        return products

    @property
    def torch_cuda(self) -> str:
        """The CUDA build of torch a GPU image installs, as PyTorch's index names it."""
        return {"12": "cu126", "13": "cu130"}[self.cuda or "13"]

    @property
    def monitor_label_pairs(self) -> dict[str, str]:
        return dict(item.partition("=")[::2] for item in self.monitor_labels)

    @property
    def scraped(self) -> bool:
        """Whether a Prometheus reaches the replicas: for the ServiceMonitor, or the metric the
        autoscaler reads."""
        return self.service_monitor or self.autoscaler in ("keda", "hpa")

    @property
    def scrape_namespace(self) -> str | None:
        """The namespace of the Prometheus that scrapes the replicas and that KEDA asks."""
        return self.prometheus_namespace or prometheus_namespace(self.prometheus_url)

    @property
    def routed_hosts(self) -> tuple[str, ...]:
        """The Host names the HTTP add-on's interceptor sends to this deployment."""
        service = f"{self.name}.{self.namespace}"
        return self.zero_hosts or (self.name, service, f"{service}.svc", f"{service}.svc.cluster.local")

    @property
    def startup_limit_s(self) -> int:
        return self.startup_s or (1200 if self.weights == "volume" else 300)
