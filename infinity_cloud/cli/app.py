"""The `infinity-cloud` command assembled: each verb's module gives its command, and every
registered target its `VERB TARGET` commands."""

import typer

from infinity_cloud.cli.bench import bench
from infinity_cloud.cli.config_show import config_app
from infinity_cloud.cli.deploy import target_commands
from infinity_cloud.cli.download import download
from infinity_cloud.cli.embed import embed
from infinity_cloud.cli.models import models_app
from infinity_cloud.cli.plan import plan
from infinity_cloud.cli.serve import V2_HELP, infinity_v2_command, serve
from infinity_cloud.targets import registry
from infinity_cloud.targets.base import VERBS

APP_HELP = (
    "Serve embedding, reranking and classification models behind one OpenAI-compatible "
    "API, locally or in the cloud. Every option can also be set as an INFINITY_CLOUD_* "
    "environment variable or in a YAML file given with --config (flags win, then env, then file)."
)


def version() -> None:
    """Print the version."""
    from infinity_cloud.core.version import __version__

    typer.echo(__version__)


def build_cli() -> typer.Typer:
    """The `infinity-cloud` command, with a VERB TARGET command for each verb every known
    target offers. Made anew after a target is registered at run time."""
    cli = typer.Typer(
        name="infinity-cloud",
        help=APP_HELP,
        no_args_is_help=True,
        rich_markup_mode="rich",
        pretty_exceptions_enable=False,
    )
    for command in (serve, download, bench, plan, embed):
        cli.command()(command)
    cli.command("v2", help=V2_HELP)(infinity_v2_command())
    cli.command()(version)
    cli.add_typer(config_app, name="config")
    cli.add_typer(models_app, name="models")
    families = {verb: typer.Typer(help=text, no_args_is_help=True) for verb, text in VERBS.items()}
    for name in registry.target_names():
        for verb, command in target_commands(name).items():
            # Python names in the spec (aws_lambda:), command-line names on the command line.
            families[verb].command(name.replace("_", "-"))(command)
    for verb, family in families.items():
        if family.registered_commands:
            cli.add_typer(family, name=verb)
    return cli
