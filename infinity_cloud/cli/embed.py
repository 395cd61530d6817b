"""`infinity-cloud embed`: a corpus embedded into a Parquet dataset by a bulk job, run here,
on Ray or by a target that runs batch jobs. Its options come in groups, a frozen dataclass
each (`with_option_groups`): where the dataset goes, where the job runs, what it reads, how
many rows a shard holds and how many bad ones it bears, how each text meets the model. A new
option is a field of one group, and of what the group builds (the job, the target's options)."""

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from infinity_cloud.cli.common import fail, reported_errors, show_steps
from infinity_cloud.cli.option_groups import with_option_groups
from infinity_cloud.cli.spec_flags import with_spec
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.targets import registry
from infinity_cloud.targets.base import JobOptions

if TYPE_CHECKING:
    from infinity_cloud.bulk.job import EmbedJob



@dataclasses.dataclass(frozen=True)
class EmbedOutput:
    """Where the dataset goes."""

    out: Annotated[str, typer.Option("--out", help="Folder (or s3:// prefix) of the Parquet dataset.")]


@dataclasses.dataclass(frozen=True)
class EmbedRunner:
    """Where the job runs, and a target's job's own settings."""

    runner: Annotated[str, typer.Option(
        "--runner", help="Where it runs: local (this machine), ray (the cluster at RAY_ADDRESS, else one "
        "started here), or a deployment target that runs batch jobs (docs/bulk.md).")] = "local"
    actors: Annotated[int | None, typer.Option(
        "--actors", min=1, help="Ray: engines at once (default: one per GPU, or one on CPUs).")] = None
    job_model: Annotated[str | None, typer.Option(
        "--job-model", help="A target's job: the platform's model it runs (one its deploy made).")] = None
    instance_type: Annotated[str | None, typer.Option(
        "--instance-type", help="A target's job: its instance type.")] = None
    instance_count: Annotated[int, typer.Option(
        "--instance-count", min=1, help="A target's job: its instances.")] = 1
    staging: Annotated[str | None, typer.Option(
        "--staging", help="A target's job: where its input and output go (default: OUT/_staging for an "
        "s3:// OUT).")] = None
    region: Annotated[str | None, typer.Option("--region", help="A target's job: its region.")] = None
    job_secret: Annotated[str | None, typer.Option(
        "--job-secret", help="A target's job: the platform's secret (holding AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY) its workers read and write S3 with.")] = None
    detach: Annotated[bool, typer.Option(
        "--detach", help="A target's job, where it can: start it and return, the job outliving this terminal "
        "(the same command without --detach later finishes what is left and writes the summary)."
    )] = False

    def job_options(self) -> JobOptions:
        """What a target that runs batch jobs is handed."""
        return JobOptions(self.job_model, self.instance_type, self.instance_count, self.staging, self.region,
                          self.job_secret, self.detach)


@dataclasses.dataclass(frozen=True)
class EmbedSource:
    """What the job reads: the files, and the fields of each row."""

    inputs: Annotated[list[str], typer.Argument(
        help="Input files, globs or s3:// prefixes: JSON Lines, Parquet, CSV or plain text "
        "(one text a line).",
        show_default=False,
    )]
    text_field: Annotated[str, typer.Option(
        "--text-field", help="The field holding each input: the text, or with --modality image or audio its "
        "path, s3:// URI, http(s) URL or data: URI.",
    )] = "text"
    modality: Annotated[str, typer.Option(
        "--modality", help="text, or image / audio for a model with that tower (CLIP, SigLIP, CLAP, "
        "ColPali).",
    )] = "text"
    id_field: Annotated[str, typer.Option(
        "--id-field", help="The field holding each row's id (absent: its row number).")] = "id"
    keep_field: Annotated[list[str] | None, typer.Option(
        "--keep-field", help="An input field to copy beside each vector; repeatable.")] = None


@dataclasses.dataclass(frozen=True)
class EmbedRows:
    """How many rows a shard holds, and how many bad ones the job bears."""

    shard_rows: Annotated[int, typer.Option(
        "--shard-rows", min=1, help="Rows per output file (each written whole).")] = 1000
    max_errors: Annotated[int | None, typer.Option(
        "--max-errors", min=0, help="Stop once more rows than this were bad (default: never).")] = None
    max_error_rate: Annotated[float, typer.Option(
        "--max-error-rate", min=0.0, max=1.0, help="Fail where a larger share of the rows was bad, "
        "stopping as soon as the input's size shows it will be; a job that embeds no row fails too.")] = 0.01


@dataclasses.dataclass(frozen=True)
class EmbedModelUse:
    """How each text meets the model."""

    prompt_name: Annotated[str | None, typer.Option(
        "--prompt-name", help="One of the model's named prompts (query, passage, ...) before each text.",
    )] = None
    truncate: Annotated[bool, typer.Option(
        "--truncate/--no-truncate", help="Cut texts past the model's length (else they are bad rows).",
    )] = True
    output: Annotated[list[str] | None, typer.Option(
        "--output", help="A model that makes several outputs in one pass (bge-m3): dense, sparse or "
        "multi_vector, each written to its column (embedding, sparse, multi_vector), all from one pass; "
        "repeatable (default: the model's one kind, in embedding).",
    )] = None


