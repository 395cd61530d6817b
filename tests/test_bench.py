"""`infinity-cloud bench` against real servers over HTTP: the profile it writes (points, knees,
tokens as the model counts them, the tags a plan matches on), the plot, `--compare` beside a
second server, a server started from --model-id on the port asked and stopped after (also on
SIGINT and SIGTERM, bench being a real process), its progress, 20 requests a point at least,
a busy machine's profile marked contended, the overhead of a request, and its refusals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import ROOT, free_port, server_process
from tokenizers import Tokenizer
from typer.testing import CliRunner

from infinity_cloud.cli import build_cli
from infinity_cloud.core.content_digest import model_fingerprint
from infinity_cloud.core.hardware import cpu_clock_ghz, kernel_flags, usable_cores
from infinity_cloud.sizing import bench as measuring
from infinity_cloud.sizing.bench import BATCHES_PER_POINT
from infinity_cloud.sizing.conditions import Machine, Reading, judge, own_load
from infinity_cloud.sizing.corpus import load_texts
from infinity_cloud.sizing.estimate import Shape
from infinity_cloud.sizing.load import MIN_REQUESTS, LoadRun, percentile
from infinity_cloud.sizing.profile import Profile

QUICK = ["--concurrency", "1,2", "--seconds", "0.5"]


def bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build_cli(), ["bench", *args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def served(tiny_embedder: Path) -> Iterator[str]:
    with server_process("--model-id", str(tiny_embedder), "--served-model-name", "tiny",
                        "--log-level", "warning", "--deadline-s", "600") as url:
        yield url


def test_a_profile_of_a_served_model(served: str, tiny_embedder: Path, tmp_path: Path) -> None:
    code, output = bench("--url", served, "--shapes", "query:1,passage:4", *QUICK, "--out", str(tmp_path))
    assert code == 0, output
    profile = Profile.read(tmp_path / "profile.json")
    facts = httpx.get(f"{served}/models").json()["data"][0]
    assert (profile.model, profile.backend, profile.dtype) == ("tiny", facts["backend"], facts["dtype"])
    assert profile.fingerprint == model_fingerprint(tiny_embedder)
    assert profile.hardware.kernel_flags == kernel_flags()
    assert (profile.hardware.device, profile.hardware.cores) == ("cpu", usable_cores())
    assert [(p.kind, p.per_request, p.concurrency) for p in profile.points] == [
        ("query", 1, 1), ("query", 1, 2), ("passage", 4, 1), ("passage", 4, 2)
    ]
    for point in profile.points:
        assert point.requests > 0 and point.tokens_per_s > 0 and point.shed_429 == 0
        assert point.p50_ms <= point.p95_ms <= point.p99_ms
        assert point.rss_mb and point.rss_mb > 50
    assert set(profile.knees) == {"query x1", "passage x4"}
    assert all(knee in profile.points for knee in profile.knees.values())
    # Tokens as the model's own tokenizer counts them (not characters), capped at its limit.
    tokenizer = Tokenizer.from_file(str(tiny_embedder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    for kind, size in (("query", 1), ("passage", 4)):
        texts = load_texts(None, kind)[: BATCHES_PER_POINT * size]
        counts = [min(len(e.ids), facts["max_input_tokens"]) for e in tokenizer.encode_batch(texts)]
        assert profile.tokens_per_text[kind] == pytest.approx(statistics.fmean(counts), abs=0.05)
    assert (tmp_path / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "knee at" in output


def test_compare_runs_a_second_server_beside(served: str, tiny_embedder: Path, tmp_path: Path) -> None:
    with server_process("--model-id", str(tiny_embedder), "--backend", "torch", "--log-level", "warning",
                        "--deadline-s", "600") as other:
        code, output = bench("--url", served, "--compare", other, "--shapes", "passage:2", *QUICK,
                             "--out", str(tmp_path))
    assert code == 0, output
    profile = Profile.read(tmp_path / "profile.json")
    theirs = profile.compared[other]
    assert [(p.kind, p.per_request, p.concurrency) for p in theirs] == [
        (p.kind, p.per_request, p.concurrency) for p in profile.points
    ]
    assert all(p.requests > 0 for p in theirs)
    assert f"the tokens/s of {other}, p50" in output


def test_a_model_id_is_served_here_for_the_run_and_stopped(tiny_embedder: Path, tmp_path: Path) -> None:
    code, output = bench("--model-id", str(tiny_embedder), "--shapes", "query:1", "--concurrency", "1",
                         "--seconds", "0.5", "--out", str(tmp_path))
    assert code == 0, output
    profile = Profile.read(tmp_path / "profile.json")
    assert [p.concurrency for p in profile.points] == [1]
    # Served on this CPU from a config at hand: each point's share of the CPU's peak.
    if cpu_clock_ghz() is not None:
        shape = Shape.of(json.loads((tiny_embedder / "config.json").read_text()))
        assert profile.gflop_per_token == pytest.approx(
            shape.flop_per_token(profile.tokens_per_text["query"]) / 1e9, rel=1e-3)
        assert profile.peak_gflops and profile.peak_gflops > 0
        assert 0 < profile.bound_share(profile.points[0]) < 1.5
        assert "of the CPU's peak" in output
    port = int(profile.url.rsplit(":", 1)[1])
    with socket.socket() as sock:  # its server is gone
        assert sock.connect_ex(("127.0.0.1", port)) != 0
    # The machine as it was around the run, read from this machine's /proc (busy or not, the
    # profile says which, and the output says why).
    assert set(profile.conditions or ()) == {"load_avg_before", "load_avg_after", "cores", "steal_share"}
    assert profile.conditions["cores"] == os.cpu_count()
    assert 0 <= profile.conditions["steal_share"] <= 1
    assert ("marked contended" in output) == profile.contended
    assert profile.request_overhead_ms is not None and profile.request_overhead_ms > 0


def test_refusals_say_what_was_wrong(served: str, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{sock.getsockname()[1]}"
    code, output = bench("--url", nobody, "--out", str(tmp_path))
    assert code == 2 and "cannot be reached" in output
    code, output = bench("--url", served, "--model", "nosuch", "--out", str(tmp_path))
    assert code == 2 and "does not serve 'nosuch'" in output and "tiny" in output
    code, output = bench("--url", served, "--shapes", "passages:4", "--out", str(tmp_path))
    assert code == 2 and "KIND:TEXTS" in output


def test_bench_serves_on_the_port_asked(tiny_embedder: Path, tmp_path: Path) -> None:
    """--port is the server's (started by bench, a real process) and a taken one is refused."""
    port = free_port()
    with bench_process(tiny_embedder, port, tmp_path) as (process, stderr):
        await_progress(process, port, stderr)
        assert server_of(process, port) is not None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        code, output = bench("--model-id", str(tiny_embedder), "--port", str(busy), "--out", str(tmp_path))
    assert code == 2 and f"port {busy} is taken" in output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_bench_and_its_server(
    tiny_embedder: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM (and SIGINT) while a point runs: bench stops its server, then exits by the signal."""
    port = free_port()
    with bench_process(tiny_embedder, port, tmp_path) as (process, stderr):
        await_progress(process, port, stderr)
        server = server_of(process, port)
        assert server is not None
        process.send_signal(sig)
        assert process.wait(60) == 128 + sig, stderr.read_text()
        _, alive = psutil.wait_procs([server], timeout=60)
        assert not alive, f"bench's server {server.pid} outlived it"
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0
        assert f"stopped by {sig.name}" in stderr.read_text()


@contextlib.contextmanager
def bench_process(model: Path, port: int, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`infinity-cloud bench --model-id MODEL --port PORT` as a process of its own, its points long
    enough to be running when signalled; it and every process it started are killed after."""
    stderr = tmp_path / "bench.err"
    with stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "infinity_cloud", "bench", "--model-id", str(model), "--port", str(port),
             "--shapes", "passage:8", "--concurrency", "1", "--seconds", "600", "--out", str(tmp_path)],
            stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    family = [psutil.Process(process.pid)]
    try:
        yield process, stderr
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            family += family[0].children(recursive=True)
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(family, timeout=30)


