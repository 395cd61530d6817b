"""The local target: `infinity-cloud serve` on this machine, `build local` for a Docker image
of the same server with its models baked in, and `invoke local` against a running one."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.server.logs import UVICORN_LOGS, configure_logging
from infinity_cloud.targets import container
from infinity_cloud.targets.base import (
    CLIENT_KEY_ENV,
    Endpoint,
    Target,
    TargetError,
    render_templates,
    response_json,
    spec_yaml,
)
from infinity_cloud.targets.local.spec import LocalSpec
from infinity_cloud.targets.platforms import image_platform, this_machine_arch

IMAGE_MODELS = "/models"
# HF_HOME inside the image: hub models are fetched into its cache, at build or, when the
# image is built without them, where it runs (a volume mounted there).
IMAGE_HF_HOME = "/models/hub"
# Where an image of the weights alone (`docker build --target weights`) is mounted, read-only:
# its hub cache and the exports built from it (Kubernetes' image volumes).
WEIGHTS_DIR = "/weights"
SPEC_FILE = "infinity-cloud.yaml"
# The variable `infinity-cloud serve` reads its API keys from.
SERVE_KEY_ENV = "INFINITY_CLOUD_API_KEY"


def server_image(
    spec: DeploymentSpec, out_dir: Path, base_image: str, gpu: bool, *,
    bake_models: bool = True, user: int | None = None, rendered_by: str | None = None,
    weights_image: bool = False, extra: dict[str, Any] | None = None,
) -> list[Path]:
    """The server's container image, as `build local` makes it and the Kubernetes target
    reuses: a Dockerfile (and compose file), the pinned requirements, the package, the spec
    it serves, and copies of local model folders. With `bake_models` the hub models and their
    exports are built into the image; without, they are fetched where it runs (`download`)
    into `IMAGE_HF_HOME`. `weights_image`: the Dockerfile's `weights` target is an image of the
    hub models and every model's exports alone, mounted at `WEIGHTS_DIR` where the server runs
    (the server's own target holds none). `user`: the uid it runs as (None: the base image's, root).
    `rendered_by`: the target whose image it is, which has no compose file (None: local's)."""
    device = "cuda" if gpu else "cpu"
    spec = container.with_served_names(spec)
    container.check_backends(spec, device, "this image")
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dirs, copies = container.copy_local_models(spec, out_dir, IMAGE_MODELS)
    served = container.image_spec(spec, model_dirs, host="0.0.0.0")
    (out_dir / SPEC_FILE).write_text(spec_yaml(served), encoding="utf-8")
    extras = container.image_extras(spec, device)
    platform = image_platform(base_image, this_machine_arch())  # docker builds for this CPU
    container.check_installs(f"torch=={container.torch_version()}", platform)
    requirements = container.write_requirements(out_dir, container.pinned_requirements(extras, platform))
    serving = None
    bake_models = bake_models and not weights_image
    if (bake_models or weights_image) and not gpu:  # exports built in a first stage: what runs needs no torch
        pins = container.serving_requirements(spec, device, platform)
        serving = container.write_requirements(out_dir, pins, container.SERVING_REQUIREMENTS_FILE)
    package = container.stage_package(out_dir)
    written = render_templates("local", out_dir, {
        "spec": served,
        "local": LocalSpec(base_image=base_image, gpu=gpu),
        "torch": f"torch=={container.torch_version()}",
        "torch_index": None if gpu else container.TORCH_CPU_INDEX,
        "image_env": container.image_env(device),  # a GPU image refuses to serve on the CPU
        "hub_models": container.hub_models(spec) if bake_models or weights_image else [],
        "weights_dir": WEIGHTS_DIR if weights_image else None,
        "files_only": gpu,  # a GPU's precision check needs the GPU: at the server's first start
        "bake_models": bake_models,
        "hf_home": IMAGE_HF_HOME,
        "user": user,
        "model_copies": copies,
        "requirements_file": requirements.name,
        "serving_requirements_file": serving.name if serving else None,
        "models_dir": IMAGE_MODELS,
        "package_dir": package.name,
        "spec_file": SPEC_FILE,
        "compose": rendered_by is None,
        "rendered_by": rendered_by or "local",
        **(extra or {}),
    })
    if rendered_by is not None:  # the compose file runs the image on this machine: local's alone
        (out_dir / "compose.yaml").unlink()
        written = [path for path in written if path.name != "compose.yaml"]
    return [*written, out_dir / SPEC_FILE, requirements, *([serving] if serving else []), package,
            *(out_dir / copy for copy, _ in copies)]


class LocalTarget(Target[LocalSpec]):
    name = "local"
    spec_class = LocalSpec
    verbs = ("build", "invoke", "status", "smoke")
    planner = "infinity_cloud.targets.local.plan:PLANNER"

    def describe(self, spec: DeploymentSpec) -> str:
        return f"the server at {self.endpoint(spec, None).url}"

    def serve(self, spec: DeploymentSpec) -> None:
        """Load every model (a failure stops here), then serve until interrupted."""
        import uvicorn
        from rich.console import Console
        from uvicorn.main import STARTUP_FAILURE

        from infinity_cloud.engine import Engine
        from infinity_cloud.server.app import create_app
        from infinity_cloud.server.read_deadlines import deadline_protocol
        from infinity_cloud.targets import preflight
        from infinity_cloud.targets.local.first_lines import ServerThatSaysWhere, ready_lines
        from infinity_cloud.targets.runtime import check_image_device

        configure_logging(spec.server.log_level, spec.server.log_format)
        preflight.check(spec)  # extras, device, cache, port: before minutes of loading
        check_image_device()  # a GPU image (build local --gpu) refuses to serve on the CPU
        names = ", ".join(m.name for m in spec.models)
        with Console(stderr=True).status(f"loading {names}"):
            engine = Engine.loaded(spec)
        app = create_app(engine)
        config = uvicorn.Config(
            app, host=spec.server.host, port=spec.server.port, log_level=spec.server.log_level,
            http=deadline_protocol(spec.server), ws="none",  # the API has no websockets: not imported
            timeout_graceful_shutdown=spec.server.drain_s,
            **UVICORN_LOGS,
        )
        served = [(name, model.capability) for name, model in engine.models.items()]
        server = ServerThatSaysWhere(config, ready_lines(spec, served))
        with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
            server.run()
        if not server.started:  # as uvicorn.run: the port was taken, say (uvicorn logged why)
            sys.exit(STARTUP_FAILURE)

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]:
        """A Dockerfile, a compose file, the pinned requirements, the package, the spec the
        container serves, and copies of local model folders; the image bakes the weights in."""
        settings = self.settings(spec)
        container.refuse_spec_keys(spec, f"give them when it runs: docker run -e {SERVE_KEY_ENV}=KEY")
        return server_image(spec, Path(out_dir), settings.base_image, settings.gpu, extra={"local": settings})

    def status(self, spec: DeploymentSpec) -> dict[str, Any]:
        """Whether a server answers at the spec's address, and what it serves."""
        import httpx

        endpoint = self.endpoint(spec, None)
        try:
            health = httpx.get(f"{endpoint.url}/health", headers=endpoint.headers, timeout=5)
            models = httpx.get(f"{endpoint.url}/models", headers=endpoint.headers, timeout=5)
        except httpx.HTTPError as exc:
            raise TargetError(f"nothing answers at {endpoint.url} ({type(exc).__name__}): start it with "
                              "`infinity-cloud serve`") from None
        state = response_json(health).get("status", health.status_code)
        facts: dict[str, Any] = {"url": endpoint.url, "status": state}
        if models.status_code == 401:
            facts["models"] = f"(set {CLIENT_KEY_ENV} to its API key to list them)"
        elif models.status_code == 200:
            facts["models"] = ", ".join(m["id"] for m in response_json(models)["data"])
        return facts

    def endpoint(self, spec: DeploymentSpec, api_key: str | None) -> Endpoint:
        server = spec.server
        host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
        key = api_key or os.environ.get(CLIENT_KEY_ENV) or next(iter(server.api_keys), None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return Endpoint(f"http://{host}:{server.port}{server.url_prefix}", headers)

