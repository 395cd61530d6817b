"""The container's `serve` (SageMaker runs `<image> serve`): the HTTP app on port 8080, or
SAGEMAKER_BIND_TO_PORT, answering `/ping` at once (503 until every model is loaded, which
happens in the background) and `/invocations`. SIGTERM stops taking connections, lets the
requests in flight finish, then stops the engine.

Models come from the image (baked at build), or from /opt/ml/model when SageMaker unpacked a
model.tar.gz there: a model folder at its top serves the first model; folders named after
served models serve those.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from infinity_cloud.core.config import DeploymentSpec, load_spec
from infinity_cloud.core.errors import InfinityCloudError
from infinity_cloud.server.logs import UVICORN_LOGS, configure_logging

CONFIG_ENV = "INFINITY_CLOUD_CONFIG"
DEFAULT_CONFIG = "/opt/program/infinity-cloud.yaml"
MODEL_DIR_ENV = "SM_MODEL_DIR"
DEFAULT_MODEL_DIR = "/opt/ml/model"
PORT_ENV = "SAGEMAKER_BIND_TO_PORT"
# SageMaker keeps connections open for reuse; closing them first would fail its requests.
KEEP_ALIVE_S = 75
GRACE_PERIOD_S = 30  # SageMaker waits about this long after SIGTERM before it kills


def model_data_folder(served_name: str) -> str:
    """Where a served model sits in the model data: its name, `/` as `--` (hub-cache style)."""
    return served_name.replace("/", "--")


def with_model_data(spec: DeploymentSpec, model_dir: Path) -> DeploymentSpec:
    """The spec with models found in `model_dir` (SageMaker's unpacked model data) in place of
    the baked ones, each served under the name clients know it by."""
    if not model_dir.is_dir():
        return spec
    models = list(spec.models)
    if (model_dir / "config.json").is_file():
        found = {0: model_dir}
    else:
        found = {i: model_dir / model_data_folder(m.name) for i, m in enumerate(models)}
        found = {i: path for i, path in found.items() if (path / "config.json").is_file()}
    for i, path in found.items():
        models[i] = models[i].model_copy(update={"model_id": str(path), "served_model_name": models[i].name})
    return spec.model_copy(update={"models": tuple(models)})


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from infinity_cloud.engine import Engine
    from infinity_cloud.server.app import create_app
    from infinity_cloud.server.read_deadlines import deadline_protocol
    from infinity_cloud.targets.runtime import check_image_device

    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["serve"]):
        raise SystemExit(f"usage: serve (got {' '.join(args)})")
    try:
        spec = load_spec(os.environ.get(CONFIG_ENV, DEFAULT_CONFIG))
        spec = with_model_data(spec, Path(os.environ.get(MODEL_DIR_ENV, DEFAULT_MODEL_DIR)))
        check_image_device()  # before /ping answers: SageMaker then fails the endpoint with this line
    except InfinityCloudError as exc:  # one line in the endpoint's log, not a traceback
        raise SystemExit(f"error: {exc.message}") from None
    configure_logging(spec.server.log_level, spec.server.log_format)
    port = int(os.environ.get(PORT_ENV, spec.server.port))
    # Not loaded yet: the app loads the models in the background, so /ping answers from the start.
    app = create_app(Engine(spec))
    uvicorn.run(
        app, host="0.0.0.0", port=port, log_level=spec.server.log_level,
        timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACE_PERIOD_S,
        http=deadline_protocol(spec.server), ws="none",  # the header and body deadlines of every server
        **UVICORN_LOGS,
    )


if __name__ == "__main__":
    main()
