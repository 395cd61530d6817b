"""The `infinity-cloud` command: serve, show the merged spec, build deployment files."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from infinity_cloud.config import DEFAULT_MODEL_ID, DeploymentSpec, load_spec
from infinity_cloud.errors import InfinityCloudError

app = typer.Typer(
    name="infinity-cloud",
    help="Serve embedding, reranking and classification models behind one OpenAI-compatible "
    "API, locally or in the cloud. Every option can also be set as an INFINITY_CLOUD_* "
    "environment variable or in a YAML file given with --config (flags win, then env, then file).",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the deployment spec.", no_args_is_help=True)
build_app = typer.Typer(help="Render deployment files for a target.", no_args_is_help=True)
deploy_app = typer.Typer(help="Render and deploy to a cloud target.", no_args_is_help=True)
status_app = typer.Typer(help="Show a deployment's state and URL.", no_args_is_help=True)
delete_app = typer.Typer(help="Stop a deployment.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(build_app, name="build")
app.add_typer(deploy_app, name="deploy")
app.add_typer(status_app, name="status")
app.add_typer(delete_app, name="delete")

_M = "Models (repeat --model-id to serve several; give other model options once for all, or once per model)"
_S = "Server"


def _opt(env: str, help: str, panel: str, *decls: str) -> Any:
    return typer.Option(
        *decls, envvar=f"INFINITY_CLOUD_{env}", help=help, rich_help_panel=panel, show_default=False
    )


# The options every spec-reading command takes; `None` means "not given" so the file wins.
SPEC_OPTIONS: dict[str, tuple[Any, Any]] = {
    "config": (Path | None, _opt("CONFIG", "YAML deployment spec (infinity-cloud.yaml).", "Spec")),
    "model_id": (
        list[str] | None,
        _opt("MODEL_ID", f"Hub id or local folder of a model (default: {DEFAULT_MODEL_ID}).", _M),
    ),
    "served_model_name": (list[str] | None, _opt("SERVED_MODEL_NAME", "Name clients send as 'model'.", _M)),
    "revision": (list[str] | None, _opt("REVISION", "Hub revision (branch, tag or commit).", _M)),
    "backend": (
        list[str] | None,
        _opt("BACKEND", "auto (the fastest installed), openvino, onnx, torch or ctranslate2.", _M),
    ),
    "device": (list[str] | None, _opt("DEVICE", "auto, cpu, cuda or cuda:N (default: auto).", _M)),
    "dtype": (
        list[str] | None,
        _opt("DTYPE", "auto, float32, float16, bfloat16 or int8 (auto: bf16 on AMX if faithful).", _M),
    ),
    "batch_tokens": (list[int] | None, _opt("BATCH_TOKENS", "Padded tokens per batch (default: 16384).", _M)),
    "max_batch_size": (
        list[int] | None,
        _opt("MAX_BATCH_SIZE", "Inputs per batch (default: the backend's, 16 openvino, 64 others).", _M),
    ),
    "batch_wait_ms": (
        list[float] | None,
        _opt("BATCH_WAIT_MS", "Wait for more inputs when a batch would start short (default: 0).", _M),
    ),
    "length_buckets": (
        list[str] | None,
        _opt("LENGTH_BUCKETS", "Static shapes: pad lengths up to one of e.g. 64,128,256,512.", _M),
    ),
    "batch_buckets": (
        list[str] | None,
        _opt("BATCH_BUCKETS", "Static shapes: pad batch rows up to one of e.g. 1,8,32.", _M),
    ),
    "queue_size": (list[int] | None, _opt("QUEUE_SIZE", "Queued inputs before 429 (default: 16384).", _M)),
    "pooling": (list[str] | None, _opt("POOLING", "Override pooling: mean, cls, lasttoken, max.", _M)),
    "max_length": (list[int] | None, _opt("MAX_LENGTH", "Cap on input tokens.", _M)),
    "host": (str | None, _opt("HOST", "Address to bind (default: 127.0.0.1).", _S)),
    "port": (int | None, _opt("PORT", "Port (default: 7997).", _S)),
    "api_keys": (
        list[str] | None,
        _opt("API_KEY", "Require 'Authorization: Bearer KEY'; repeat for several keys.", _S, "--api-key"),
    ),
    "url_prefix": (str | None, _opt("URL_PREFIX", "Serve every route under this path.", _S)),
    "cors_origins": (
        list[str] | None,
        _opt(
            "CORS_ORIGIN",
            "Allow browser calls from this origin ('*' for any); repeatable.",
            _S,
            "--cors-origin",
        ),
    ),
    "log_level": (str | None, _opt("LOG_LEVEL", "debug, info, warning or error.", _S)),
    "max_inputs_per_request": (
        int | None,
        _opt("MAX_INPUTS_PER_REQUEST", "Inputs per request (default: 2048).", _S),
    ),
    "max_payload_bytes": (int | None, _opt("MAX_PAYLOAD_BYTES", "Body size limit (default: 16 MiB).", _S)),
}


# Per-target options: (field, type, flag, help). In a command's signature each is named
# `<section>_<field>`; its variable is INFINITY_CLOUD_<SECTION>_<FLAG>.
_TARGET_FLAGS: dict[str, list[tuple[str, Any, str, str]]] = {
    "modal": [
        ("app_name", str, "--app-name", "Modal app name (default: infinity-cloud)."),
        ("environment", str, "--environment", "Modal environment (default: the profile's)."),
        ("gpu", list[str], "--gpu", "GPU: L4, A10G, A100-80GB, H100, 'H100:2', ...; repeat (or L4,A10G) "
         "for a fallback list. None: CPU only."),
        ("cpu", float, "--cpu", "CPU cores per container."),
        ("memory_mib", int, "--memory", "Memory per container, MiB."),
        ("min_containers", int, "--min-containers", "Containers kept warm (default: 0)."),
        ("max_containers", int, "--max-containers", "Cap on containers."),
        ("buffer_containers", int, "--buffer-containers", "Idle containers kept ready under load."),
        ("scaledown_window", int, "--scaledown-window", "Idle seconds before a container stops, 2-3600 "
         "(default: 300)."),
        ("max_inputs", int, "--max-inputs", "Requests one container takes at once "
         "(default: from the batcher)."),
        ("target_inputs", int, "--target-inputs", "Requests per container the autoscaler aims for "
         "(default: two batches)."),
        ("timeout_s", int, "--timeout", "Longest a container works on one request, s (default: 600; "
         "Modal redirects web requests past 150 s)."),
        ("startup_timeout_s", int, "--startup-timeout", "Longest model loading may take, s (default: 1200)."),
        ("memory_snapshot", bool, "--memory-snapshot/--no-memory-snapshot",
         "Snapshot the loaded engine for fast cold starts."),
        ("secrets", list[str], "--secret", "Modal secret for the image build and the containers "
         "(e.g. one holding HF_TOKEN); repeatable."),
        ("api_key_secret", str, "--api-key-secret", "Modal secret whose INFINITY_CLOUD_ENDPOINT_KEYS "
         "(space-separated) the endpoint requires as bearer keys."),
        ("requires_proxy_auth", bool, "--proxy-auth/--no-proxy-auth",
         "Also require Modal's proxy-auth headers."),
    ],
}
TARGET_OPTIONS: dict[str, dict[str, tuple[Any, Any]]] = {
    section: {
        field: (
            hint | None,
            _opt(
                f"{section.upper()}_" + flag.split("/")[0].removeprefix("--").replace("-", "_").upper(),
                help, section.capitalize(), flag,
            ),
        )
        for field, hint, flag, help in flags
    }
    for section, flags in _TARGET_FLAGS.items()
}


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


def with_spec(fn: Callable[..., Any] | None = None, *, sections: tuple[str, ...] = ()) -> Any:
    """Give a command the spec options (and those of the target `sections`); it receives the
    merged `spec` instead."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != "spec"]
        extra = {f"{s}_{name}": option for s in sections for name, option in TARGET_OPTIONS[s].items()}

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            options = {name: kwargs.pop(name) for name in SPEC_OPTIONS}
            for section in sections:
                options[section] = {name: kwargs.pop(f"{section}_{name}") for name in TARGET_OPTIONS[section]}
            config = options.pop("config")
            with reported_errors():
                spec = load_spec(config, **options)
            return fn(spec=spec, **kwargs)

        params = own + [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[hint, option]
            )
            for name, (hint, option) in {**SPEC_OPTIONS, **extra}.items()
        ]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return command

    return decorate(fn) if fn is not None else decorate


