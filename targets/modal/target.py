"""The Modal target: render a Modal app (a Modal Server) from the spec, then deploy, inspect,
call or stop it with the Modal client. Rendering is a pure function of the spec; only
`deploy`, `status`, `delete` and `invoke` talk to Modal."""

from __future__ import annotations

import importlib.util
import os
import pprint
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.targets import container
from infinity_cloud.targets.base import (
    ENDPOINT_KEYS_ENV,
    Deployment,
    Endpoint,
    JobOptions,
    Target,
    render_templates,
    spec_yaml,
)
from infinity_cloud.targets.modal.client import (
    JOB_CLASS,
    SHARD_RETRIES,
    SHARD_TIMEOUT_S,
    ModalError,
    import_modal,
    modal_calls,
    require_credentials,
)
from infinity_cloud.targets.modal.spec import TORCH_CUDA, ModalSpec
from infinity_cloud.targets.platforms import DEBIAN_GLIBC, ImagePlatform

APP_FILE = "modal_app.py"
SERVER_NAME = "Server"
# Where local model folders go in the image (and the hub cache the build step fills).
IMAGE_MODELS = "/models"
# Modal answers a web request still running after 150 s with a 303 to poll, which most API
# clients do not follow for a POST: the app's limit on one request.
WEB_REQUEST_LIMIT_S = 150
# The headers Modal's proxy auth checks, and the variables `invoke` reads them from.
PROXY_HEADERS = {"Modal-Key": "MODAL_KEY", "Modal-Secret": "MODAL_SECRET"}


def python_literal(value: Any) -> str:
    return pprint.pformat(value, width=100, sort_dicts=False)


