"""The `infinity-cloud` command: serve, show the merged spec, download models, and for each
registered target the verbs it offers (`build|deploy|invoke|status|delete TARGET`), with
flags made from its spec section."""


import functools
import inspect
import sys
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic.fields import FieldInfo

from infinity_cloud.config import (
    LIMIT_OPTIONS,
    MODEL_OPTIONS,
    SERVER_OPTIONS,
    DeploymentSpec,
    LimitsSpec,
    ModelSpec,
    ServerSpec,
    load_spec,
)
from infinity_cloud.errors import InfinityCloudError
from infinity_cloud.targets import registry
from infinity_cloud.targets.base import CLIENT_KEY_ENV, ROUTES, VERBS, Deployment, usage_examples

APP_HELP = (
    "Serve embedding, reranking and classification models behind one OpenAI-compatible "
    "API, locally or in the cloud. Every option can also be set as an INFINITY_CLOUD_* "
    "environment variable or in a YAML file given with --config (flags win, then env, then file)."
)
# The commands every installation has; `build_cli` adds the target verbs to them.
_base = typer.Typer()
config_app = typer.Typer(help="Inspect the deployment spec.", no_args_is_help=True)
_base.add_typer(config_app, name="config")

_M = "Models (repeat --model-id to serve several; give other model options once for all, or once per model)"
_S = "Server"