@app.command()
@with_spec
def serve(spec: DeploymentSpec) -> None:
    """Serve the models over HTTP (the OpenAI-compatible API) on this machine."""
    from targets.local.target import LocalTarget

    with reported_errors():
        LocalTarget().serve(spec)


class Format(str, Enum):
    yaml = "yaml"
    json = "json"


@config_app.command("show")
@with_spec
def config_show(
    spec: DeploymentSpec,
    format: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.yaml,
) -> None:
    """Print the merged deployment spec (file, then environment, then flags)."""
    data = spec.model_dump(mode="json")
    if format is Format.json:
        import json

        typer.echo(json.dumps(data, indent=2))
    else:
        import yaml

        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


@build_app.command("local")
@with_spec
def build_local(
    spec: DeploymentSpec,
    out: Annotated[Path, typer.Option("--out", help="Folder to write the files into.")] = Path("build/local"),
) -> None:
    """Write a Dockerfile, a compose file and the spec for running the server in a container."""
    from targets.local.target import LocalTarget

    for path in LocalTarget().build(spec, out):
        typer.echo(str(path))


_OUT_MODAL = typer.Option("--out", help="Folder to write the app into.")


@build_app.command("modal")
@with_spec(sections=("modal",))
def build_modal(spec: DeploymentSpec, out: Annotated[Path, _OUT_MODAL] = Path("build/modal")) -> None:
    """Render a Modal app (modal_app.py) and the spec it was made from."""
    from targets.modal.target import ModalTarget

    with reported_errors():
        for path in ModalTarget().build(spec, out):
            typer.echo(str(path))


