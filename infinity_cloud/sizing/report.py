"""A profile as a terminal table and as a plot (throughput and p95 against clients, a line per
shape), with ratios against the servers measured beside it."""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infinity_cloud.core.install_hint import install_command
from infinity_cloud.sizing.plan import Choice
from infinity_cloud.sizing.profile import Point, Profile, shape_label

log = logging.getLogger(__name__)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def table(profile: Profile) -> Table:
    title = (
        f"{profile.model} on {profile.hardware.kind} ({profile.backend}, {profile.dtype}), "
        f"infinity-cloud {profile.package_version}"
    )
    out = Table(title=escape(title))
    for header in ("shape", "clients", "tokens/s", "texts/s", "p50 ms", "p95 ms", "p99 ms", "RSS MB", ""):
        out.add_column(header, justify="left" if header in ("shape", "") else "right", no_wrap=True)
    rivals = list(profile.compared)
    for url in rivals:
        out.add_column(f"tokens/s x vs {escape(url)}", justify="right")
        out.add_column(f"p50 x vs {escape(url)}", justify="right")
    for point in profile.points:
        row = [
            shape_label(point.kind, point.per_request),
            str(point.concurrency),
            f"{point.tokens_per_s:,.0f}",
            f"{point.texts_per_s:,.1f}",
            _ms(point.p50_ms),
            _ms(point.p95_ms),
            _ms(point.p99_ms),
            _ms(point.rss_mb),
            "knee" if point in profile.knees.values() else "",
        ]
        for url in rivals:
            theirs = _same(point, profile.compared[url])
            row += [
                _ratio(point.tokens_per_s, theirs.tokens_per_s if theirs else None),
                _ratio(theirs.p50_ms if theirs else None, point.p50_ms),
            ]
        out.add_row(*row)
    return out


def _same(point: Point, points: list[Point]) -> Point | None:
    return next(
        (
            p
            for p in points
            if (p.kind, p.per_request, p.concurrency) == (point.kind, point.per_request, point.concurrency)
        ),
        None,
    )


def show(profile: Profile, console: Console | None = None) -> None:
    console = console or Console()
    console.print(table(profile))
    for label, point in profile.knees.items():
        share = profile.bound_share(point)
        line = (
            f"{label}: knee at {point.concurrency} client(s), {point.tokens_per_s:,.0f} tokens/s, "
            f"p95 {_ms(point.p95_ms)} ms" + (f", {share:.0%} of the CPU's peak" if share else "")
        )
        for url, points in profile.compared.items():
            theirs = _same(point, points)
            if theirs is not None:
                line += (
                    f"; {_ratio(point.tokens_per_s, theirs.tokens_per_s)} the tokens/s of {url}, "
                    f"p50 {_ms(point.p50_ms)} ms vs {_ms(theirs.p50_ms)} ms"
                )
        console.print(escape(line), soft_wrap=True)


def plot(profile: Profile, path: Path) -> bool:
    """Write the PNG; False (said once, with the fix) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        log.warning("no plot written: matplotlib is not installed. Fix: %s", install_command("bench"))
        return False
    figure, (rate, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [("", profile.points), *((f" ({url})", points) for url, points in profile.compared.items())]
    shapes = list(dict.fromkeys(p.shape for p in profile.points))
    colours = {shape: f"C{i}" for i, shape in enumerate(shapes)}  # a shape's colour on every server
    for suffix, points in series:
        for shape in dict.fromkeys(p.shape for p in points):
            run = [p for p in points if p.shape == shape]
            style = {
                "color": colours.get(shape),
                "marker": "x" if suffix else "o",
                "linestyle": "--" if suffix else "-",
            }
            label = shape_label(*shape) + suffix
            rate.plot([p.concurrency for p in run], [p.tokens_per_s for p in run], label=label, **style)
            latency.plot([p.concurrency for p in run], [p.p95_ms or 0 for p in run], label=label, **style)
    for axes, ylabel in ((rate, "tokens/s"), (latency, "p95 latency, ms")):
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axes.set_xlabel("concurrent clients")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
    latency.set_yscale("log")
    rate.legend(fontsize=7)
    title = f"{profile.model}: {profile.hardware.kind}, {profile.backend} {profile.dtype}"
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _p95(choice: Choice) -> str:
    return "unbounded" if choice.p95_ms == float("inf") else f"{choice.p95_ms:,.0f}"


def show_plan(
    target: str, model: str, best: Choice, every: list[Choice], console: Console | None = None
) -> None:
    """The plan chosen, a line of reason per figure, and every offer it was chosen from: all
    formatted from the Choices `plan` computed, nothing computed here."""
    console = console or Console()
    load = best.load
    kept = (
        f"p95 within {load.p95_ms:,g} ms"
        if load.p95_ms is not None
        else f"p95 within {load.slo_ms:,g} ms (the default: no --p95-ms given)"
    )
    asked = f"{load.qps:g} requests/s of {load.tokens_per_request} tokens, {kept}"
    console.print(escape(f"{model} on {target}, for {asked}:"), soft_wrap=True)
    spread = best.capacity.spread
    lines = [
        ("hardware", best.offer.name),
        ("replicas", f"{best.replicas}" + (" (min 0: scales to zero)" if best.scales_to_zero else "")),
        ("batch_tokens", f"{best.batch_tokens:,}"),
        ("deadline_s", "the server's default" if best.deadline_s is None else f"{best.deadline_s:g}"),
        (
            "expected p95",
            f"{_p95(best)} ms" + ("" if best.meets_p95 else f" (misses the {load.slo_ms:,g} ms kept)"),
        ),
        ("monthly cost", f"${best.monthly_usd:,.0f}"),
    ]
    if spread is not None:
        lines.append(
            (
                "uncertainty",
                f"unmeasured class {best.offer.hardware_class}: x{spread[0]:g}-x{spread[1]:g} on the "
                "capacity, so on the replicas and cost: bench it there (--profile) for a measured figure",
            )
        )
    for name, value in lines:
        console.print(escape(f"  {name}: {value}"), soft_wrap=True)
    for name, reason in best.reasons.items():
        console.print(escape(f"  why {name}: {reason}"), soft_wrap=True)
    others = Table(title=f"every {target} offer")
    headers = ("offer", "class", "tokens/s a replica", "replicas", "batch", "p95 ms", "$/month", "meets p95")
    for header in headers:
        others.add_column(header, justify="left" if header in ("offer", "class") else "right", no_wrap=True)
    for choice in sorted(every, key=lambda c: c.monthly_usd):
        range_ = choice.capacity.spread
        others.add_row(
            choice.offer.name,
            choice.offer.hardware_class + (" (unmeasured)" if choice.capacity.compute.spread else ""),
            f"{choice.rate:,.0f}" + (f" x{range_[0]:g}-x{range_[1]:g}" if range_ else ""),
            str(choice.replicas),
            f"{choice.batch_tokens:,}",
            _p95(choice),
            f"{choice.monthly_usd:,.0f}",
            "yes" if choice.meets_p95 else "no",
        )
    console.print(others)
