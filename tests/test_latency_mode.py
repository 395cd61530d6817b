"""Latency or throughput. Without a flag OpenVINO chooses per batch: a lone batch too small
to keep every stream busy runs as one request on every core, a full one on the streams.
Latency mode (the flag) is for containers that take one request at a time: OpenVINO
compiles with its LATENCY hint only and keeps one batch in flight; the answers are the
throughput mode's; the flag reaches the spec, and Lambda and SageMaker serverless turn it on."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.cli import app as cli
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.engine.asks import EmbedAsk

TEXTS = ["a lone request on a cold function", "all cores on one small batch", "x"]
runner = CliRunner()


async def embed(path: Path, latency: bool) -> tuple[np.ndarray, str, int]:
    spec = ModelSpec(model_id=str(path), backend="openvino", dtype="float32", latency=latency)
    async with Engine(spec) as engine:
        backend = next(iter(engine.models.values()))._loaded.backend
        hint = backend.compiled.get_property("PERFORMANCE_HINT")
        return (await engine.embeddings(EmbedAsk(TEXTS))).embeddings, str(hint), backend._free.qsize()


async def test_openvino_latency_mode_uses_the_latency_hint_and_answers_the_same(tiny_embedder: Path) -> None:
    fast, fast_hint, fast_batches = await embed(tiny_embedder, latency=True)
    wide, wide_hint, wide_batches = await embed(tiny_embedder, latency=False)
    assert "LATENCY" in fast_hint and "THROUGHPUT" in wide_hint
    assert (fast_batches, wide_batches) == (1, 2)  # one batch in flight, against two
    np.testing.assert_allclose(fast, wide, atol=1e-6)


async def test_a_lone_passage_runs_on_every_core_and_a_full_batch_on_the_streams(tiny_embedder: Path) -> None:
    # Two streams even on a one-core machine, so both paths exist wherever this runs.
    spec = ModelSpec(model_id=str(tiny_embedder), backend="openvino", dtype="float32",
                     backend_options={"streams": 2, "threads": 2})
    async with Engine(spec) as engine:
        backend = next(iter(engine.models.values()))._loaded.backend
        assert backend.solo_ready.wait(120)  # compiled in the background, off the cold start
        assert backend.streams == 2 and backend.solo is not None
        assert "LATENCY" in str(backend.solo.get_property("PERFORMANCE_HINT"))
        before = backend.solo_batches
        alone = (await engine.embeddings(EmbedAsk(TEXTS[:1]))).embeddings
        assert backend.solo_batches == before + 1
        # Sixteen inputs of one length split evenly over the two streams: no gain on one request.
        full = (await engine.embeddings(EmbedAsk([TEXTS[0]] * 16))).embeddings
        assert backend.solo_batches == before + 1
    np.testing.assert_allclose(full, np.repeat(alone, 16, axis=0), atol=1e-5)


async def test_a_batch_is_cut_into_four_slices_a_stream(tiny_embedder: Path) -> None:
    """Up to eight slices on two streams, each padded only to its own longest text: texts of
    mixed lengths answer what each answers alone."""
    spec = ModelSpec(model_id=str(tiny_embedder), backend="openvino", dtype="float32",
                     backend_options={"streams": 2, "threads": 2})
    texts = [" ".join(["word"] * n) for n in (1, 40, 3, 90, 7, 60, 2, 120, 15, 30, 5, 75, 9, 20, 11, 50)]
    async with Engine(spec) as engine:
        backend = next(iter(engine.models.values()))._loaded.backend
        assert backend.slots == backend.streams * 4 == 8
        widths: list[list[int]] = []
        run = backend._run

        def watched(requests, slices, feed, cut, lengths, width, release):  # type: ignore[no-untyped-def]
            widths.append([int(lengths[rows].max()) for rows in slices])
            return run(requests, slices, feed, cut, lengths, width, release)

        backend._run = watched
        together = (await engine.embeddings(EmbedAsk(texts))).embeddings
        # the batch of 16 in more slices than streams, at most eight (fewer where equal work needs fewer)
        assert backend.streams < max(len(w) for w in widths) <= backend.slots
        alone = np.concatenate([(await engine.embeddings(EmbedAsk([t]))).embeddings for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


async def test_under_a_memory_budget_the_load_waits_for_the_second_compilation(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Built in the background otherwise; a budget must count its memory when it sizes batches.
    from infinity_cloud.backends.openvino_backend import OpenVinoBackend

    compile_solo = OpenVinoBackend._compile_solo

    def slowly(self: OpenVinoBackend, folder: Path) -> None:  # still building when the load ends
        time.sleep(2)
        compile_solo(self, folder)

    monkeypatch.setattr(OpenVinoBackend, "_compile_solo", slowly)
    spec = ModelSpec(model_id=str(tiny_embedder), backend="openvino", dtype="float32",
                     backend_options={"streams": 2, "threads": 2})
    async with Engine(spec, limits=LimitsSpec(memory_budget_mb=8192)) as engine:
        backend = next(iter(engine.models.values()))._loaded.backend
        assert backend.solo_ready.is_set() and backend.solo is not None


async def test_one_stream_compiles_once(tiny_embedder: Path) -> None:
    spec = ModelSpec(model_id=str(tiny_embedder), backend="openvino", dtype="float32",
                     backend_options={"streams": 1})
    async with Engine(spec) as engine:
        backend = next(iter(engine.models.values()))._loaded.backend
        assert backend.solo_ready.is_set() and backend.streams == 1 and backend.solo is None
        assert len((await engine.embeddings(EmbedAsk(TEXTS[:1]))).embeddings) == 1


def test_the_flag_reaches_every_model() -> None:
    shown = runner.invoke(cli, ["config", "show", "--model-id", "a", "--model-id", "b", "--latency"])
    assert [m["latency"] for m in yaml.safe_load(shown.output)["models"]] == [True, True]
    shown = runner.invoke(cli, ["config", "show"])
    assert yaml.safe_load(shown.output)["models"][0]["latency"] is False


def test_one_request_at_a_time_targets_turn_it_on(tmp_path: Path, tiny_embedder: Path) -> None:
    built = {
        "aws-lambda": ["build", "aws-lambda"],
        "serverless": ["build", "sagemaker", "--serverless"],
        "realtime": ["build", "sagemaker", "--instance-type", "ml.c7i.xlarge"],
    }
    latency = {}
    for name, command in built.items():
        out = tmp_path / name
        result = runner.invoke(cli, [*command, "--out", str(out), "--model-id", str(tiny_embedder)])
        assert result.exit_code == 0, result.output
        latency[name] = yaml.safe_load((out / "infinity-cloud.yaml").read_text())["models"][0].get("latency")
    assert latency == {"aws-lambda": True, "serverless": True, "realtime": None}  # None: the default, off
