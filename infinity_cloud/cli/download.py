"""`infinity-cloud download`: every model's files and backend exports, fetched and built once."""

from typing import Annotated

import typer

from infinity_cloud.cli.common import reported_errors, show_steps
from infinity_cloud.cli.spec_flags import with_spec
from infinity_cloud.core.config import DeploymentSpec


@with_spec
def download(
    spec: DeploymentSpec,
    files_only: Annotated[
        bool, typer.Option("--files-only", help="Only fetch the files; build no backend exports.")
    ] = False,
) -> None:
    """Fetch every model's files and build its backend's exports (ONNX, OpenVINO IR, ...) once,
    so that a server or image started later does neither."""
    from infinity_cloud.models.served_model import prepare_model

    show_steps(spec)
    for model in spec.models:
        with reported_errors():
            typer.echo(prepare_model(model, build_exports=not files_only))
