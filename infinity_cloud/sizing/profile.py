"""A profile: what `infinity-cloud bench` measured of one served model on one machine, as JSON
that `infinity-cloud plan` reads back. Tagged with what the numbers depend on (the model's
fingerprint, backend, precision, the CPU or GPU and its flags, the package version), so a plan
knows which measurements speak for the hardware it sizes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infinity_cloud.sizing.estimate import kernel_class
from infinity_cloud.sizing.load import LoadRun

SCHEMA = 1


class Point(BaseModel):
    """One closed-loop run: `concurrency` clients sending requests of `per_request` texts."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    per_request: int
    concurrency: int
    tokens_per_s: float = 0.0
    texts_per_s: float = 0.0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    requests: int = 0
    shed_429: int = 0
    elapsed_s: float = 0.0
    # The server's resident memory at the end of the run (its /metrics), in MB.
    rss_mb: float | None = None

    @classmethod
    def of(cls, kind: str, per_request: int, concurrency: int, run: LoadRun, rss_mb: float | None) -> Point:
        return cls(
            kind=kind, per_request=per_request, concurrency=concurrency, rss_mb=rss_mb, **run.summary()
        )

    @property
    def shape(self) -> tuple[str, int]:
        return self.kind, self.per_request


class Hardware(BaseModel):
    """Where the measured server ran, as it reports itself (its /models `host`)."""

    device: str = "cpu"  # "cpu", or the GPU's model
    cpu: str = ""
    cores: int | None = None
    kernel_flags: list[str] = Field(default_factory=list)

    @property
    def hardware_class(self) -> str:
        """What `plan` matches offers on: the GPU's model, or the CPU's kernel class."""
        return self.device if self.device != "cpu" else f"cpu/{kernel_class(self.kernel_flags)}"

    @property
    def kind(self) -> str:
        """The hardware class a profile speaks for: the GPU's model, else the CPU's model and
        the kernel flags that change its numbers."""
        if self.device != "cpu":
            return self.device
        flags = " ".join(sorted(self.kernel_flags)) or "no kernel flags of note"
        return f"{self.cpu or 'a CPU'}, {self.cores} cores ({flags})"


class Profile(BaseModel):
    schema_version: int = SCHEMA
    created: str
    package_version: str
    url: str
    model: str
    fingerprint: str | None = None
    backend: str | None = None
    dtype: str | None = None
    max_input_tokens: int | None = None
    hardware: Hardware = Field(default_factory=Hardware)
    corpus: str
    # Mean tokens per text of each kind sent, as the served model counts them.
    tokens_per_text: dict[str, float] = Field(default_factory=dict)
    idle_rss_mb: float | None = None
    points: list[Point] = Field(default_factory=list)
    # Per shape ("passage x32"), the point past which more clients buy little throughput
    # for much latency (`knee`).
    knees: dict[str, Point] = Field(default_factory=dict)
    # Another server measured beside this one, interleaved (`--compare`): its points by URL.
    compared: dict[str, list[Point]] = Field(default_factory=dict)
    # Where they can be computed (the model's config and the CPU's clock at hand): the
    # model's work per token and the hardware's peak in the precision served, for
    # `bound_share`.
    gflop_per_token: float | None = None
    peak_gflops: float | None = None
    # The machine was busy beyond its cores (or its hypervisor stole CPU) around the run: the
    # numbers are not the model's alone (`conditions.judge`). Keys of `conditions`:
    # load_avg_before, load_avg_after (1-minute), cores (the machine's), steal_share (0..1).
    contended: bool = False
    conditions: dict[str, float] | None = None
    # What the server spends on a request beyond its tokens' compute, in ms: 1000 / the
    # requests per second it answers of one-token texts at the most clients measured, less
    # those tokens' time at the profile's best tokens/s (`bench.request_overhead`). A
    # replica's requests per second are bounded by 1000 / it.
    request_overhead_ms: float | None = None

    def bound_share(self, point: Point) -> float | None:
        """The share of the hardware's peak a point's throughput is."""
        if not self.gflop_per_token or not self.peak_gflops:
            return None
        return point.tokens_per_s * self.gflop_per_token / self.peak_gflops

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> Profile:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))


def shape_label(kind: str, per_request: int) -> str:
    return f"{kind} x{per_request}"


def knee(points: list[Point]) -> Point | None:
    """The point of best power (throughput over p95 latency, Kleinrock's measure) among the
    runs of one shape: before it, more clients add throughput faster than latency; after it,
    they mostly queue."""
    answered = [p for p in points if p.requests and p.p95_ms]
    return max(answered, key=lambda p: p.tokens_per_s / p.p95_ms, default=None)  # type: ignore[operator]