def await_progress(process: subprocess.Popen[bytes], port: int, stderr: Path, timeout_s: float = 180) -> None:
    """Until the server on `port` answers and bench says (on stderr) a point's tokens/s so far."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, stderr.read_text()
        with contextlib.suppress(httpx.HTTPError):
            if (
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
                and "passage x8, 1 client(s): " in stderr.read_text()
                and " tokens/s, " in stderr.read_text()
            ):
                return
        time.sleep(0.2)
    raise AssertionError(f"no server on {port} or no progress within {timeout_s} s:\n{stderr.read_text()}")


def server_of(process: subprocess.Popen[bytes], port: int) -> psutil.Process | None:
    """The process bench started that listens on `port`."""
    for child in psutil.Process(process.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in child.net_connections()):
                return child
    return None


def test_percentiles_come_from_twenty_requests_at_least() -> None:
    few = LoadRun(elapsed_s=1.0, texts=MIN_REQUESTS - 1, tokens=100, latencies_s=[0.01] * (MIN_REQUESTS - 1))
    summary = few.summary()
    assert (summary["p50_ms"], summary["p95_ms"], summary["p99_ms"]) == (None, None, None)
    assert summary["requests"] == MIN_REQUESTS - 1 and summary["tokens_per_s"] == 100
    # Of 20 requests (1 to 20 ms), p95 is the 19th (19 of 20 are at or below it), p99 the slowest.
    enough = LoadRun(elapsed_s=1.0, texts=20, tokens=100, latencies_s=[n / 1000 for n in range(20, 0, -1)])
    summary = enough.summary()
    assert (summary["p50_ms"], summary["p95_ms"], summary["p99_ms"]) == (10.5, 19.0, 20.0)
    assert percentile(list(range(1, 101)), 0.99) == 99 and percentile([5.0], 0.5) == 5.0


def test_every_point_runs_to_twenty_requests(served: str, tmp_path: Path) -> None:
    """Runs far too short for 20 requests of 32 passages go on until they have them."""
    code, output = bench("--url", served, "--shapes", "passage:32", "--concurrency", "1,2",
                         "--seconds", "0.1", "--out", str(tmp_path))
    assert code == 0, output
    profile = Profile.read(tmp_path / "profile.json")
    assert len(profile.points) == 2
    for point in profile.points:
        assert point.requests >= MIN_REQUESTS and point.p50_ms is not None, point
    assert profile.request_overhead_ms is not None and profile.request_overhead_ms > 0


def test_a_point_cut_short_has_no_percentiles_and_says_so(served: str) -> None:
    said: list[str] = []
    profile = asyncio.run(measuring.bench(
        served, shapes=[("passage", 32)], concurrency=[1], seconds=0.01, max_seconds=0.01, warn=said.append,
        machine=Machine(), before=Reading(0.0),
    ))
    [point] = profile.points
    assert 0 < point.requests < MIN_REQUESTS and point.tokens_per_s > 0
    assert (point.p50_ms, point.p95_ms, point.p99_ms) == (None, None, None)
    assert profile.knees == {}
    assert any(f"fewer than {MIN_REQUESTS}: no percentiles" in line for line in said), said


def fake_machine(tmp_path: Path, load_avg: float, total: int, steal: int, cores: int = 2) -> Machine:
    """A machine read from files shaped as /proc/loadavg and /proc/stat are."""
    (tmp_path / "loadavg").write_text(f"{load_avg:.2f} 1.00 1.00 3/400 12345\n")
    user = total - steal - 100
    (tmp_path / "stat").write_text(
        f"cpu  {user} 0 0 100 0 0 0 {steal} 0 0\ncpu0 {user} 0 0 100 0 0 0 {steal} 0 0\nintr 1\n"
    )
    return Machine(tmp_path / "loadavg", tmp_path / "stat", cores)


@pytest.mark.parametrize(
    ("before", "after", "contended"),
    [
        (Reading(0.3, 1_000, 0), (2.9, 5_000, 10), False),  # idle, then bench's own load (about 3)
        (Reading(2.5, 1_000, 0), (2.9, 5_000, 10), True),   # busier than its 2 cores before the run
        (Reading(0.3, 1_000, 0), (5.5, 5_000, 10), True),   # 5.5 - 3 of bench's own > 2 cores
        (Reading(0.3, 1_000, 0), (2.0, 5_000, 600), True),  # 15 % of the CPU time stolen
    ],
)
def test_the_load_and_the_steal_judge_a_run(
    tmp_path: Path, before: Reading, after: tuple[float, int, int], contended: bool
) -> None:
    machine = fake_machine(tmp_path, *after)
    conditions, reasons = judge(before, machine.read(), 2, own_load(2, server_here=True))
    assert conditions == {
        "cores": 2.0, "load_avg_before": before.load_avg, "load_avg_after": after[0],
        "steal_share": round((after[2] - before.cpu_steal) / (after[1] - before.cpu_total), 4),
    }
    assert bool(reasons) == contended


def test_a_busy_machine_marks_the_profile_contended(served: str, tmp_path: Path) -> None:
    """bench reads the machine it is given before and after; a load of 20 on 2 cores (as in the
    report that 797 tokens/s was a result) marks the profile and says why; a quiet one does not."""
    said: list[str] = []
    profile = asyncio.run(measuring.bench(
        served, shapes=[("query", 1)], concurrency=[1], seconds=0.1, warn=said.append,
        machine=fake_machine(tmp_path, 20.0, 5_000, 20), before=Reading(19.5, 1_000, 0),
    ))
    assert profile.contended
    assert profile.conditions == {"cores": 2.0, "load_avg_before": 19.5, "load_avg_after": 20.0,
                                  "steal_share": 0.005}
    assert any("load average was 19.50 before the run, on 2 cores" in line for line in said), said
    assert Profile.model_validate_json(profile.model_dump_json()).contended
    said.clear()
    quiet = asyncio.run(measuring.bench(
        served, shapes=[("query", 1)], concurrency=[1], seconds=0.1, warn=said.append,
        machine=fake_machine(tmp_path, 1.5, 5_000, 20), before=Reading(0.2, 1_000, 0),
    ))
    assert not quiet.contended and said == []
