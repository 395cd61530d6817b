"""The `infinity-cloud` command: serve, show the merged spec, build deployment files."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
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
app.add_typer(config_app, name="config")
app.add_typer(build_app, name="build")

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


def fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def with_spec(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the spec options; it receives the merged `spec` instead."""
    own = [p for p in inspect.signature(fn).parameters.values() if p.name != "spec"]

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        options = {name: kwargs.pop(name) for name in SPEC_OPTIONS}
        config = options.pop("config")
        try:
            spec = load_spec(config, **options)
        except InfinityCloudError as exc:
            raise fail(exc.message) from None
        return fn(spec=spec, **kwargs)

    params = own + [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[hint, option]
        )
        for name, (hint, option) in SPEC_OPTIONS.items()
    ]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return command


@app.command()
@with_spec
def serve(spec: DeploymentSpec) -> None:
    """Serve the models over HTTP (the OpenAI-compatible API) on this machine."""
    from targets.local.target import LocalTarget

    try:
        LocalTarget().serve(spec)
    except InfinityCloudError as exc:
        raise fail(exc.message) from None


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
    from infinity_cloud.model_source import resolve_model_dir
    from infinity_cloud.served_model import ServedModel

    for model in spec.models:
        try:
            typer.echo(f"{model.name}: {resolve_model_dir(model.model_id, model.revision)}")
            if not files_only:
                served = ServedModel(model)
                served.load()
                facts = served.describe()
                served.stop()
                typer.echo(f"{model.name}: ready for {facts['backend']} ({facts['dtype']})")
        except InfinityCloudError as exc:
            raise fail(exc.message) from None


@app.command()
def version() -> None:
    """Print the version."""
    from infinity_cloud import __version__

    typer.echo(__version__)


def main() -> None:
    sys.exit(app())
