"""`infinity-cloud serve`: the models over HTTP on this machine; and `v2`, the same from
Infinity's command line (`infinity_emb v2`'s flags and variables)."""

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from infinity_cloud.cli.common import reported_errors
from infinity_cloud.cli.spec_flags import KEYWORD, with_spec
from infinity_cloud.core.config import DeploymentSpec, load_spec

V2_HELP = (
    "Infinity's command line (infinity_emb v2): its flags and INFINITY_* variables, served by "
    "infinity-cloud; prints the infinity-cloud spelling once. See docs/migrating-from-infinity.md."
)


@with_spec
def serve(spec: DeploymentSpec) -> None:
    """Serve the models over HTTP (the OpenAI-compatible API) on this machine."""
    from infinity_cloud.targets.local.target import LocalTarget

    if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in sys.argv):
        typer.secho(
            "warning: an API key given as --api-key is visible to every user of this machine (ps); "
            "use --api-key-file or INFINITY_CLOUD_API_KEY instead", fg=typer.colors.YELLOW, err=True,
        )
    with reported_errors():
        LocalTarget().serve(spec)


def _infinity_v2(**given: Any) -> None:
    """Serve as Infinity's `infinity_emb v2` would, from its flags and INFINITY_* variables
    (`;` between models); prints the infinity-cloud command that means the same, once."""
    import os

    from infinity_cloud.cli.infinity_compat import translate
    from infinity_cloud.models.served_model import prepare_model
    from infinity_cloud.targets.local.target import LocalTarget

    with reported_errors():
        translation = translate(given, os.environ)
        typer.secho(f"as infinity-cloud: {translation.command}", fg=typer.colors.CYAN, err=True)
        for note in translation.notes:
            typer.secho(f"  {note}", fg=typer.colors.YELLOW, err=True)
        for warning in translation.warnings:
            typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, bold=True, err=True)
        spec = load_spec(None, **translation.options)
        if translation.preload_only:
            for model in spec.models:
                typer.echo(prepare_model(model))
            return
        LocalTarget().serve(spec)


def infinity_v2_command() -> Callable[..., None]:
    """`_infinity_v2` with one option per Infinity flag (`infinity_compat.FLAGS`)."""
    from infinity_cloud.cli.infinity_compat import FLAGS

    params = []
    for flag in FLAGS:
        dashed = flag.name.replace("_", "-")
        help = f"{flag.note} [env var: {flag.env}]" if flag.note else f"[env var: {flag.env}]"
        if flag.kind is bool:
            hint: Any = bool | None
            option = typer.Option(f"--{dashed}/--no-{dashed}", help=help, show_default=False)
        else:
            hint = list[flag.kind] | None if flag.per_model else flag.kind | None  # type: ignore[name-defined]
            option = typer.Option(f"--{dashed}", help=help, show_default=False)
        params.append(inspect.Parameter(flag.name, KEYWORD, default=None, annotation=Annotated[hint, option]))
    command = functools.wraps(_infinity_v2)(lambda **kwargs: _infinity_v2(**kwargs))
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return command