def _cli_type(annotation: Any) -> Any:
    """The type typer parses a field's flag as; pydantic then validates the value."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (tuple, list):
        return list[str]  # repeatable; each value validated as an item by pydantic
    if args and origin is not typing.Literal:  # Optional[X] / X | None
        return _cli_type(args[0])
    if origin is typing.Literal or annotation not in (bool, int, float):
        return str
    return annotation


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return str(value)


def field_option(name: str, info: FieldInfo, env: str | None, panel: str) -> tuple[Any, Any]:
    """A spec field as a typer option: (the type typer parses, or None, the option). The flag is
    `--field-name` (or the field's `flag`), booleans get `--x/--no-x` (or its `off`), the help
    is the field's description and its default, the variable `env` + the field's name (or its
    `env`); none when `env` is None."""
    extra: dict[str, Any] = info.json_schema_extra or {}  # type: ignore[assignment]
    hint = _cli_type(info.annotation)
    flag = str(extra.get("flag") or f"--{name.replace('_', '-')}")
    decls = (f"{flag}/{extra.get('off') or '--no-' + flag.removeprefix('--')}",) if hint is bool else (flag,)
    default = info.get_default(call_default_factory=True)
    shown = "" if default in (None, (), "") or "(default:" in (info.description or "") else (
        f" (default: {_shown(default)})"
    )
    envvar = None if env is None else f"{env}{str(extra.get('env') or name).upper()}"
    option = typer.Option(
        *decls, envvar=envvar, help=(info.description or "") + shown, rich_help_panel=panel,
        show_default=False,
    )
    return hint | None, option


def _spec_options() -> dict[str, tuple[Any, Any]]:
    """The options every spec-reading command takes, one per field a flat source sets
    (`None`: not given, so the file wins). A model's option other than a boolean is a list:
    once for all models, or once per --model-id."""
    options = {"config": (Path | None, typer.Option(
        envvar="INFINITY_CLOUD_CONFIG", help="YAML deployment spec (infinity-cloud.yaml).",
        rich_help_panel="Spec", show_default=False,
    ))}
    for name in ("model_id", *MODEL_OPTIONS):
        info = ModelSpec.model_fields[name]
        parsed = _cli_type(info.annotation)
        if parsed is not bool and typing.get_origin(parsed) is not list:
            parsed = list[parsed]  # type: ignore[valid-type]
        options[name] = (parsed | None, field_option(name, info, "INFINITY_CLOUD_", _M)[1])
    for spec, names in ((ServerSpec, SERVER_OPTIONS), (LimitsSpec, LIMIT_OPTIONS)):
        for name in names:
            options[name] = field_option(name, spec.model_fields[name], "INFINITY_CLOUD_", _S)
    return options


SPEC_OPTIONS = _spec_options()


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


KEYWORD = inspect.Parameter.KEYWORD_ONLY


def with_spec(fn: Callable[..., Any] | None = None, *, target: str | None = None) -> Any:
    """Give a command the spec options (and the flags of `target`'s spec section); it
    receives the merged `spec` instead."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != "spec"]
        section = section_options(target) if target else {}

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            options = {name: kwargs.pop(name) for name in SPEC_OPTIONS}
            if target:
                given = {field: kwargs.pop(param) for param, (field, _, _) in section.items()}
                options["sections"] = {target: given}
            config = options.pop("config")
            with reported_errors():
                spec = load_spec(config, **options)
            return fn(spec=spec, **kwargs)

        flags = [(name, hint, option) for name, (hint, option) in SPEC_OPTIONS.items()]
        flags += [(name, hint, option) for name, (_, hint, option) in section.items()]
        params = own + [
            inspect.Parameter(name, KEYWORD, default=None, annotation=Annotated[hint, option])
            for name, hint, option in flags
        ]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return command

    return decorate(fn) if fn is not None else decorate


def with_model_options(fn: Callable[..., Any]) -> Any:
    """Give a command one model's spec options, made as serve's are (`field_option`) but each
    given once and read from no variable (a shell's INFINITY_CLOUD_DTYPE, say, is meant for
    `serve`); it receives those given as `options`, a model of the spec less its `model_id`."""
    own = [p for p in inspect.signature(fn).parameters.values() if p.name != "options"]
    flags = {name: field_option(name, ModelSpec.model_fields[name], None, "Model") for name in MODEL_OPTIONS}

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in flags}
        return fn(options={k: v for k, v in given.items() if v is not None and v != []}, **kwargs)

    command.__signature__ = inspect.Signature(own + [  # type: ignore[attr-defined]
        inspect.Parameter(name, KEYWORD, default=None, annotation=Annotated[hint, option])
        for name, (hint, option) in flags.items()
    ])
    return command


def section_options(target: str) -> dict[str, tuple[str, Any, Any]]:
    """A target's spec section as CLI options: parameter name -> (field, type, typer option),
    made as the serve options are (`field_option`), the variable INFINITY_CLOUD_<TARGET>_<FIELD>."""
    section = registry.section_class(target)
    if section is None:
        return {}
    return {
        f"{target}__{field}": (field, *field_option(field, info, f"INFINITY_CLOUD_{target.upper()}_",
                                                    target.capitalize()))
        for field, info in section.model_fields.items()
    }


@_base.command()
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


Route = Enum("Route", {name: name for name in ROUTES}, type=str)  # type: ignore[misc]


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


# -- the target verbs: one command family each, one command per target that offers it -------

_OUT = "Folder to write the files into (created if missing; default: build/TARGET)."
KeyOption = Annotated[str | None, typer.Option(
    "--key", envvar=CLIENT_KEY_ENV, help="The endpoint's API key (sent as a bearer token).",
)]


def _show_steps(spec: DeploymentSpec) -> None:
    """Each slow step of a build or deploy (resolving an image's requirements, exports, a
    download) on stderr as it starts and ends: a build was silent for up to minutes."""
    from infinity_cloud.server.logs import configure_logging

    configure_logging(spec.server.log_level, spec.server.log_format)


def target_commands(name: str) -> dict[str, Callable[..., Any]]:
    """The commands of one target, by verb, each with the spec's and the section's flags."""
    cls = registry.target_class(name)
    default_out = Path("build") / name
    out_option = Annotated[Path, typer.Option("--out", help=_OUT)]

    def build(spec: DeploymentSpec, out: out_option = default_out) -> None:
        _show_steps(spec)
        with reported_errors():
            for path in cls().build(spec, out):
                typer.echo(str(path))

    def deploy(
        spec: DeploymentSpec,
        out: out_option = default_out,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Render and check; deploy nothing.")] = False,
    ) -> None:
        _show_steps(spec)
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


models_app = typer.Typer(help="Load and unload models on a running server (its admin API).",
                         no_args_is_help=True)
_base.add_typer(models_app, name="models")
_URL = Annotated[str, typer.Option("--url", envvar="INFINITY_CLOUD_URL", help="The server's URL.")]
_ADMIN_KEY = Annotated[
    str | None,
    typer.Option("--admin-key", envvar="INFINITY_CLOUD_ADMIN_KEY", help="One of the server's admin keys "
                 "(prefer the variable: a flag shows in `ps`).", show_default=False),
]


def _admin(url: str, key: str | None) -> Any:
    from infinity_cloud.admin_client import AdminClient

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
    cli.registered_commands.extend(_base.registered_commands)
    cli.registered_groups.extend(_base.registered_groups)
    families = {verb: typer.Typer(help=text, no_args_is_help=True) for verb, text in VERBS.items()}
    for name in registry.target_names():
        for verb, command in target_commands(name).items():
            # Python names in the spec (aws_lambda:), command-line names on the command line.
            families[verb].command(name.replace("_", "-"))(command)
    for verb, family in families.items():
        if family.registered_commands:
            cli.add_typer(family, name=verb)
    return cli


@_base.command()
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

    _show_steps(spec)
    for model in spec.models:
        with reported_errors():
            typer.echo(prepare_model(model, build_exports=not files_only))


# Without a terminal (a log, CI), bench writes a line at least this often.
BENCH_LINE_S = 4.0


@contextmanager
def bench_progress() -> Iterator[tuple[Callable[[str], None], Callable[[str], None]]]:
    """bench's `say` (what runs now, with its tokens/s) and `warn`, on stderr: a live line at a
    terminal; else a line whenever BENCH_LINE_S has passed, repeated if nothing new came (a
    model loading for minutes), so that a log never goes quiet."""
    import threading
    import time

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)

    def warn(text: str) -> None:
        console.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)
        latest["printed"] = time.monotonic()

    latest = {"text": "starting", "since": time.monotonic(), "printed": 0.0}

    if console.is_terminal:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as shown:
            task = shown.add_task("starting", total=None)
            yield (lambda text: shown.update(task, description=escape(text))), warn
        return
    lock = threading.Lock()

    def line() -> None:  # under the lock
        waited = time.monotonic() - latest["since"]
        console.print(escape(f"bench: {latest['text']}" + (f" ({waited:.0f} s)" if waited >= 1 else "")),
                      soft_wrap=True, highlight=False)
        latest["printed"] = time.monotonic()

    def say(text: str) -> None:
        with lock:
            if text != latest["text"]:
                latest.update(text=text, since=time.monotonic())
            if time.monotonic() - latest["printed"] >= BENCH_LINE_S:
                line()

    done = threading.Event()

    def beat() -> None:
        while not done.wait(BENCH_LINE_S / 4):
            with lock:
                if time.monotonic() - latest["printed"] >= BENCH_LINE_S:
                    line()

    beating = threading.Thread(target=beat, name="bench-progress", daemon=True)
    beating.start()
    try:
        yield say, warn
    finally:
        done.set()
        beating.join()


