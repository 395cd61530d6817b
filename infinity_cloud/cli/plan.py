"""`infinity-cloud plan`: a deployment sized (hardware, replicas, batching, autoscaling, cost)
from `bench` profiles or an estimate, and the spec `deploy` takes written."""

from pathlib import Path
from typing import Annotated

import typer

from infinity_cloud.cli.common import fail, reported_errors
from infinity_cloud.targets import registry


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

    from infinity_cloud.core.config import build_spec
    from infinity_cloud.families.folder import ModelFolder
    from infinity_cloud.models.model_source import resolve_model_dir
    from infinity_cloud.sizing import plan as planning
    from infinity_cloud.sizing import report
    from infinity_cloud.sizing.corpus import load_texts
    from infinity_cloud.sizing.estimate import Shape, calibrations, tokenizer_tokens_per_s
    from infinity_cloud.sizing.profile import Profile

    targets = planning.planned_targets(registry.planner)
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
        best, every = planning.choose(str(target), registry.planner, shape, load, calibrations(), measured,
                                      scale_to_zero, hardware, per_core, accept_contended)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    report.show_plan(planning.spelled(target), str(model_id), best, every)
    if write is not None:
        data = planning.spec_data(str(model_id), str(target), best)
        with reported_errors():
            build_spec(data, registry)  # the spec deploy will read, checked as it will check it
        write.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        verb = "serve" if target == "local" else f"deploy {planning.spelled(target)}"
        typer.echo(f"spec: {write} (infinity-cloud {verb} --config {write})")

