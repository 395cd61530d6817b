"""`infinity-cloud models list|load|unload`: a running server's models, through its admin API."""

from typing import Annotated, Any

import typer

from infinity_cloud.cli.common import reported_errors
from infinity_cloud.cli.spec_flags import with_model_options

models_app = typer.Typer(help="Load and unload models on a running server (its admin API).",
                         no_args_is_help=True)
_URL = Annotated[str, typer.Option("--url", envvar="INFINITY_CLOUD_URL", help="The server's URL.")]
_ADMIN_KEY = Annotated[
    str | None,
    typer.Option("--admin-key", envvar="INFINITY_CLOUD_ADMIN_KEY", help="One of the server's admin keys "
                 "(prefer the variable: a flag shows in `ps`).", show_default=False),
]


def _admin(url: str, key: str | None) -> Any:
    from infinity_cloud.cli.admin_client import AdminClient

    return AdminClient(url, key)


@models_app.command("list")
def models_list(url: _URL = "http://127.0.0.1:7997", admin_key: _ADMIN_KEY = None) -> None:
    """Every model on the server: its state, backend and dtype."""
    from rich.console import Console
    from rich.table import Table

    with reported_errors():
        models = _admin(url, admin_key).models()
    table = Table("id", "state", "capabilities", "backend", "dtype", "device")
    for m in models:
        table.add_row(m["id"], m.get("state", ""), ",".join(m.get("capabilities") or []),
                      m.get("backend", ""), str(m.get("dtype") or ""), str(m.get("device") or ""))
    Console().print(table)


@models_app.command("load")
@with_model_options
def models_load(
    options: dict[str, Any],
    model_id: Annotated[str, typer.Argument(help="Hub id or local folder of the model (on the server).")],
    url: _URL = "http://127.0.0.1:7997",
    admin_key: _ADMIN_KEY = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait until it is ready (0: return at once).")] = 600,
) -> None:
    """Load one more model while the server serves.

    409 if its name is taken, 413 if it would not fit the memory budget; it answers 503 with
    Retry-After until ready."""
    spec = {"model_id": model_id, **options}
    with reported_errors():
        model = _admin(url, admin_key).load(spec, wait_s=wait or None)
    typer.echo(f"{model['id']}: {model.get('state')} ({model.get('backend')}, {model.get('dtype', '')})")


@models_app.command("unload")
def models_unload(
    name: Annotated[str, typer.Argument(help="The model's served name.")],
    url: _URL = "http://127.0.0.1:7997",
    admin_key: _ADMIN_KEY = None,
) -> None:
    """Unload a model, after what it was given.

    New requests to it get 503; what it was given finishes; then its memory is given back."""
    with reported_errors():
        done = _admin(url, admin_key).unload(name)
    typer.echo(f"{done['id']}: unloaded after draining {done['drained']} calls; "
               f"{done['freed_bytes'] // 2**20} MB given back")

