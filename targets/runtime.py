"""What runs inside a container image, for every target: at build time, fetching the models
and building their exports; at start, the spec as the container sees it, the engine, the
endpoint keys (fail closed), and the HTTP server.

The rendered files hold only the deployment's settings; the logic lives here, in the
package the image carries, so what runs in the cloud is the code the tests ran.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from infinity_cloud.core.config import DeploymentSpec, ServerSpec, build_spec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.engine import Engine
from infinity_cloud.server.logs import UVICORN_LOGS, configure_logging
from infinity_cloud.targets.base import ENDPOINT_KEYS_ENV, IMAGE_DEVICE_ENV

if TYPE_CHECKING:
    from infinity_cloud.bulk.workers import ShardWorker


def container_spec(spec_data: Mapping[str, Any], model_dirs: Mapping[str, str]) -> DeploymentSpec:
    """The spec as this process sees it: a local model folder becomes its copy in the image
    (`model_dirs` maps one to the other; empty on the deploying machine), served under the
    name clients know it by."""
    models = []
    for model in spec_data.get("models") or [{}]:
        model_id = model.get("model_id")
        if model_id in model_dirs:
            model = {**model, "model_id": model_dirs[model_id]}
            model.setdefault("served_model_name", PurePath(model_id).name)
        models.append(model)
    return build_spec({**spec_data, "models": models})


def check_image_device() -> None:
    """A GPU image stops here, saying why, when it has no usable GPU: `device auto` would
    otherwise load its models on the CPU and serve, many times slower, with nothing said."""
    if os.environ.get(IMAGE_DEVICE_ENV) == "cuda":
        from infinity_cloud.backends.cuda_check import require_usable_gpu

        require_usable_gpu()


def bake_models(spec: DeploymentSpec) -> None:
    """The image build step: fetch every model and build its exports on the target's hardware,
    into its folder (where the image's INFINITY_CLOUD_CACHE names no other place), which the
    image carries and serves from (`exports.cache_root`)."""
    from infinity_cloud.models.served_model import prepare_model

    configure_logging(spec.server.log_level, spec.server.log_format)
    check_image_device()  # exports and precision verdicts made on the CPU would not fit the GPU
    for model in spec.models:
        print(prepare_model(model.model_copy(update={"export_into_folder": True})), flush=True)


def start_engine(spec: DeploymentSpec) -> Engine:
    """Load every model before the container takes requests (a failure stops the container)."""
    configure_logging(spec.server.log_level, spec.server.log_format)
    check_image_device()
    return Engine.loaded(spec)


def start_job_worker(spec: DeploymentSpec, job_json: str) -> ShardWorker:
    """A bulk job's worker (`bulk.workers.ShardWorker`): one engine for the container's life,
    which reads, embeds and writes whole shards; a GPU image without its GPU stops first."""
    from infinity_cloud.bulk.workers import ShardWorker, job_from_json

    configure_logging(spec.server.log_level, spec.server.log_format)
    check_image_device()
    return ShardWorker(spec, job_from_json(job_json))


def endpoint_keys(required: bool) -> tuple[str, ...]:
    """The keys the endpoint requires, read when serving starts (after any snapshot restore).
    When the deployment names a key secret, a missing or empty value stops the container
    rather than serving an open endpoint."""
    keys = tuple(os.environ.get(ENDPOINT_KEYS_ENV, "").split())
    if required and not keys:
        raise ConfigError(
            f"this deployment requires API keys, but {ENDPOINT_KEYS_ENV} is missing or empty in "
            "its secret; refusing to serve an open endpoint"
        )
    return keys


def http_app(engine: Engine, keys: tuple[str, ...]) -> Any:
    """The same FastAPI app as the local server, guarded by `keys` when there are any. The
    container, not the app, owns the engine (its exit hook closes it)."""
    from infinity_cloud.server.app import create_app

    server = engine.spec.server
    if keys:
        server = server.model_copy(update={"api_keys": keys})
    return create_app(engine, manage_engine=False, server=server)


class BackgroundServer:
    """uvicorn serving an app from a thread of this process, for platforms that start the
    server from a hook (Modal's `@modal.enter`) and stop it from another. `stop` lets
    in-flight requests finish, within the platform's grace period."""

    def __init__(
        self, app: Any, host: str, port: int, log_level: str = "info", server: ServerSpec | None = None
    ) -> None:
        import uvicorn

        from infinity_cloud.server.read_deadlines import deadline_protocol

        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=None,
            http=deadline_protocol(server or ServerSpec()), **UVICORN_LOGS,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="http-server", daemon=True)

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        # Ready when uvicorn has bound its socket; a failed bind ends the thread instead.
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the HTTP server stopped while starting (is the port taken?)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the HTTP server did not start within {timeout_s:.0f}s")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 60.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
