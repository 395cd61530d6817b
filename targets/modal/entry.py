"""What runs inside a Modal image build and container; the rendered app file calls these.

The app file holds only the deployment's settings; the logic lives here, in the package that
the image carries as local source, so what runs on Modal is the code the tests ran.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from infinity_cloud.config import DeploymentSpec, build_spec
from infinity_cloud.engine import Engine
from targets.base import configure_logging

# The variable a Modal secret sets to protect the endpoint: one key, or several separated by
# spaces. Not the CLI's INFINITY_CLOUD_API_KEY, which a deploying shell may hold for itself.
ENDPOINT_KEYS_ENV = "INFINITY_CLOUD_ENDPOINT_KEYS"


def container_spec(spec_data: Mapping[str, Any], model_dirs: Mapping[str, str]) -> DeploymentSpec:
    """The spec as this process sees it: a local model folder becomes its copy in the image
    (`model_dirs` maps one to the other; empty on the deploying machine), served under the
    name clients know it by."""
    models = []
    for model in spec_data.get("models") or [{}]:
        model_id = model.get("model_id")
        if model_id in model_dirs:
            model = {**model, "model_id": model_dirs[model_id]}
            model.setdefault("served_model_name", model_id)
        models.append(model)
    return build_spec({**spec_data, "models": models})


def bake_models(spec: DeploymentSpec) -> None:
    """The image build step: fetch every model and build its exports on the target's hardware."""
    from infinity_cloud.served_model import prepare_model

    configure_logging(spec.server.log_level)
    for model in spec.models:
        print(prepare_model(model), flush=True)


def start_engine(spec: DeploymentSpec) -> Engine:
    """Load every model before the container takes requests (a failure stops the container)."""
    configure_logging(spec.server.log_level)
    return Engine.loaded(spec)


def http_app(engine: Engine) -> Any:
    """The same FastAPI app as the local server, with API keys read now, after any snapshot
    restore, from the environment a Modal secret fills."""
    from infinity_cloud.server import create_app

    server = engine.spec.server
    keys = tuple(os.environ.get(ENDPOINT_KEYS_ENV, "").split())
    if keys:
        server = server.model_copy(update={"api_keys": keys})
    # The container, not the app, owns the engine: Modal's exit hook closes it.
    return create_app(engine, manage_engine=False, server=server)
