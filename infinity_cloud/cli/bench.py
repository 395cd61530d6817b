"""`infinity-cloud bench`: a model measured (here, or a deployment at a URL) into a profile
that `plan` sizes deployments from, with its progress on stderr."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from infinity_cloud.cli.common import KeyOption, fail
from infinity_cloud.cli.spec_flags import with_spec
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import InfinityCloudError

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

    from infinity_cloud.core.hardware import cpu_clock_ghz
    from infinity_cloud.families.folder import ModelFolder
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
