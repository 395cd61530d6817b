"""`infinity-cloud bench`: throughput and latency of a served model against concurrency and
request size, over HTTP, as a `Profile`.

For each shape (a kind of text and texts per request) the clients are raised 1, 2, 4, ...
until the knee is behind: two steps in a row that add under `FLAT_GAIN` throughput. Every
point is a closed-loop run (`load.load`) on the same batches; with servers to compare, each
point runs on every server in turn, the order reversed on every other point, so drift on the
machine hits all alike (as benchmarks/vs_infinity.py does). Tokens are counted once, by the
measured server's own tokenizer (its `/tokenize`, capped at the model's input limit), and the
same counts are used for every server: Infinity's `usage` counts characters.

Every point runs until it has MIN_REQUESTS answers (at least `seconds`, at most `max_seconds`:
one cut short has no percentiles). The machine's load and CPU steal are read before and after
(`conditions`): a profile measured on a busy machine is marked `contended`."""

from __future__ import annotations

import datetime
import ipaddress
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from infinity_cloud.sizing.conditions import Machine, Reading, judge, own_load
from infinity_cloud.sizing.corpus import KINDS, load_texts
from infinity_cloud.sizing.load import MIN_REQUESTS, Batch, LoadRun, load, make_batches
from infinity_cloud.sizing.profile import Hardware, Point, Profile, knee, shape_label

CONCURRENCY = (1, 2, 4, 8, 16, 32)
SHAPES = (("query", 1), ("passage", 1), ("passage", 8), ("passage", 32))
# A step that adds less throughput than this is flat; two flat steps end a shape's sweep.
FLAT_GAIN = 0.05
# Requests cycled per point: enough distinct texts that a lucky length does not flatter one
# point. They repeat, so a server with its result cache on answers them from it after the
# first pass: measure the model with the cache off (docs/sizing.md).
BATCHES_PER_POINT = 32
# The longest a point runs to have MIN_REQUESTS answers, by default.
MAX_SECONDS = 120.0
# The request whose cost is the server's own (`request_overhead`): one short text.
OVERHEAD_TEXT = "a"
_RSS = re.compile(r"^process_resident_memory_bytes(?:\{[^}]*\})?\s+([0-9.eE+]+)", re.MULTILINE)


class BenchError(RuntimeError):
    """A server that cannot be measured (unreachable, no model, refuses the requests)."""


@dataclass(frozen=True)
class Server:
    url: str
    model: str
    headers: dict[str, str]
    facts: dict[str, Any]


def parse_shapes(text: str) -> list[tuple[str, int]]:
    """`query:1,passage:32` as [("query", 1), ("passage", 32)]."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, size = part.partition(":")
        if kind not in KINDS or not size.isdigit() or int(size) < 1:
            raise ValueError(f"a shape is KIND:TEXTS with KIND one of {', '.join(KINDS)}, got {part!r}")
        shapes.append((kind, int(size)))
    if not shapes:
        raise ValueError("no shape given")
    return shapes


async def connect(url: str, model: str | None, api_key: str | None) -> Server:
    """The server at `url` and the model to measure (the one named, else its first)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = url.rstrip("/")
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        try:
            response = await client.get("/models")
        except httpx.HTTPError as exc:
            raise BenchError(f"{url} cannot be reached ({type(exc).__name__}: {exc})") from exc
        if response.status_code != 200:
            raise BenchError(f"{url}/models answered {response.status_code}: {response.text[:200]}")
        listed = response.json().get("data") or []
    if not listed:
        raise BenchError(f"{url} serves no model")
    facts = (
        listed[0]
        if model is None
        else next((m for m in listed if model == m.get("id") or model in (m.get("aliases") or ())), None)
    )
    if facts is None:
        served = ", ".join(str(m.get("id")) for m in listed)
        raise BenchError(f"{url} does not serve {model!r}; it serves {served}")
    return Server(url, facts["id"], headers, facts)


async def token_counts(server: Server, texts: Sequence[str]) -> list[int] | None:
    """Tokens per text as the server's model counts them, capped at its input limit; None where
    the server has no `/tokenize` (then each server's `usage` is trusted)."""
    cap = server.facts.get("max_input_tokens")
    counts: list[int] = []
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as client:
        for start in range(0, len(texts), 256):
            chunk = list(texts[start : start + 256])
            response = await client.post("/tokenize", json={"inputs": chunk, "model": server.model})
            if response.status_code != 200:
                return None
            counts += [min(len(row), cap) if cap else len(row) for row in response.json()]
    return counts


async def rss_mb(server: Server) -> float | None:
    """The server process's resident memory from its /metrics, where it exports it."""
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=10) as client:
            response = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    found = _RSS.search(response.text) if response.status_code == 200 else None
    return round(float(found.group(1)) / 2**20, 1) if found else None


