"""How far a bulk job is: a bar on a terminal, else a line every few seconds, with texts per
second and the time left; and the summary at the end."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("infinity_cloud")
LINE_EVERY_S = 5.0


@dataclass
class Meter:
    total: int | None  # rows in the input, where known
    before: int = 0  # rows done by an earlier run (resumed)
    errors_before: int = 0  # bad rows among them
    rows: int = 0  # rows this run, bad ones too
    tokens: int = 0
    errors: int = 0  # bad rows this run
    missing: int = 0  # bad rows this run for want of the text field
    fields: set[str] = field(default_factory=set)  # the fields those rows had
    first_error: dict[str, Any] | None = None  # the first bad row reported this run
    # A bar on a terminal; off where another live display (Modal's) holds the terminal.
    bar: bool = True
    started: float = field(default_factory=time.perf_counter)
    _said: float = 0.0
    _bar: Any = None
    _task: Any = None

    def __enter__(self) -> Meter:
        if self.bar and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("embedding"),
                BarColumn(),
                TextColumn("{task.completed:,}/{task.total:,}"),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("embed", total=self.total, completed=self.before, rate="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def embedded(self) -> int:
        """Rows embedded this run."""
        return self.rows - self.errors

    @property
    def bad(self) -> int:
        """Bad rows over every shard done, this run's and before."""
        return self.errors_before + self.errors

    @property
    def rate(self) -> float:
        """Texts embedded a second (a bad row costs nothing and counts for nothing)."""
        return self.embedded / self.seconds if self.seconds > 0 else 0.0

    def add(self, report: Mapping[str, Any]) -> None:
        """A shard's report (`ShardResult.report`)."""
        rows = report["rows"]
        self.rows, self.tokens, self.errors = (self.rows + rows, self.tokens + report["tokens"],
                                               self.errors + report["errors"])
        self.missing += report.get("missing", 0)
        self.fields.update(report.get("fields", ()))
        first = report.get("first_error")
        if first is not None and (self.first_error is None or first["row"] < self.first_error["row"]):
            self.first_error = first
        if self._bar is not None:
            self._bar.update(self._task, advance=rows, rate=f"{self.rate:,.0f} texts/s")
            return
        if time.perf_counter() - self._said >= LINE_EVERY_S:
            self._said = time.perf_counter()
            log.info("embedded %s", self.line())

    def line(self) -> str:
        done = self.before + self.rows
        of = f" of {self.total:,} ({done / self.total:.1%})" if self.total else ""
        left = ""
        if self.total and self.rate > 0:
            left = f", about {_duration((self.total - done) / self.rate)} left"
        return f"{done:,} rows{of}, {self.rate:,.0f} texts/s{left}"

    def summary(self, workers: int = 1) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "embedded": self.embedded,
            "rows_before": self.before,
            "bad_rows": self.bad,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 1),
            "texts_per_s": round(self.rate, 1),
            "texts_per_s_per_worker": round(self.rate / max(workers, 1), 1),
            "workers": workers,
        }


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
