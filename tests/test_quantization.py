"""Quantised embeddings: int8/uint8 (calibrated offline, per model) and packed bits, the same
numbers as sentence-transformers' `quantize_embeddings`, served per model on /embeddings."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import FAKE, ROOT, fake, post_through_calibration, serve_in_process, server_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.tasks import quantization


@pytest.mark.parametrize("kind", ["int8", "uint8", "binary", "ubinary"])
def test_the_numbers_are_sentence_transformers(kind: str) -> None:
    from sentence_transformers.util.quantization import quantize_embeddings

    rng = np.random.default_rng(0)
    calibration = rng.standard_normal((300, 40)).astype(np.float32)
    vectors = rng.standard_normal((20, 40)).astype(np.float32) * 1.2  # some beyond the range
    bounds = quantization.ranges(calibration)
    got = quantization.quantize(vectors, kind, bounds)
    want = quantize_embeddings(vectors, kind, ranges=bounds)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_calibration_texts_do_not_depend_on_what_was_imported() -> None:
    """Modules gain submodule attributes as a process imports them: the texts must not."""
    code = "from infinity_cloud.tasks.quantization import calibration_texts as c; import json; "
    code += "print(json.dumps(c()))"
    outputs = []
    for before in ("", "import json.tool, unittest.mock, email.mime.text, concurrent.futures, xml.dom; "):
        run = subprocess.run([sys.executable, "-c", before + code], capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        outputs.append(json.loads(run.stdout))
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == quantization.CALIBRATION_SIZE and len(set(outputs[0])) == len(outputs[0])


async def test_a_model_served_as_int8_answers_int8(tiny_embedder: Path) -> None:
    """--embedding-dtype int8: /embeddings answers the calibrated int8 vectors (JSON ints, or
    their bytes in base64), Matryoshka-truncated ones calibrated at their own width; a
    request's embedding_type overrides the model's."""
    texts = ["hello world", "a somewhat longer text about the weather", "x"]
    float_spec = ModelSpec(model_id=str(tiny_embedder), dtype="float32")
    async with Engine(float_spec) as engine:
        full = await engine.embeddings(EmbedAsk(texts))
        want = await engine.quantize(full, "int8")
        short = await engine.embeddings(EmbedAsk(texts, dimensions=16))
        want_short = await engine.quantize(short, "int8", 16)
    spec = spec_of(
        float_spec.model_copy(update={"embedding_dtype": "int8", "served_model_name": "q"}),
        float_spec.model_copy(update={"embedding_dtype": "ubinary", "served_model_name": "bits"}),
    )
    async with serve_in_process(spec) as client:
        plain = (await client.post("/embeddings", json={"model": "q", "input": texts})).json()
        short_b64 = {"model": "q", "input": texts, "encoding_format": "base64", "dimensions": 16}
        packed = (await client.post("/embeddings", json=short_b64)).json()
        bits = (await client.post("/embeddings", json={"model": "bits", "input": texts})).json()
        # Per request, whatever the model's default: a model served as ubinary calibrates its
        # int8 ranges when first asked, in the background, never inside a request (a 503 that
        # says so and when to come back, meanwhile other types are answered).
        asked = {"model": "bits", "input": texts, "embedding_type": "int8"}
        first = await client.post("/embeddings", json=asked)
        assert first.status_code == 503 and int(first.headers["retry-after"]) >= 1, first.text
        assert "calibrating its int8/uint8 ranges" in first.json()["error"]["message"]
        assert (await client.post("/embeddings", json={"model": "bits", "input": texts})).status_code == 200
        per_request = (await post_through_calibration(client, "/embeddings", asked)).json()
    got = np.array([d["embedding"] for d in plain["data"]])
    assert np.array_equal(got, want) and got.min() >= -128 and got.max() <= 127
    got_short = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), np.int8) for d in packed["data"]])
    assert np.array_equal(got_short, want_short)
    assert np.array_equal(np.array([d["embedding"] for d in per_request["data"]]), want)
    signs = np.packbits(full.embeddings > 0, axis=-1)
    assert np.array_equal(np.array([d["embedding"] for d in bits["data"]]), signs)


async def test_the_models_embedding_dtype_holds_on_every_route_and_the_python_api(
    tiny_embedder: Path,
) -> None:
    """The engine applies --embedding-dtype, not one route: OpenAI's /embeddings, TEI's /embed,
    Cohere's /v2/embed without embedding_types and Engine.embed all answer the same packed
    bits; a request (or caller) that asks float32 gets floats; TEI's similarity stays cosine."""
    texts = ["hello world", "a somewhat longer text about the weather", "x"]
    spec = ModelSpec(model_id=str(tiny_embedder), dtype="float32", embedding_dtype="ubinary")
    async with Engine(spec) as engine:
        python = await engine.embeddings(EmbedAsk(texts))
        floats = await engine.embeddings(EmbedAsk(texts, dtype="float32"))
    signs = np.packbits(floats.embeddings > 0, axis=-1)
    assert python.dtype == "ubinary" and np.array_equal(python.embeddings, signs)
    async with serve_in_process(spec_of(spec.model_copy(update={"served_model_name": "bits"}))) as client:
        openai = (await client.post("/embeddings", json={"input": texts})).json()
        tei = (await client.post("/embed", json={"inputs": texts})).json()
        cohere_body = {"texts": texts, "input_type": "search_document"}
        cohere = (await client.post("/v2/embed", json=cohere_body)).json()
        asked = (await client.post("/embeddings", json={"input": texts, "embedding_type": "float32"})).json()
        assert "data" in asked, asked
        similar = (await client.post("/similarity", json={"inputs": {
            "source_sentence": texts[0], "sentences": texts}})).json()
    assert np.array_equal(np.array([d["embedding"] for d in openai["data"]]), signs)
    assert np.array_equal(np.array(tei), signs)
    assert np.array_equal(np.array(cohere["embeddings"]["ubinary"]), signs)
    asked_vectors = np.array([d["embedding"] for d in asked["data"]])
    np.testing.assert_allclose(asked_vectors, floats.embeddings, atol=1e-6)
    unit = floats.embeddings / np.linalg.norm(floats.embeddings, axis=1, keepdims=True)
    np.testing.assert_allclose(similar, unit @ unit[0], atol=1e-5)