def hardware_of(facts: dict[str, Any]) -> Hardware:
    host = facts.get("host") or {}
    return Hardware(
        device=host.get("device") or facts.get("device") or "cpu",
        cpu=host.get("cpu", ""),
        cores=host.get("cores"),
        kernel_flags=list(host.get("kernel_flags") or ()),
    )


Progress = Callable[[str], None]


async def bench(
    url: str,
    *,
    model: str | None = None,
    corpus: Path | None = None,
    shapes: Sequence[tuple[str, int]] = SHAPES,
    concurrency: Sequence[int] = CONCURRENCY,
    seconds: float = 5.0,
    compare: Sequence[str] = (),
    api_key: str | None = None,
    progress: Progress | None = None,
    warn: Progress | None = None,
    max_seconds: float = MAX_SECONDS,
    machine: Machine | None = None,
    before: Reading | None = None,
) -> Profile:
    """Measure the model at `url` (and each server of `compare`, interleaved) at every shape,
    then its per-request overhead. `before` is the machine read before bench started anything
    (a server of its own included); else it is read now. Why a profile is `contended` goes to
    `warn`."""
    say = progress or (lambda _: None)
    warn = warn or say
    machine = machine or Machine()
    before = before or machine.read()
    primary = await connect(url, model, api_key)
    rivals = [await connect(other, None, None) for other in compare]
    pools, averages = await request_pools(primary, corpus, shapes, say)
    profile = await new_profile(primary, rivals, corpus, averages)
    servers = [primary, *rivals]
    step = 0
    for kind, size in shapes:
        batches = pools[(kind, size)]
        for server in servers:  # each server's first requests of this shape, not timed
            await load(server.url, server.model, batches[:4], 2, min(1.0, seconds), server.headers)
        step = await sweep(
            profile, servers, kind, size, batches, Pace(concurrency, seconds, max_seconds), step, say, warn
        )
        found = knee([p for p in profile.points if p.shape == (kind, size)])
        if found is not None:
            profile.knees[shape_label(kind, size)] = found
    clients = max(concurrency)
    profile.request_overhead_ms = await request_overhead(
        primary, clients, Pace((clients,), seconds, max_seconds), profile, say
    )
    profile.conditions, reasons = judge(
        before, machine.read(), machine.cores, own_load(machine.cores, on_this_machine(primary.url))
    )
    profile.contended = bool(reasons)
    for reason in reasons:
        warn(reason)
    return profile


@dataclass(frozen=True)
class Pace:
    """How long each point runs: `seconds`, and on to MIN_REQUESTS answers, at most `max_seconds`."""

    concurrency: Sequence[int]
    seconds: float
    max_seconds: float

    async def run(
        self, server: Server, batches: Sequence[Batch], clients: int, tick: Callable[[LoadRun], None]
    ) -> LoadRun:
        return await load(
            server.url, server.model, batches, clients, self.seconds, server.headers,
            min_requests=MIN_REQUESTS, limit_s=self.max_seconds, tick=tick,
        )


def on_this_machine(url: str) -> bool:
    """A server at a loopback address runs here: its load is bench's own."""
    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def running(label: str, run: LoadRun) -> str:
    """A point's progress line: what runs, and its tokens/s and answers so far."""
    rate = run.tokens / run.elapsed_s if run.elapsed_s else 0.0
    return f"{label}: {rate:,.0f} tokens/s, {len(run.latencies_s)} requests, {run.elapsed_s:.0f} s"


async def request_overhead(
    server: Server, clients: int, pace: Pace, profile: Profile, say: Progress
) -> float | None:
    """What the server spends on a request beyond compute, in ms: `clients` send one-token
    texts (OVERHEAD_TEXT), whose compute is next to nothing, as fast as it answers; the
    overhead is 1000 / its requests per second, less those tokens' time at the profile's best
    tokens/s. This is the bound on a replica's requests per second that plan uses (a lone
    request's latency would say what one client waits, not what a replica can answer). With
    the load generator on the same machine it is pessimistic: the clients take CPU too. None
    where the run was cut short or nothing was answered."""
    counts = await token_counts(server, [OVERHEAD_TEXT])
    batches = [Batch([OVERHEAD_TEXT], counts[0] if counts else None)]
    label = f"overhead of a request, {clients} client(s)"
    say(label)
    await load(server.url, server.model, batches, clients, min(1.0, pace.seconds), server.headers)
    run = await pace.run(server, batches, clients, lambda r: say(running(label, r)))
    if run.cut_short or not run.latencies_s or not run.elapsed_s:
        return None
    per_request_s = run.elapsed_s / len(run.latencies_s)
    best = max((p.tokens_per_s for p in profile.points), default=0.0)
    compute_s = run.tokens / len(run.latencies_s) / best if best else 0.0
    return round(max(0.0, per_request_s - compute_s) * 1000, 3)