@dataclasses.dataclass(frozen=True)
class EmbedChunks:
    """Whether each text is cut into chunks of the model's own tokens, a row each."""

    chunk_tokens: Annotated[int | None, typer.Option(
        "--chunk-tokens", min=1, help="Cut each text into chunks of at most this many of the model's own "
        "tokens (within its window), a row each: id, row, chunk, start, end, tokens, text, embedding.",
    )] = None
    overlap_tokens: Annotated[int, typer.Option(
        "--overlap-tokens", min=0, help="With --chunk-tokens: tokens consecutive chunks share.")] = 0
    late_chunking: Annotated[bool, typer.Option(
        "--late-chunking", help="With --chunk-tokens: each chunk read in the context of its whole text, "
        "then pooled (late chunking).")] = False

    def check(self) -> None:
        if self.chunk_tokens is None and (self.overlap_tokens or self.late_chunking):
            raise fail(f"{'--overlap-tokens' if self.overlap_tokens else '--late-chunking'} is for chunks: "
                       "give --chunk-tokens too")
        if self.chunk_tokens is not None and self.overlap_tokens >= self.chunk_tokens:
            raise fail(f"--overlap-tokens {self.overlap_tokens} must be below --chunk-tokens "
                       f"{self.chunk_tokens}, so each chunk moves on")


def embed_job(spec: DeploymentSpec, source: EmbedSource, output: EmbedOutput, rows: EmbedRows,
              model_use: EmbedModelUse, chunks: EmbedChunks | None = None) -> "EmbedJob":
    """The bulk job the groups describe (`EmbedJob`), its vectors in the model's embedding dtype."""
    from infinity_cloud.bulk import sources
    from infinity_cloud.bulk.job import EmbedJob

    kind = spec.models[0].embedding_dtype
    outputs = tuple(dict.fromkeys(model_use.output or ()))
    unknown = [name for name in outputs if name not in ("dense", "sparse", "multi_vector")]
    if unknown:
        raise typer.BadParameter(f"{unknown[0]!r}: an output is dense, sparse or multi_vector",
                                 param_hint="--output")
    chunks = chunks or EmbedChunks()
    if chunks.chunk_tokens is not None and set(outputs) - {"dense"}:
        raise fail("--chunk-tokens writes each chunk's dense vector: drop --output sparse/multi_vector, "
                   "or embed without chunks")
    return EmbedJob(
        files=tuple(sources.expand(source.inputs)), out=output.out, text_field=source.text_field,
        id_field=source.id_field, keep=tuple(source.keep_field or ()), shard_rows=rows.shard_rows,
        max_errors=rows.max_errors, output_dtype=None if kind in ("float", "float32") else kind,
        prompt_name=model_use.prompt_name, truncate=model_use.truncate, modality=source.modality,
        max_error_rate=rows.max_error_rate, outputs=outputs, chunk_tokens=chunks.chunk_tokens,
        overlap_tokens=chunks.overlap_tokens, late_chunking=chunks.late_chunking,
    )


# The groups' order is the order --help lists their flags in.
@with_spec
@with_option_groups
def embed(
    spec: DeploymentSpec, output: EmbedOutput, run: EmbedRunner, source: EmbedSource, rows: EmbedRows,
    model_use: EmbedModelUse, chunks: EmbedChunks,
) -> None:
    """Embed a corpus into a Parquet dataset: resumable (a run started again with the same
    arguments embeds only the shards not yet written), every row exactly once."""
    import asyncio
    import json

    from infinity_cloud.bulk.local_runner import run_local

    show_steps(spec)
    if len(spec.models) != 1:
        raise fail("a bulk job embeds with one model: give one --model-id")
    from infinity_cloud.families import input_kinds  # the kinds the families declare

    if source.modality not in (kinds := input_kinds()):
        raise fail(f"--modality {source.modality!r}: use {', '.join(kinds.names)}")
    chunks.check()
    runner = run.runner
    with reported_errors():
        job = embed_job(spec, source, output, rows, model_use, chunks)
        names = registry.target_names()
        detaching = [n for n in names if registry.target_class(n).detaches_jobs]
        if run.detach and runner.replace("-", "_") not in detaching:
            raise fail(f"--detach: a {runner} job runs until it ends here; --runner {' or '.join(detaching)} "
                       "can start one and return")
        if runner == "ray":
            from infinity_cloud.bulk.ray_runner import run_ray

            summary = _resumable(lambda: run_ray(spec, job, run.actors))
        elif runner == "local":
            summary = _resumable(lambda: asyncio.run(run_local(spec, job)))
        else:
            target = registry.target_class(runner.replace("-", "_"))
            if not target.runs_jobs:
                jobs = [n for n in names if registry.target_class(n).runs_jobs]
                raise fail(f"--runner {runner}: that target runs no batch jobs; use local, ray or "
                           f"{', '.join(jobs)}")
            summary = _resumable(lambda: target().embed_job(spec, job, run.job_options()))
    typer.echo(json.dumps(summary, indent=1))


def _resumable(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A bulk job stopped with Ctrl-C says how to go on, not a traceback (exit 130)."""
    try:
        return run()
    except KeyboardInterrupt:
        typer.secho("stopped: the shards written are kept; run the same command to resume", err=True,
                    fg=typer.colors.YELLOW)
        raise typer.Exit(130) from None