@_base.command()
@with_spec
def bench(
    spec: DeploymentSpec,
    url: Annotated[str | None, typer.Option(
        "--url", help="Measure the deployment at this URL (any target's, or any OpenAI-compatible server) "
        "instead of serving --model-id here.", show_default=False)] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="With --url: the served model to measure (default: its first).",
        show_default=False)] = None,
    corpus: Annotated[Path | None, typer.Option(
        "--corpus", help='Your own texts, JSON lines {"text", "kind": "query"|"passage"} (default: a '
        "built-in corpus made from Python's standard library).", show_default=False)] = None,
    shapes: Annotated[str, typer.Option(
        "--shapes", help="Request shapes, KIND:TEXTS per request, comma-separated.",
    )] = "query:1,passage:1,passage:8,passage:32",
    concurrency: Annotated[str, typer.Option(
        "--concurrency", help="Clients to try, ascending; a shape stops after two steps that add under 5% "
        "throughput.")] = "1,2,4,8,16,32",
    seconds: Annotated[float, typer.Option(
        "--seconds", min=0.1, help="Length of each run; it goes on until 20 requests are answered.")] = 5.0,
    max_seconds: Annotated[float, typer.Option(
        "--max-seconds", min=0.1, help="The longest a run may go on to have its 20 requests; one stopped "
        "short has no percentiles.")] = 120.0,
    compare: Annotated[list[str] | None, typer.Option(
        "--compare", help="Another OpenAI-compatible server (Infinity, TEI, a second deployment) to measure "
        "interleaved with this one; repeatable. Ratios are printed.", show_default=False)] = None,
    out: Annotated[Path, typer.Option(
        "--out", help="Folder for profile.json (what `plan` reads) and profile.png.")] = Path("bench"),
    key: KeyOption = None,
) -> None:
    """Measure a model: throughput and p50/p95/p99 latency against clients and request size, the
    knee, memory, the overhead of a request; a table, a plot and a profile (JSON) that `plan`
    sizes deployments from. It says when the machine was too busy for the numbers to count."""
    import asyncio

    from infinity_cloud.families.folder import ModelFolder
    from infinity_cloud.hardware import cpu_clock_ghz
    from infinity_cloud.models.model_source import resolve_model_dir
    from infinity_cloud.sizing import bench as measuring
    from infinity_cloud.sizing import report
    from infinity_cloud.sizing.conditions import Machine
    from infinity_cloud.sizing.local_server import Interrupted, local_server, stopped_by_signals

    try:
        shape_list = measuring.parse_shapes(shapes)
        clients = sorted({int(n) for n in concurrency.split(",") if n.strip()})
    except ValueError as exc:
        raise fail(str(exc)) from None
    if not clients or clients[0] < 1:
        raise fail("--concurrency takes positive numbers, e.g. 1,4,16")
    machine = Machine()
    before = machine.read()  # before bench runs anything, its own server included
    try:
        with stopped_by_signals(), bench_progress() as (say, warn):

            def measure(at: str, api_key: str | None) -> Any:
                return asyncio.run(measuring.bench(
                    at, model=model, corpus=corpus, shapes=shape_list, concurrency=clients, seconds=seconds,
                    compare=compare or (), api_key=api_key, progress=say, warn=warn, max_seconds=max_seconds,
                    machine=machine, before=before,
                ))

            try:
                if url is not None:
                    profile = measure(url, key)
                else:
                    say(f"starting a server for {', '.join(m.name for m in spec.models)}")
                    with local_server(spec) as served:
                        profile = measure(served, (spec.server.keys or (None,))[0])
                        say("stopping the server")
            except (measuring.BenchError, OSError) as exc:
                raise fail(str(exc)) from None
    except Interrupted as exc:
        typer.echo(f"bench {exc}: no profile written" + ("" if url else "; its server is stopped"), err=True)
        raise typer.Exit(128 + exc.signum) from None
    clock = cpu_clock_ghz()
    if url is None and clock:  # served here: the model's config and this CPU's clock are at hand
        try:
            folder = ModelFolder(resolve_model_dir(spec.models[0].model_id))
            measuring.add_bound(profile, folder.config, clock)
        except (ValueError, OSError, InfinityCloudError) as exc:  # not a text encoder's config
            typer.echo(f"no share of the CPU's peak: {exc}", err=True)
    out.mkdir(parents=True, exist_ok=True)
    profile.write(out / "profile.json")
    report.show(profile)
    plotted = report.plot(profile, out / "profile.png")
    if profile.request_overhead_ms is not None:
        typer.echo(f"overhead of a request: {profile.request_overhead_ms:,.2f} ms "
                   f"(at most {1000 / max(profile.request_overhead_ms, 1e-3):,.0f} requests/s)")
    if profile.contended:
        typer.secho("this profile is marked contended (the warnings above say why): measure again on a quiet "
                    "machine; plan takes it only with --accept-contended", fg=typer.colors.YELLOW, err=True)
    typer.echo(f"profile: {out / 'profile.json'}" + (f", plot: {out / 'profile.png'}" if plotted else ""))