async def test_int8_calibration_finishes_under_load_and_keeps_its_retry_after(tiny_embedder: Path) -> None:
    """A busy server whose deadline sheds large requests still calibrates int8 ranges: their
    512 texts are the engine's own background work, never refused for load, and go before the
    requests waiting; so a client that comes back after the 503's Retry-After is answered
    (its 512-text job used to be refused by the deadline, over and over, under load). The 503
    comes before the request's own work, which the deadline could refuse first."""
    spec = fake(tiny_embedder, "m", max_batch_size=16, deadline_s=0.1, backend_options={"delay_s": 0.01})
    busy = [f"a busy server's text number {i}, one of many sent again and again" for i in range(32)]
    async with serve_in_process(spec_of(spec)) as client:
        stop = asyncio.Event()

        async def load() -> None:  # about 0.16 s of work always waiting: past the deadline
            while not stop.is_set():
                response = await client.post("/embeddings", json={"input": busy})
                assert response.status_code in (200, 429), response.text
                if response.status_code == 429:
                    await asyncio.sleep(0.05)

        loaders = [asyncio.ensure_future(load()) for _ in range(8)]
        try:
            await asyncio.sleep(1.0)  # the pace is measured under load
            asked = {"input": ["hello", "world"], "embedding_type": "int8"}
            first = await client.post("/embeddings", json=asked)
            assert first.status_code == 503 and "calibrating" in first.text, first.text
            await asyncio.sleep(int(first.headers["retry-after"]))
            for _ in range(20):  # calibrated by then; the load's own 429s are retried, as a client does
                again = await client.post("/embeddings", json=asked)
                if again.status_code != 429:
                    break
                await asyncio.sleep(int(again.headers["retry-after"]))
            assert again.status_code == 200, again.text
        finally:
            stop.set()
            await asyncio.gather(*loaders)


def test_serve_with_an_int8_embedding_dtype_calibrates_before_it_is_healthy(tiny_embedder: Path) -> None:
    """`serve --embedding-dtype int8` (and every container, which loads the same way) answered
    /health 503 with the model "calibrating", and calibrated nothing until a caller's int8
    request, which got the 503 ("retry in about 156 s" on MiniLM here): its ranges are now part
    of the load, so the server is healthy only once they are made, and its first answer is a 200."""
    args = ("--model-id", str(tiny_embedder), "--served-model-name", "q", "--backend", FAKE,
            "--embedding-dtype", "int8")
    with server_process(*args, timeout=120) as url:
        models = httpx.get(f"{url}/models", timeout=10).json()["data"]
        assert [(m["state"], m["int8_ranges"]) for m in models] == [("ready", "ready")]
        first = httpx.post(f"{url}/v1/embeddings", json={"input": ["hello", "world"]}, timeout=30)
        cohere = httpx.post(f"{url}/v2/embed", timeout=30, json={
            "texts": ["hello"], "input_type": "search_query", "embedding_types": ["int8", "uint8", "binary"]})
    assert first.status_code == 200, first.text
    assert cohere.status_code == 200, cohere.text


async def test_at_float32_the_quantised_outputs_are_sentence_transformers_own(tiny_embedder: Path) -> None:
    """What docs/backends.md says `--dtype float32` gives: int8, uint8, binary and ubinary are
    the bytes sentence-transformers' `quantize_embeddings` makes of its own embeddings, with
    the same ranges (at bfloat16 they are not: up to 2 steps, a few bits)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util.quantization import quantize_embeddings

    texts = ["hello world", "a somewhat longer text about the weather", "x", "quantised outputs, exactly"]
    spec = ModelSpec(model_id=str(tiny_embedder), dtype="float32", served_model_name="q")
    async with Engine(spec) as engine:
        bounds = await engine.calibration("q")
        got = {kind: (await engine.embeddings(EmbedAsk(texts, dtype=kind))).embeddings
               for kind in ("int8", "uint8", "binary", "ubinary")}
    own = SentenceTransformer(str(tiny_embedder), device="cpu").encode(texts)
    for kind, vectors in got.items():
        want = quantize_embeddings(own, kind, ranges=bounds)
        assert vectors.dtype == want.dtype and np.array_equal(vectors, want), kind
