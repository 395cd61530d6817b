"""`infinity-cloud config show`: the merged deployment spec, its secrets masked."""

from enum import Enum
from typing import Annotated

import typer

from infinity_cloud.cli.spec_flags import with_spec
from infinity_cloud.core.config import DeploymentSpec

config_app = typer.Typer(help="Inspect the deployment spec.", no_args_is_help=True)


class Format(str, Enum):
    yaml = "yaml"
    json = "json"


@config_app.command("show")
@with_spec
def config_show(
    spec: DeploymentSpec,
    format: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.yaml,
) -> None:
    """Print the merged deployment spec (file, then environment, then flags); keys and the
    cache's password masked."""
    from infinity_cloud.cache.redis_store import redacted

    data = spec.model_dump(mode="json")
    server = data["server"]
    for keys in ("api_keys", "admin_keys"):
        server[keys] = ["***"] * len(server[keys])
    if server["cache_url"]:
        server["cache_url"] = redacted(server["cache_url"])
    if format is Format.json:
        import json

        typer.echo(json.dumps(data, indent=2))
    else:
        import yaml

        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())