@deploy_app.command("modal")
@with_spec(sections=("modal",))
def deploy_modal(
    spec: DeploymentSpec,
    out: Annotated[Path, _OUT_MODAL] = Path("build/modal"),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Render and load the app with Modal; deploy nothing.")
    ] = False,
) -> None:
    """Build the Modal app and deploy it: an autoscaling endpoint with the models baked in."""
    from targets.modal.target import ModalTarget, usage_examples

    with reported_errors():
        deployment = ModalTarget().deploy(spec, out, dry_run=dry_run)
    if deployment is None:
        typer.echo(f"{out / 'modal_app.py'} loads with the Modal client; nothing deployed (--dry-run)")
        return
    typer.secho(f"deployed Modal app {deployment.app_name!r}", fg=typer.colors.GREEN)
    if deployment.url is None:
        typer.echo("Modal printed the endpoint URL above; `infinity-cloud status modal` shows it again.")
        return
    typer.echo(f"endpoint: {deployment.url}\n")
    typer.echo(
        usage_examples(
            deployment.url, spec.models[0].name, url_prefix=spec.server.url_prefix,
            api_key=spec.modal.api_key_secret is not None,
        )
    )


@status_app.command("modal")
@with_spec(sections=("modal",))
def status_modal(spec: DeploymentSpec) -> None:
    """The deployed Modal app's state and endpoint URL."""
    from targets.modal.target import ModalTarget

    with reported_errors():
        facts = ModalTarget().status(spec)
    for key, value in facts.items():
        typer.echo(f"{key}: {value}")


@delete_app.command("modal")
@with_spec(sections=("modal",))
def delete_modal(
    spec: DeploymentSpec,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Stop the deployed Modal app (its containers end; its URL stops answering)."""
    from targets.modal.target import ModalTarget

    if not yes:
        typer.confirm(f"Stop the Modal app {spec.modal.app_name!r}?", abort=True)
    with reported_errors():
        ModalTarget().delete(spec)
    typer.echo(f"stopped Modal app {spec.modal.app_name!r}")


@app.command()
@with_spec
def download(
    spec: DeploymentSpec,
    files_only: Annotated[
        bool, typer.Option("--files-only", help="Only fetch the files; build no backend exports.")
    ] = False,
) -> None:
    """Fetch every model's files and build its backend's exports (ONNX, OpenVINO IR, ...) once,
    so that a server or image started later does neither."""
    from infinity_cloud.served_model import prepare_model

    for model in spec.models:
        with reported_errors():
            typer.echo(prepare_model(model, build_exports=not files_only))


@app.command()
def version() -> None:
    """Print the version."""
    from infinity_cloud import __version__

    typer.echo(__version__)


def main() -> None:
    sys.exit(app())
