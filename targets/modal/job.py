"""`infinity-cloud embed --runner modal`: a bulk job's shards mapped over Modal containers.

The app is rendered from the spec exactly as `deploy modal` renders it, and the job runs its
`job_app`: a class on the same image (same layers, so an image built for the deployment is
reused) with one engine per container, loaded in its enter hook. This machine plans the
shards and leaves out those written (`bulk.workers.plan_job`), `.map` hands each remaining
plan to a container, which reads its rows from S3, embeds them and writes the shard whole to
the S3 output; the reports come back for the progress and the summary. Resuming, and every
row landing once, are the Dataset's rules, the same as for the other runners: a job stopped
at any point (Ctrl-C, a lost terminal, a preempted container) and run again embeds only the
shards not yet written.

The data stay on S3, reached with pyarrow's S3 client (the one the Dataset and the input
reader use everywhere) and the AWS keys of a Modal secret, rather than a CloudBucketMount or
a Volume: a mount cannot rename (the Dataset's local writes do) and a Volume would need the
input copied in and the output copied out; on S3 a shard is one atomic PUT.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from infinity_cloud.bulk.job import EmbedJob
from infinity_cloud.bulk.workers import collect, finish, job_to_json, plan_job, plan_to_json
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.targets.base import JobOptions, TargetError
from infinity_cloud.targets.modal.client import (
    JOB_CLASS,
    SHARD_RETRIES,
    SHARD_TIMEOUT_S,
    ModalError,
    import_modal,
    modal_calls,
    require_credentials,
)

if TYPE_CHECKING:
    from types import ModuleType

    from infinity_cloud.targets.modal.spec import ModalSpec


class ModalApp(Protocol):
    """What the job asks of the Modal target (`target.ModalTarget`, which runs the job): its
    settings, and the app rendered from the spec and loaded."""

    def settings(self, spec: DeploymentSpec) -> ModalSpec: ...

    def build(self, spec: DeploymentSpec, out_dir: Path) -> list[Path]: ...

    def load(self, out_dir: Path) -> ModuleType: ...

# What the job's secret must hold for pyarrow's S3 client in the containers.
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def check_reachable(job: EmbedJob, secret: str | None) -> None:
    """Refuse, before anything runs, what Modal's containers could not reach: a file or an
    output folder on this machine, or S3 with no secret to reach it with."""
    local = next((f for f in job.files if not f.startswith("s3://")), None)
    if local is not None:
        raise ConfigError(
            f"--runner modal: {local} is on this machine, which Modal's containers cannot read: copy the "
            "input to S3 (aws s3 cp) and give its s3:// path"
        )
    if not job.out.startswith("s3://"):
        raise ConfigError(
            f"--runner modal: --out {job.out} is on this machine, where Modal's containers cannot write: "
            "give an s3:// --out"
        )
    if not secret:
        raise ConfigError(
            "--runner modal needs --job-secret NAME: a Modal secret with the AWS keys its containers read "
            f"and write S3 with (modal secret create NAME {'=... '.join(S3_KEYS)}=... AWS_REGION=...)"
        )


def run_modal_job(
    target: ModalApp, spec: DeploymentSpec, job: EmbedJob, options: JobOptions
) -> dict[str, Any]:
    """Run the job to its end (or to --max-errors) on Modal; returns its summary."""
    check_reachable(job, options.secret)
    modal = import_modal()
    require_credentials()
    settings = target.settings(spec)
    # --instance-count caps the containers where given, else the app's own --max-containers.
    containers = options.instance_count if options.instance_count > 1 else settings.max_containers
    with tempfile.TemporaryDirectory(prefix="infinity-cloud-modal-job-") as out_dir:
        # The deployment's own app, rendered first (its refusals come before anything is
        # written) and kept while Modal builds its image.
        target.build(spec, Path(out_dir))
        module = target.load(Path(out_dir))
        try:
            planned = plan_job(spec, job)
        except OSError as exc:  # pyarrow's S3 errors: no keys here, no such bucket, access denied
            raise TargetError(f"could not reach the job's S3 input or output from here: {exc}") from None
        planned.meter.bar = False  # Modal's output holds the terminal: progress as lines
        if planned.todo:
            secret = modal.Secret.from_name(options.secret, required_keys=list(S3_KEYS),
                                            environment_name=settings.environment)
            # Containers' secrets are replaced, not added to: the app's own go first.
            embedder = getattr(module, JOB_CLASS).with_options(
                secrets=[*module.SECRETS, secret], max_containers=containers
            )
            # The workers need the options and the output, not the file list (their plans name it).
            worker_job = job_to_json(dataclasses.replace(job, files=()))
            plans = [plan_to_json(p) for p in planned.todo]
            missing = f"Modal has no secret {options.secret!r} for --job-secret (modal secret list)"
            if options.detach:
                return _detached(module, embedder, worker_job, plans, planned, settings, missing)
            try:
                with (
                    modal_calls("run the job", settings, missing=missing),
                    modal.enable_output(),
                    module.job_app.run(environment_name=settings.environment),
                ):
                    reports = embedder(job=worker_job).embed.map(plans, order_outputs=False)
                    try:
                        collect(planned, reports, job)
                    except modal.exception.FunctionTimeoutError as exc:  # raised once its retries are spent
                        raise ModalError(
                            f"a shard ran past the job's timeout ({SHARD_TIMEOUT_S} s) on each of its "
                            f"{SHARD_RETRIES + 1} tries ({exc}): give smaller --shard-rows"
                        ) from None
            except ModalError as exc:  # a shard failed every try, or the run was cut off
                raise ModalError(f"{exc.message}; the shards written are kept: the same command again "
                                 "embeds only the rest") from exc.__cause__
    return finish(planned, spec, "modal", containers, job, gpu=list(settings.gpu))


def _detached(module: Any, embedder: Any, worker_job: str, plans: list[str], planned: Any, settings: Any,
              missing: str) -> dict[str, Any]:
    """`--detach`: the job app deployed (an ephemeral app's calls end with it), its shards
    spawned (`spawn_map`), and back at once. Each container writes its shards whole, as in an
    attached run; the same command without --detach, once they are done, finds them written,
    maps what is left (a shard still in flight is embedded again, landing once) and writes the
    summary."""
    modal = import_modal()
    with modal_calls("start the job", settings, missing=missing), modal.enable_output():
        module.job_app.deploy(environment_name=settings.environment)
        embedder(job=worker_job).embed.spawn_map(plans)
    return {"runner": "modal", "detached": True, "app": module.job_app.name, "shards_started": len(plans),
            "shards_skipped": len(planned.done), "out": planned.dataset.out,
            "next": f"modal app logs {module.job_app.name}; then this command without --detach finishes "
                    "what is left and writes the summary"}