@_base.command()
def plan(
    model_id: Annotated[str | None, typer.Option(
        "--model-id", help="The model: a local folder or a hub id already downloaded (its config.json is "
        "read).",
        show_default=False)] = None,
    target: Annotated[str | None, typer.Option(
        "--target", help="The deployment target, as `deploy` names it (those the price table covers, and "
        "local: this host; docs/sizing.md).", show_default=False)] = None,
    qps: Annotated[float | None, typer.Option(
        "--qps", min=0.001, help="Requests per second at the busiest hour.", show_default=False)] = None,
    tokens_per_request: Annotated[int, typer.Option(
        "--tokens-per-request", min=1, help="Tokens a request carries, all its texts together.")] = 256,
    texts_per_request: Annotated[int, typer.Option(
        "--texts-per-request", min=1, help="Texts a request carries.")] = 1,
    p95_ms: Annotated[float | None, typer.Option(
        "--p95-ms", min=1, help="The p95 latency to stay within, ms (default: 1,000, and the plan says so).",
        show_default=False)] = None,
    min_replicas: Annotated[int, typer.Option(
        "--min-replicas", min=1, help="Replicas kept at least where the target keeps replicas up (2: one "
        "lost leaves one serving).")] = 2,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="A profile from `bench` (here or on a deployment): measured numbers instead of the "
        "estimate, for offers of its hardware class (refused where no offer has its class).",
        show_default=False)] = None,
    accept_contended: Annotated[bool, typer.Option(
        "--accept-contended", help="Use a --profile that bench marked contended (measured on a busy "
        "machine: its numbers are low).")] = False,
    hardware: Annotated[str | None, typer.Option(
        "--hardware", help="Plan on this offer of the price table only (e.g. ml.g5.xlarge, L4).",
        show_default=False)] = None,
    scale_to_zero: Annotated[bool | None, typer.Option(
        "--scale-to-zero/--keep-warm", help="Let every replica stop when idle, or keep them (default: the "
        "target's own, as docs/sizing.md gives it).", show_default=False)] = None,
    write: Annotated[Path | None, typer.Option(
        "--write", help="Write the spec `deploy TARGET --config FILE` takes.", show_default=False)] = None,
    interactive: Annotated[bool, typer.Option(
        "--interactive", help="Ask for what was not given, on this terminal.")] = False,
) -> None:
    """Size a deployment: hardware, replicas, batch tokens, deadline, autoscaling threshold,
    expected p95 and monthly cost, each explained; from `bench` profiles, else an estimate."""

    import yaml

    from infinity_cloud.config import build_spec
    from infinity_cloud.families.folder import ModelFolder
    from infinity_cloud.models.model_source import resolve_model_dir
    from infinity_cloud.sizing import plan as planning
    from infinity_cloud.sizing import report
    from infinity_cloud.sizing.corpus import load_texts
    from infinity_cloud.sizing.estimate import Shape, calibrations, tokenizer_tokens_per_s
    from infinity_cloud.sizing.profile import Profile

    targets = planning.planned_targets()
    spelled = ", ".join(planning.spelled(t) for t in targets)
    if interactive:
        model_id = model_id or typer.prompt("Model (hub id or folder)")
        while (target or "").replace("-", "_") not in targets:
            target = typer.prompt(f"Target ({spelled})", default=planning.spelled(targets[0]))
        qps = qps or typer.prompt("Requests per second at the busiest hour", type=float)
        if p95_ms is None:
            answer = typer.prompt("p95 latency to stay within, ms (blank: 1,000)", default="",
                                  show_default=False)
            p95_ms = float(answer) if answer.strip() else None
    missing = [flag for flag, value in (("--model-id", model_id), ("--target", target), ("--qps", qps))
               if value is None]
    if missing:
        raise fail(f"give {', '.join(missing)} (or --interactive)")
    target = str(target).replace("-", "_")  # as `deploy` spells it on the command line, or as the spec does
    if target not in targets:
        raise fail(f"--target is one of {spelled}, not {planning.spelled(target)!r}")
    with reported_errors():
        folder = ModelFolder(resolve_model_dir(str(model_id)))
    try:
        shape = Shape.of(folder.config)
        measured = Profile.read(profile) if profile else None
        tokenizer_json = folder.path / "tokenizer.json"
        # This model's own tokenizer, timed on one core for a second: a replica's tokenizer bound.
        per_core = (
            tokenizer_tokens_per_s(str(tokenizer_json), load_texts(None, "passage")[:200])
            if tokenizer_json.is_file() else None
        )
        load = planning.Load(qps, tokens_per_request, texts_per_request, p95_ms, min_replicas)  # type: ignore[arg-type]
        best, every = planning.choose(str(target), shape, load, calibrations(), measured, scale_to_zero,
                                      hardware, per_core, accept_contended)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    report.show_plan(planning.spelled(target), str(model_id), best, every)
    if write is not None:
        data = planning.spec_data(str(model_id), str(target), best)
        with reported_errors():
            build_spec(data)  # the spec deploy will read, checked as it will check it
        write.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        verb = "serve" if target == "local" else f"deploy {planning.spelled(target)}"
        typer.echo(f"spec: {write} (infinity-cloud {verb} --config {write})")


