"""Whether a bulk job did its work, the same for every runner: it stops as soon as it cannot
end well (more bad rows than `--max-errors`, or than `--max-error-rate` of its input), and it
fails, naming the cause, when no row was embedded or too many were bad. Its summary goes into
the manifest, except from a run that found nothing left to embed: that one keeps the summary
of the run that did the work."""

from __future__ import annotations

from typing import Any

from infinity_cloud.bulk.dataset import Dataset
from infinity_cloud.bulk.job import EmbedJob
from infinity_cloud.bulk.meter import Meter
from infinity_cloud.core.errors import InfinityCloudError

RESUME = "the shards written are kept, and the same command with a higher limit goes on from there"


class JobFailed(InfinityCloudError):
    """A job that embedded no row, or set aside more rows than it allows."""


def check_errors(meter: Meter, job: EmbedJob, out: str) -> None:
    """Stop the job once it cannot end well: more bad rows than --max-errors, or than
    --max-error-rate of the whole input (where its size is known)."""
    if job.max_errors is not None and meter.bad > job.max_errors:
        raise JobFailed(f"{meter.bad} bad rows, more than --max-errors {job.max_errors}: see {out}/errors/; "
                        f"{RESUME}")
    if meter.total and meter.bad > job.max_error_rate * meter.total:
        raise JobFailed(f"{_cause(meter, job, out, meter.total)} (stopped; {RESUME})")


def verdict(meter: Meter, job: EmbedJob, out: str) -> str | None:
    """Why the job failed, or None: no row embedded, or more bad rows than --max-error-rate."""
    done = meter.before + meter.rows
    if done == 0:
        return "the input holds no rows"
    if done == meter.bad or meter.bad > job.max_error_rate * done:
        return _cause(meter, job, out, done)
    return None


def _cause(meter: Meter, job: EmbedJob, out: str, of: int) -> str:
    if meter.rows and meter.missing == meter.rows:
        return f"no row has the field {job.text_field!r}; fields seen: {', '.join(sorted(meter.fields))}"
    first = meter.first_error
    example = ""
    if first:  # a reason from the engine names the row already
        row, error = first["row"], str(first["error"])
        example = f"; the first: {error if error.startswith(f'row {row} ') else f'row {row}: {error}'}"
    done = meter.before + meter.rows
    if done == meter.bad:
        return f"no row was embedded: all {done:,} were bad (see {out}/errors/{example})"
    return (f"{meter.bad:,} bad rows, more than --max-error-rate {job.max_error_rate:g} of {of:,} "
            f"(see {out}/errors/{example})")


def conclude(
    dataset: Dataset, meter: Meter, job: EmbedJob, inputs: list[dict[str, Any]], workers: int = 1,
    **more: Any,
) -> dict[str, Any]:
    """The job's summary (`more` added to the meter's), written into the manifest with the
    inputs' stamps; raises `JobFailed` with the verdict's cause."""
    stored = dataset.summary()
    if meter.rows == 0 and stored is not None:  # nothing left: the summary stays that of the work
        summary = {**stored, "shards_skipped": more.get("shards_skipped", 0),
                   "this_run": "nothing left to do"}
        dataset.finish(None, inputs)
    else:
        summary = {**meter.summary(workers=workers), **more}
        dataset.finish(summary, inputs)
    cause = verdict(meter, job, dataset.out)
    if cause:
        raise JobFailed(f"{cause}; the summary is in {dataset.out}/_manifest.json")
    return summary