async def request_pools(
    primary: Server, corpus: Path | None, shapes: Sequence[tuple[str, int]], say: Progress
) -> tuple[dict[tuple[str, int], list[Batch]], dict[str, float]]:
    """Each shape's requests, cut from the corpus's texts of its kind, with their token counts
    (the primary server's own `/tokenize`, which every compared server's points then share),
    and the mean tokens a text of each kind."""
    texts = {kind: load_texts(corpus, kind) for kind in {k for k, _ in shapes}}
    for kind, size in shapes:
        if len(texts[kind]) < size:
            raise BenchError(
                f"the corpus has {len(texts[kind])} {kind} texts, fewer than one request of {size}"
            )
    pools: dict[tuple[str, int], list[Batch]] = {}
    averages: dict[str, float] = {}
    for kind in texts:
        pool = texts[kind][: BATCHES_PER_POINT * max(s for k, s in shapes if k == kind)]
        say(f"counting the tokens of {len(pool)} {kind} texts")
        counts = await token_counts(primary, pool)
        if counts is not None:
            averages[kind] = round(statistics.fmean(counts), 1)
        by_text = dict(zip(pool, counts, strict=True)) if counts is not None else None

        def count(chunk: list[str], by_text: dict[str, int] | None = by_text) -> list[int]:
            return [by_text[t] for t in chunk] if by_text else []

        for k, size in shapes:
            if k == kind:
                pools[(kind, size)] = make_batches(pool, size, count if by_text else None)
    return pools, averages


async def new_profile(
    primary: Server, rivals: Sequence[Server], corpus: Path | None, averages: dict[str, float]
) -> Profile:
    """The profile's tags: what was measured, where, with which corpus; no points yet."""
    from infinity_cloud.core.version import __version__

    return Profile(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        package_version=__version__,
        url=primary.url,
        model=primary.model,
        fingerprint=primary.facts.get("fingerprint"),
        backend=primary.facts.get("backend"),
        dtype=primary.facts.get("dtype"),
        max_input_tokens=primary.facts.get("max_input_tokens"),
        hardware=hardware_of(primary.facts),
        corpus=str(corpus) if corpus else "built-in",
        tokens_per_text=averages,
        idle_rss_mb=await rss_mb(primary),
        compared={r.url: [] for r in rivals},
    )


async def sweep(
    profile: Profile, servers: Sequence[Server], kind: str, size: int, batches: list[Batch],
    pace: Pace, step: int, say: Progress, warn: Progress,
) -> int:
    """One shape against more and more clients, the servers in turn (ABBA: the order flips
    each step, so neither always runs on a warmer machine), until two steps add under
    `FLAT_GAIN` of the primary's throughput. Returns the step count, which goes on across
    shapes."""
    primary = servers[0]
    best = 0.0
    flat = 0
    for clients in pace.concurrency:
        order = servers if step % 2 == 0 else servers[::-1]
        step += 1
        for server in order:
            label = f"{shape_label(kind, size)}, {clients} client(s)" + (
                f" on {server.url}" if len(servers) > 1 else ""
            )
            say(label)
            run = await pace.run(server, batches, clients, lambda r, label=label: say(running(label, r)))
            if run.cut_short:
                warn(f"{label}: {len(run.latencies_s)} requests in {run.elapsed_s:.0f} s, fewer than "
                    f"{MIN_REQUESTS}: no percentiles (a longer --max-seconds gives them)")
            point = Point.of(kind, size, clients, run, await rss_mb(server))
            (profile.points if server is primary else profile.compared[server.url]).append(point)
        rate = profile.points[-1].tokens_per_s
        flat = flat + 1 if rate < best * (1 + FLAT_GAIN) else 0
        best = max(best, rate)
        if flat >= 2:
            break
    return step


def add_bound(profile: Profile, config: dict[str, Any], clock_ghz: float) -> None:
    """Set the profile's work per token (the model's, at the passages' mean length, else the
    queries') and the CPU's peak in the precision served, so each point has its share of it.
    For a server on this machine's CPU only: a remote one's clock is not known here."""
    from infinity_cloud.sizing.estimate import Shape, cpu_peak_flops, kernel_class

    hardware = profile.hardware
    if hardware.device != "cpu" or not hardware.cores:
        return
    shape = Shape.of(config)
    length = profile.tokens_per_text.get("passage") or profile.tokens_per_text.get("query") or 128
    profile.gflop_per_token = round(shape.flop_per_token(length) / 1e9, 6)
    kernels = kernel_class(hardware.kernel_flags)
    profile.peak_gflops = round(
        cpu_peak_flops(hardware.cores, clock_ghz, kernels, profile.dtype or "float32") / 1e9, 1
    )
