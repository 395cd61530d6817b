"""How busy the machine was around a measurement, so that `bench` can say when its numbers are
not worth keeping: the 1-minute load average (/proc/loadavg) and the share of CPU time the
hypervisor stole (/proc/stat's `steal` column), read before and after a run.

Both files count the whole machine (they are not namespaced: a container sees its host's), so
they are compared with the machine's CPUs (`os.cpu_count()`), not the cores this process may
use. Where they cannot be read (not Linux), the load average comes from `os.getloadavg()` and
the steal is not known."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
STAT = Path("/proc/stat")
# More stolen than this, and the numbers are a neighbour's as much as the model's.
STEAL_LIMIT = 0.10
_STAT_COLUMNS = 8  # user nice system idle iowait irq softirq steal (guest is inside user)


@dataclass(frozen=True)
class Reading:
    """The machine at one moment: its 1-minute load average and its CPU time counters."""

    load_avg: float | None
    cpu_total: int | None = None  # jiffies, all CPUs, since boot
    cpu_steal: int | None = None


@dataclass(frozen=True)
class Machine:
    """Where the readings come from: this machine's /proc by default, any files in a test."""

    loadavg: Path = LOADAVG
    stat: Path = STAT
    cores: int = os.cpu_count() or 1

    def read(self) -> Reading:
        try:
            load_avg: float | None = float(self.loadavg.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        try:
            line = next(r for r in self.stat.read_text().splitlines() if r.startswith("cpu "))
            ticks = [int(v) for v in line.split()[1 : 1 + _STAT_COLUMNS]]
        except (OSError, ValueError, StopIteration):
            return Reading(load_avg)
        return Reading(load_avg, sum(ticks), ticks[7] if len(ticks) > 7 else 0)


def own_load(cores: int, server_here: bool) -> float:
    """What a bench adds to the load average by itself, at its busiest: the load generator's
    one busy thread, and a server on this machine as many runnable threads as it has cores
    (its compute threads are as many; more would only wait). So a bench on an idle 2-core
    machine ends near a load of 3, which is not a sign of a busy machine."""
    return 1.0 + (cores if server_here else 0)


def judge(before: Reading, after: Reading, cores: int, own: float) -> tuple[dict[str, float], list[str]]:
    """The conditions a profile records, and what made the machine too busy (none: it was not).

    The load before is read before bench starts anything (before its server, for
    `--model-id`), so all of it is someone else's; the load after is read at the end, with
    bench's `own` load in it, which is taken off. Either beyond the machine's cores means the
    model had less than the machine to itself; so does a steal share beyond STEAL_LIMIT.
    """
    conditions: dict[str, float] = {"cores": float(cores)}
    reasons = []
    if before.load_avg is not None:
        conditions["load_avg_before"] = before.load_avg
        if before.load_avg > cores:
            reasons.append(f"the load average was {before.load_avg:.2f} before the run, on {cores} cores")
    if after.load_avg is not None:
        conditions["load_avg_after"] = after.load_avg
        if after.load_avg - own > cores:
            reasons.append(
                f"the load average was {after.load_avg:.2f} after the run, on {cores} cores "
                f"(bench's own server and clients account for about {own:g} of it)"
            )
    if None not in (before.cpu_total, after.cpu_total, before.cpu_steal, after.cpu_steal):
        spent = after.cpu_total - before.cpu_total  # type: ignore[operator]
        stolen = after.cpu_steal - before.cpu_steal  # type: ignore[operator]
        share = stolen / spent if spent > 0 else 0.0
        conditions["steal_share"] = round(share, 4)
        if share > STEAL_LIMIT:
            reasons.append(f"the hypervisor stole {share:.0%} of the CPU time during the run")
    return conditions, reasons