@_base.command()
@with_spec
def embed(
    spec: DeploymentSpec,
    inputs: Annotated[list[str], typer.Argument(
        help="Input files, globs or s3:// prefixes: JSON Lines, Parquet, CSV or plain text "
        "(one text a line).",
        show_default=False,
    )],
    out: Annotated[str, typer.Option("--out", help="Folder (or s3:// prefix) of the Parquet dataset.")],
    runner: Annotated[str, typer.Option(
        "--runner", help="Where it runs: local (this machine), ray (the cluster at RAY_ADDRESS, else one "
        "started here), or a deployment target that runs batch jobs (docs/bulk.md).")] = "local",
    actors: Annotated[int | None, typer.Option(
        "--actors", min=1, help="Ray: engines at once (default: one per GPU, or one on CPUs).")] = None,
    job_model: Annotated[str | None, typer.Option(
        "--job-model", help="A target's job: the platform's model it runs (one its deploy made).")] = None,
    instance_type: Annotated[str | None, typer.Option(
        "--instance-type", help="A target's job: its instance type.")] = None,
    instance_count: Annotated[int, typer.Option(
        "--instance-count", min=1, help="A target's job: its instances.")] = 1,
    staging: Annotated[str | None, typer.Option(
        "--staging", help="A target's job: where its input and output go (default: OUT/_staging for an "
        "s3:// OUT).")] = None,
    region: Annotated[str | None, typer.Option("--region", help="A target's job: its region.")] = None,
    job_secret: Annotated[str | None, typer.Option(
        "--job-secret", help="A target's job: the platform's secret (holding AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY) its workers read and write S3 with.")] = None,
    detach: Annotated[bool, typer.Option(
        "--detach", help="A target's job, where it can: start it and return, the job outliving this terminal "
        "(the same command without --detach later finishes what is left and writes the summary)."
    )] = False,
    text_field: Annotated[str, typer.Option(
        "--text-field", help="The field holding each input: the text, or with --modality image or audio its "
        "path, s3:// URI, http(s) URL or data: URI.",
    )] = "text",
    modality: Annotated[str, typer.Option(
        "--modality", help="text, or image / audio for a model with that tower (CLIP, SigLIP, CLAP, "
        "ColPali).",
    )] = "text",
    id_field: Annotated[str, typer.Option(
        "--id-field", help="The field holding each row's id (absent: its row number).")] = "id",
    keep_field: Annotated[list[str] | None, typer.Option(
        "--keep-field", help="An input field to copy beside each vector; repeatable.")] = None,
    shard_rows: Annotated[int, typer.Option(
        "--shard-rows", min=1, help="Rows per output file (each written whole).")] = 1000,
    max_errors: Annotated[int | None, typer.Option(
        "--max-errors", min=0, help="Stop once more rows than this were bad (default: never).")] = None,
    max_error_rate: Annotated[float, typer.Option(
        "--max-error-rate", min=0.0, max=1.0, help="Fail where a larger share of the rows was bad, "
        "stopping as soon as the input's size shows it will be; a job that embeds no row fails too.")] = 0.01,
    prompt_name: Annotated[str | None, typer.Option(
        "--prompt-name", help="One of the model's named prompts (query, passage, ...) before each text.",
    )] = None,
    truncate: Annotated[bool, typer.Option(
        "--truncate/--no-truncate", help="Cut texts past the model's length (else they are bad rows).",
    )] = True,
) -> None:
    """Embed a corpus into a Parquet dataset: resumable (a run started again with the same
    arguments embeds only the shards not yet written), every row exactly once."""
    import asyncio
    import json

    from infinity_cloud.bulk import sources
    from infinity_cloud.bulk.job import EmbedJob
    from infinity_cloud.bulk.local_runner import run_local

    _show_steps(spec)
    if len(spec.models) != 1:
        raise fail("a bulk job embeds with one model: give one --model-id")
    from infinity_cloud.families import input_kinds  # the kinds the families declare

    if modality not in (kinds := input_kinds()):
        raise fail(f"--modality {modality!r}: use {', '.join(kinds.names)}")
    with reported_errors():
        kind = spec.models[0].embedding_dtype
        job = EmbedJob(
            tuple(sources.expand(inputs)), out, text_field, id_field, tuple(keep_field or ()), shard_rows,
            max_errors, None if kind in ("float", "float32") else kind, prompt_name, truncate, modality,
            max_error_rate,
        )
        names = registry.target_names()
        detaching = [n for n in names if registry.target_class(n).detaches_jobs]
        if detach and runner.replace("-", "_") not in detaching:
            raise fail(f"--detach: a {runner} job runs until it ends here; --runner {' or '.join(detaching)} "
                       "can start one and return")
        if runner == "ray":
            from infinity_cloud.bulk.ray_runner import run_ray

            summary = _resumable(lambda: run_ray(spec, job, actors))
        elif runner == "local":
            summary = _resumable(lambda: asyncio.run(run_local(spec, job)))
        else:
            from infinity_cloud.targets.base import JobOptions

            target = registry.target_class(runner.replace("-", "_"))
            if not target.runs_jobs:
                jobs = [n for n in names if registry.target_class(n).runs_jobs]
                raise fail(f"--runner {runner}: that target runs no batch jobs; use local, ray or "
                           f"{', '.join(jobs)}")
            options = JobOptions(job_model, instance_type, instance_count, staging, region, job_secret,
                                 detach)
            summary = _resumable(lambda: target().embed_job(spec, job, options))
    typer.echo(json.dumps(summary, indent=1))


def _resumable(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A bulk job stopped with Ctrl-C says how to go on, not a traceback (exit 130)."""
    try:
        return run()
    except KeyboardInterrupt:
        typer.secho("stopped: the shards written are kept; run the same command to resume", err=True,
                    fg=typer.colors.YELLOW)
        raise typer.Exit(130) from None


def _infinity_v2(**given: Any) -> None:
    """Serve as Infinity's `infinity_emb v2` would, from its flags and INFINITY_* variables
    (`;` between models); prints the infinity-cloud command that means the same, once."""
    import os

    from infinity_cloud.infinity_compat import translate
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


def _infinity_v2_command() -> Callable[..., None]:
    """`_infinity_v2` with one option per Infinity flag (`infinity_compat.FLAGS`)."""
    from infinity_cloud.infinity_compat import FLAGS

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


_base.command("v2", help="Infinity's command line (infinity_emb v2): its flags and INFINITY_* "
              "variables, served by infinity-cloud; prints the infinity-cloud spelling once. See "
              "docs/migrating-from-infinity.md.")(_infinity_v2_command())


@_base.command()
def version() -> None:
    """Print the version."""
    from infinity_cloud import __version__

    typer.echo(__version__)


app = build_cli()


def main() -> None:
    sys.exit(app())
