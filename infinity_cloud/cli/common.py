"""What every command shares: a domain error ends it with its message (exit 2), the slow steps
shown as they run, the endpoint key's option."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import InfinityCloudError
from infinity_cloud.targets.base import CLIENT_KEY_ENV

KeyOption = Annotated[str | None, typer.Option(
    "--key", envvar=CLIENT_KEY_ENV, help="The endpoint's API key (sent as a bearer token).",
)]


@contextmanager
def reported_errors() -> Iterator[None]:
    """A domain error ends the command with its message (exit 2), not a traceback."""
    try:
        yield
    except InfinityCloudError as exc:
        raise fail(exc.message) from None


def fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def show_steps(spec: DeploymentSpec) -> None:
    """Each slow step of a build or deploy (resolving an image's requirements, exports, a
    download) on stderr as it starts and ends: a build was silent for up to minutes."""
    from infinity_cloud.server.logs import configure_logging

    configure_logging(spec.server.log_level, spec.server.log_format)