def render_context(
    spec: DeploymentSpec, settings: ModalSpec, copies: list[tuple[str, str]] | None = None,
    model_dirs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What the app file is rendered from. `model_dirs` maps local model folders to their
    copies in the image and `copies` says where build put them beside the app file."""
    gpu = bool(settings.gpu)
    device = settings.device
    max_concurrency, target_concurrency = container.concurrency(
        spec, device, settings.max_concurrency, settings.target_concurrency, settings.devices
    )
    served = container.image_spec(spec, model_dirs or {})
    served = container.queue_sized_for(served, max_concurrency)
    served = container.within_platform(served, WEB_REQUEST_LIMIT_S, settings.memory_mib)
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # Modal's debian_slim image, on Modal's x86-64 hosts, with this machine's Python.
    platform = ImagePlatform(python_version, "x86_64", DEBIAN_GLIBC, f"Modal debian_slim {python_version}")
    container.check_installs(f"torch=={container.torch_version()}", platform)
    return {
        "spec": spec,
        "modal": settings,
        "spec_literal": python_literal(container.served_spec_data(served)),
        "model_copies_literal": python_literal(copies or []),
        "model_copies": copies or [],
        "hub_models_literal": python_literal(container.hub_models(spec)),
        "gpu_literal": repr(settings.gpu[0] if len(settings.gpu) == 1 else list(settings.gpu) or None),
        # One GPU of the first type builds the exports: the fallbacks share its software.
        "build_gpu_literal": repr(settings.gpu[0].partition(":")[0] if gpu else None),
        "secrets": list(settings.secrets),
        "api_key_secret": settings.api_key_secret,
        "keys_env": ENDPOINT_KEYS_ENV,
        "python_version": python_version,
        "torch": f"torch=={container.torch_version()}",
        "torch_index": container.TORCH_INDEX.format(build=TORCH_CUDA if gpu else "cpu"),
        "image_env": container.image_env(device),
        # `bulk` (pyarrow) for the job class: jobs run on this same image.
        "requirements": container.pinned_requirements(
            tuple(sorted({*container.image_extras(spec, device), "bulk"})), platform
        ),
        "max_concurrency": max_concurrency,
        "target_concurrency": target_concurrency,
        "unauthenticated": not settings.requires_proxy_auth,
        # GPUs are only reachable during a snapshot with Modal's GPU snapshots (alpha).
        "gpu_snapshot": gpu and settings.memory_snapshot,
        "server_name": SERVER_NAME,
        "job_name": JOB_CLASS,
        "shard_timeout_s": SHARD_TIMEOUT_S,
        "shard_retries": SHARD_RETRIES,
        "image_models": IMAGE_MODELS,
        "package_dir": container.PACKAGE,
    }


def load_app_module(path: Path) -> ModuleType:
    """Import a rendered app file with the real Modal client (which validates it).

    It is imported under its file's name and registered in `sys.modules`, as `modal deploy`
    does: Modal then ships the file itself and imports it by that name in the container,
    instead of pickling the class.
    """
    import_modal()
    name = path.stem
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ModalError(f"the rendered Modal app {path} does not load: {type(exc).__name__}: {exc}") from exc
    return module


class ModalTarget(Target[ModalSpec]):
    name = "modal"
    spec_class = ModalSpec
    verbs = ("build", "deploy", "invoke", "status", "delete", "smoke")
    planner = "infinity_cloud.targets.modal.plan:PLANNER"
    runs_jobs = True
    detaches_jobs = True

    def describe(self, spec: DeploymentSpec) -> str:
        return f"Modal app {self.settings(spec).app_name!r}"

    def embed_job(self, spec: DeploymentSpec, job: Any, options: JobOptions) -> dict[str, Any]:
        """The job's shards mapped over containers of the app's own image (`job.run_modal_job`)."""
        from infinity_cloud.targets.modal.job import run_modal_job

        return run_modal_job(self, spec, job, options)

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """The Modal app file, the package it ships, and the spec it was made from (for
        reading, or redeploying with --config)."""
        settings = self.settings(spec)
        container.refuse_spec_keys(
            spec, f"put them in a Modal secret instead (modal secret create NAME {ENDPOINT_KEYS_ENV}=KEY) "
            "and pass --api-key-secret NAME",
        )
        container.check_backends(spec, settings.device, "this Modal app")
        spec = container.with_served_names(spec)
        out_dir = Path(out_dir)
        model_dirs, copies = container.copy_local_models(spec, out_dir, IMAGE_MODELS)
        context = render_context(spec, settings, copies, model_dirs)
        written = render_templates("modal", out_dir, context)
        package = container.stage_package(out_dir)
        (out_dir / "infinity-cloud.yaml").write_text(spec_yaml(spec), encoding="utf-8")
        return [*written, package, out_dir / "infinity-cloud.yaml"]

    def load(self, out_dir: Path) -> ModuleType:
        return load_app_module(Path(out_dir) / APP_FILE)

    def deploy(self, spec: DeploymentSpec, out_dir: Path, *, dry_run: bool = False) -> Deployment | None:
        """Render, import with the Modal client, and (unless a dry run) deploy; returns where."""
        settings = self.settings(spec)
        if not dry_run:
            require_credentials()
        self.build(spec, out_dir)
        module = self.load(out_dir)
        notes = self._notes(settings)
        if dry_run:
            print(self.would_deploy(spec, module))
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
            return None
        modal = import_modal()
        with modal_calls("deploy the app", settings), modal.enable_output():
            module.app.deploy(name=settings.app_name, environment_name=settings.environment)
            url = getattr(module, SERVER_NAME).get_url() if module.app.app_id else None
        proxy_headers = {header: f"${env}" for header, env in PROXY_HEADERS.items()}
        return Deployment(
            self.name, settings.app_name, url + spec.server.url_prefix if url else None,
            api_key=settings.api_key_secret is not None, notes=notes,
            headers=proxy_headers if settings.requires_proxy_auth else {},
        )

    def would_deploy(self, spec: DeploymentSpec, module: ModuleType) -> str:
        """What a deploy of the rendered app makes, read back from it by the Modal client (its
        server's GPU, CPU, memory, port and request limits) and from the spec it was made of."""
        settings = self.settings(spec)
        server = getattr(module, SERVER_NAME)
        info = server.info()
        limits = server._get_service_function().info().concurrency_info  # Modal's own API has no other
        gpus = " else ".join(name if n == 1 else f"{n} x {name}" for name, n in info.gpus)
        gpus = gpus or "none (CPU only)"
        served = ", ".join(model.name for model in spec.models)
        auth = (f"API keys from Modal secret {settings.api_key_secret!r}" if settings.api_key_secret else "")
        if settings.requires_proxy_auth:
            auth = " and ".join(filter(None, [auth, "Modal proxy auth (Modal-Key, Modal-Secret)"]))
        torch = f"torch=={container.torch_version()} ({TORCH_CUDA if settings.gpu else 'cpu'})"
        python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
        baked = [hub_id for hub_id, _ in module.HUB_MODELS] + [remote for _, remote in module.MODEL_COPIES]
        extras = ",".join(container.image_extras(spec, settings.device))
        environment = settings.environment or "the profile's"
        prefix = f", under {spec.server.url_prefix}" if spec.server.url_prefix else ""
        buffer = f", {settings.buffer_containers} kept ready under load" if settings.buffer_containers else ""
        return "\n".join([
            f"would deploy Modal app {module.app.name!r} (environment: {environment})",
            f"  serves:   {served} on port {info.port}{prefix}; auth: {auth or 'none (public)'}",
            f"  GPU:      {gpus}; {info.cpu:g} CPU, {info.memory_mib} MiB per container",
            f"  scaling:  {settings.min_containers} to {settings.max_containers} containers{buffer}, scaled "
            f"down after {settings.scaledown_window} s idle; {limits.max_inputs} requests per container at "
            f"most, {module.TARGET_CONCURRENCY} targeted",
            f"  image:    Modal debian_slim, {python}, {torch}, the package with [{extras}], pinned; "
            f"weights baked in: {', '.join(baked) or 'none'}",
        ])

    @staticmethod
    def _notes(settings: ModalSpec) -> tuple[str, ...]:
        """What a deploy (or its dry run) warns of."""
        if settings.requires_proxy_auth or settings.api_key_secret:
            return ()
        return ("this endpoint is public: anyone with its URL can call it (--api-key-secret or --proxy-auth "
                "guards it)",)

    def exists(self, spec: DeploymentSpec) -> bool:
        settings = self.settings(spec)
        modal = import_modal()
        require_credentials()
        try:
            with modal_calls("look the app up", settings):
                modal.App.lookup(settings.app_name, environment_name=settings.environment)
        except ModalError as exc:
            if "no Modal app named" in exc.message:
                return False
            raise
        return True

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        """The deployed app's state and endpoint URL, from Modal."""
        settings = self.settings(spec)
        modal = import_modal()
        require_credentials()
        name, environment = settings.app_name, settings.environment
        with modal_calls("read the app's state", settings):
            info = modal.App.lookup(name, environment_name=environment).info()
            server = modal.Server.from_name(name, SERVER_NAME, environment_name=environment)
            url = server.get_url()
        return {
            "app": name, "app_id": info.app_id, "state": info.lifecycle.state.value,
            "deployed_at": str(info.lifecycle.deployed_at), "url": url,
        }

    def delete(self, spec: DeploymentSpec) -> None:
        """Stop the deployed app: its containers end and its URL stops answering."""
        settings = self.settings(spec)
        modal = import_modal()
        require_credentials()
        with modal_calls("stop the app", settings):
            modal.App.lookup(settings.app_name, environment_name=settings.environment).stop()

    def endpoint(self, spec: DeploymentSpec, api_key: str | None) -> Endpoint:
        settings = self.settings(spec)
        url = self.status(spec)["url"]
        if not url:
            raise ModalError(f"{self.describe(spec)} has no URL (is it deployed?)")
        headers = {}
        if settings.requires_proxy_auth:
            missing = [env for env in PROXY_HEADERS.values() if not os.environ.get(env)]
            if missing:
                raise ModalError(
                    f"this endpoint requires Modal proxy auth: set {' and '.join(missing)} to a proxy "
                    "auth token (https://modal.com/settings/proxy-auth-tokens)"
                )
            headers = {header: os.environ[env] for header, env in PROXY_HEADERS.items()}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return Endpoint(url + spec.server.url_prefix, headers)
