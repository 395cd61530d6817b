"""The target verbs (`build|deploy|invoke|status|delete|policy|smoke TARGET`): a command
family per verb, a command in it per target that offers the verb, each with the spec's flags
and the target's section's."""

import inspect
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from infinity_cloud.cli.common import KeyOption, fail, reported_errors, show_steps
from infinity_cloud.cli.spec_flags import with_spec
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.targets import registry
from infinity_cloud.targets.base import ROUTES, VERBS, Deployment, usage_examples

Route = Enum("Route", {name: name for name in ROUTES}, type=str)  # type: ignore[misc]


_OUT = "Folder to write the files into (created if missing; default: build/TARGET)."


def target_commands(name: str) -> dict[str, Callable[..., Any]]:
    """The commands of one target, by verb, each with the spec's and the section's flags."""
    cls = registry.target_class(name)
    default_out = Path("build") / name
    out_option = Annotated[Path, typer.Option("--out", help=_OUT)]

    def build(spec: DeploymentSpec, out: out_option = default_out) -> None:
        show_steps(spec)
        with reported_errors():
            for path in cls().build(spec, out):
                typer.echo(str(path))

    def deploy(
        spec: DeploymentSpec,
        out: out_option = default_out,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Render and check; deploy nothing.")] = False,
    ) -> None:
        show_steps(spec)
        with reported_errors():
            deployment = cls().deploy(spec, out, dry_run=dry_run)
        if deployment is None:
            typer.echo("nothing deployed (--dry-run)")
            return
        report_deployment(deployment, spec)

    def invoke(
        spec: DeploymentSpec,
        input: Annotated[list[str] | None, typer.Option("--input", help="A text to send; repeatable.")]
        = None,
        query: Annotated[str | None, typer.Option(
            "--query", help="Rerank the documents (or the inputs) against it.",
        )] = None,
        document: Annotated[list[str] | None, typer.Option(
            "--document", help="A document to rerank; repeatable.",
        )] = None,
        model: Annotated[str | None, typer.Option(
            "--model", help="The served model to call (needed when there are several).",
        )] = None,
        route: Annotated[Route | None, typer.Option(
            "--route", help="embeddings, rerank or classify (default: from the request's shape).",
        )] = None,
        key: KeyOption = None,
    ) -> None:
        body: dict[str, Any] = {"input": input or ["Hello from infinity-cloud"]}
        if query is not None:
            body = {"query": query, "documents": document or body["input"]}
        if model is not None:
            body["model"] = model
        with reported_errors():
            answer = cls().invoke(spec, body, api_key=key, route=route.value if route else None)
        import json

        typer.echo(json.dumps(answer, indent=1))

    def status(spec: DeploymentSpec) -> None:
        with reported_errors():
            for field, value in cls().status(spec).items():
                typer.echo(f"{field}: {value}")

    def delete(
        spec: DeploymentSpec,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    ) -> None:
        target = cls()
        if not yes:
            if not sys.stdin.isatty():  # no one to ask: a script says so with --yes
                raise fail(f"not interactive, so not asking: pass --yes to stop {target.describe(spec)}")
            typer.confirm(f"Stop {target.describe(spec)}?", abort=True)
        with reported_errors():
            target.delete(spec)
        typer.echo(f"stopped {target.describe(spec)}")

    def policy(
        spec: DeploymentSpec,
        which: Annotated[str, typer.Argument(help="trust, execution or deployer.")] = "deployer",
    ) -> None:
        import json

        with reported_errors():
            documents = cls().policies(spec)
        if which not in documents:
            raise fail(f"no policy {which!r}: ask for {', '.join(documents)}")
        typer.echo(json.dumps(documents[which], indent=2))

    def smoke(
        spec: DeploymentSpec,
        out: out_option = default_out,
        keep: Annotated[bool, typer.Option("--keep", help="Keep what the smoke test deployed.")] = False,
        deployed: Annotated[bool, typer.Option(
            "--deployed", help="Check the endpoint that runs now; deploy and delete nothing.",
        )] = False,
        key: KeyOption = None,
    ) -> None:
        from infinity_cloud.targets import smoke as smoke_test

        with reported_errors():
            report = smoke_test.run(
                cls(), spec, out, keep=keep, deployed=deployed, api_key=key, say=typer.echo
            )
        if not report.ok:
            raise typer.Exit(1)

    verbs = {"build": build, "deploy": deploy, "invoke": invoke, "status": status, "delete": delete,
             "policy": policy, "smoke": smoke}
    commands = {}
    for verb in cls.verbs:
        command = verbs[verb]
        command.__doc__ = _verb_help(cls, verb)
        command.__name__ = f"{verb}_{name}"
        commands[verb] = with_spec(command, target=name)
    return commands


def _verb_help(cls: type[Any], verb: str) -> str:
    method = getattr(cls, verb, None)
    doc = inspect.getdoc(method) if method is not None else None
    return doc or VERBS[verb]


def report_deployment(deployment: Deployment, spec: DeploymentSpec) -> None:
    typer.secho(f"deployed {deployment.target} {deployment.name!r}", fg=typer.colors.GREEN)
    for note in deployment.notes:
        typer.secho(f"note: {note}", fg=typer.colors.YELLOW)
    if deployment.url is None:
        command = deployment.target.replace("_", "-")
        typer.echo(f"it has no URL: `infinity-cloud invoke {command}` calls it, `infinity-cloud status "
                   f"{command}` shows its state")
        return
    typer.echo(f"endpoint: {deployment.url}\n")
    if deployment.examples is not None:
        typer.echo(deployment.examples)
        return
    from infinity_cloud.targets.container import served_name

    typer.echo(usage_examples(
        deployment.url, served_name(spec.models[0]), api_key=deployment.api_key, headers=deployment.headers
    ))
