"""`infinity-cloud bench` against real servers over HTTP: the profile it writes (points, knees,
tokens as the model counts them, the tags a plan matches on), the plot, `--compare` beside a
second server, a server started from --model-id and stopped after, and its refusals."""

from __future__ import annotations

import json
import socket
import statistics
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import server_process
from tokenizers import Tokenizer
from typer.testing import CliRunner

from infinity_cloud.cli import build_cli
from infinity_cloud.content_digest import model_fingerprint
from infinity_cloud.hardware import cpu_clock_ghz, kernel_flags, usable_cores
from infinity_cloud.sizing.bench import BATCHES_PER_POINT
from infinity_cloud.sizing.corpus import load_texts
from infinity_cloud.sizing.estimate import Shape
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
