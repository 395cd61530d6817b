"""bge-m3's three outputs (dense, sparse, ColBERT) from one pass, against FlagEmbedding's
BGEM3FlagModel on a tiny XLM-R with random heads built here: through the Python API on the
default backend (OpenVINO) and torch, over HTTP (OpenAI's `/v1/embeddings` and Cohere's embed
with several `embedding_types`, one model run for all three), and by the bulk job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import serve_in_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.core.results import EmbeddingsByType, SparseVector
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.families import read_model_info

TEXTS = [
    "the cat sat on the mat",
    "paris is the capital of france and its largest city",
    "hello",
    "water boils at one hundred degrees at sea level, and freezes at zero",
]
ALL_THREE = ("float", "sparse", "multi_vector")


@pytest.fixture(scope="session")
def bge_m3(build_model: Callable[..., Path]) -> Path:
    return build_model("bge_m3")


@pytest.fixture(scope="session")
def flag_reference(bge_m3: Path) -> dict[str, Any]:
    """BGEM3FlagModel's three outputs of TEXTS, in float32 on the CPU."""
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(str(bge_m3), use_fp16=False, devices="cpu")
    return model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)


def worst_differences(result: EmbeddingsByType, reference: dict[str, Any], same_ids: bool = True
                      ) -> dict[str, float]:
    """The worst dense cosine, sparse weight difference and ColBERT vector cosine to the
    reference; `same_ids`: the sparse terms must be the same token ids (else a term one side
    lacks counts as a weight of 0 there: a reduced precision may cut a weight near 0)."""
    dense = np.asarray(result.by_type["float"])
    want = reference["dense_vecs"]
    dense_cosine = float(((dense * want).sum(1) / np.linalg.norm(dense, axis=1)
                          / np.linalg.norm(want, axis=1)).min())
    sparse_worst = 0.0
    for got, weights in zip(result.by_type["sparse"], reference["lexical_weights"], strict=True):
        if same_ids:
            assert sorted(got.indices.tolist()) == sorted(int(i) for i in weights), "other token ids"
        mine = dict(zip(got.indices.tolist(), got.values.tolist(), strict=True))
        for term in set(mine) | {int(i) for i in weights}:
            sparse_worst = max(sparse_worst, abs(mine.get(term, 0.0) - float(weights.get(str(term), 0.0))))
    colbert_cosine = 1.0
    for got, want in zip(result.by_type["multi_vector"], reference["colbert_vecs"], strict=True):
        assert got.shape == want.shape
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        colbert_cosine = min(colbert_cosine, float(cos.min()))
    return {"dense_cosine": dense_cosine, "sparse_abs": sparse_worst, "colbert_cosine": colbert_cosine}


def test_bge_m3_folder_is_recognised(bge_m3: Path) -> None:
    info = read_model_info(bge_m3)
    facts = (info.family.name, info.capability.value, info.pooling, info.normalize)
    assert facts == ("bge-m3", "embed", "cls", True)
    assert info.towers == {"text": "hybrid"} and info.dimensions == 32


@pytest.mark.parametrize("backend", ["openvino", "torch"])
async def test_three_outputs_match_flag_embedding_in_float32(
    bge_m3: Path, flag_reference: dict[str, Any], backend: str
) -> None:
    assert any(len(w) for w in flag_reference["lexical_weights"]), "the heads drew no sparse weight"
    async with Engine(ModelSpec(model_id=str(bge_m3), backend=backend, dtype="float32")) as engine:
        result = await engine.embeddings(EmbedAsk(TEXTS, dtype=ALL_THREE))
        dense_only = await engine.embeddings(EmbedAsk(TEXTS))
    worst = worst_differences(result, flag_reference)
    print(f"{backend} float32 worst: {worst}")
    assert worst["dense_cosine"] >= 0.99999
    assert worst["sparse_abs"] <= 1e-4
    assert worst["colbert_cosine"] >= 0.99999
    # A plain request gets the dense vectors, the same as the dense type of all three.
    np.testing.assert_allclose(dense_only.embeddings, result.by_type["float"], atol=1e-6)


async def test_default_precision_worst_differences(bge_m3: Path, flag_reference: dict[str, Any]) -> None:
    """The default backend and precision (OpenVINO, dtype auto): reported, and bounded as any
    embedder's reduced precision is (0.999)."""
    async with Engine(ModelSpec(model_id=str(bge_m3))) as engine:
        result = await engine.embeddings(EmbedAsk(TEXTS, dtype=ALL_THREE))
        facts = engine.describe()[0]
    worst = worst_differences(result, flag_reference, same_ids=facts["dtype"] == "float32")
    print(f"default ({facts['backend']} {facts['dtype']}) worst: {worst}")
    assert worst["dense_cosine"] >= 0.999 and worst["colbert_cosine"] >= 0.999
    largest = max(max(weights.values(), default=0.0) for weights in flag_reference["lexical_weights"])
    assert worst["sparse_abs"] <= 0.02 * largest


def by_type_from_wire(items: list[dict[str, Any]]) -> EmbeddingsByType:
    """An OpenAI body's items, answered by type, back as the engine's result (for comparing)."""
    return EmbeddingsByType("m3", {
        "float": np.array([item["embedding"]["float"] for item in items], dtype=np.float32),
        "sparse": [SparseVector(np.array(item["embedding"]["sparse"]["indices"]),
                                np.array(item["embedding"]["sparse"]["values"], dtype=np.float32))
                   for item in items],
        "multi_vector": [np.array(item["embedding"]["multi_vector"], dtype=np.float32) for item in items],
    }, 0)


async def batches_done(client: Any) -> int:
    """The model's batches run so far: a batch is one forward pass of the model."""
    models = (await client.get("/v1/models")).json()["data"]
    return next(m for m in models if m["id"] == "m3")["stats"]["batches_done"]


async def test_all_three_over_http_in_one_pass(bge_m3: Path, flag_reference: dict[str, Any]) -> None:
    """OpenAI's `/v1/embeddings` and Cohere's `/v2/embed` with all three types: each request
    runs the model once (its batches counted), and answers what FlagEmbedding does; the
    sparse output alone is asked for as a SPLADE model's (`encoding_format: sparse`, TEI's
    `/embed_sparse`), the multi-vector one as a ColBERT model's (TEI's `/embed_all`)."""
    model = ModelSpec(model_id=str(bge_m3), served_model_name="m3", dtype="float32")
    async with serve_in_process(spec_of(model)) as client:
        before = await batches_done(client)
        response = await client.post("/v1/embeddings", json={
            "model": "m3", "input": TEXTS, "embedding_types": ["float", "sparse", "multi_vector"],
        })
        assert response.status_code == 200, response.text
        one_request = await batches_done(client) - before
        before = await batches_done(client)
        cohere = await client.post("/v2/embed", json={
            "model": "m3", "texts": TEXTS[::-1], "input_type": "search_document",
            "embedding_types": ["float", "binary", "sparse", "multi_vector"],
        })
        assert cohere.status_code == 200, cohere.text
        cohere_request = await batches_done(client) - before
        sparse_only = await client.post("/v1/embeddings", json={
            "model": "m3", "input": TEXTS, "encoding_format": "sparse"})
        assert sparse_only.status_code == 200, sparse_only.text
        tei_sparse = await client.post("/embed_sparse", json={"inputs": TEXTS})
        tei_all = await client.post("/embed_all", json={"inputs": TEXTS})
        assert (tei_sparse.status_code, tei_all.status_code) == (200, 200), (tei_sparse.text, tei_all.text)
    assert (one_request, cohere_request) == (1, 1), "all three outputs of a request from one forward pass"
    body = response.json()
    assert [item["index"] for item in body["data"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == sum(len(v) + 1 for v in flag_reference["colbert_vecs"])
    worst = worst_differences(by_type_from_wire(body["data"]), flag_reference)
    assert worst["dense_cosine"] >= 0.99999 and worst["colbert_cosine"] >= 0.99999
    assert worst["sparse_abs"] <= 1e-4
    # Its sparse output alone, as a SPLADE model's is asked for.
    assert [item["embedding"] for item in sparse_only.json()["data"]] == [
        item["embedding"]["sparse"] for item in body["data"]]
    # And in TEI's shapes, on its sparse and per-token routes.
    assert [[term["index"] for term in row] for row in tei_sparse.json()] == [
        item["embedding"]["sparse"]["indices"] for item in body["data"]]
    for matrix, item in zip(tei_all.json(), body["data"], strict=True):
        np.testing.assert_allclose(matrix, item["embedding"]["multi_vector"], atol=1e-6)
    embeddings = cohere.json()["embeddings"]
    assert set(embeddings) == {"float", "binary", "sparse", "multi_vector"}
    assert embeddings["sparse"][0] == body["data"][3]["embedding"]["sparse"]
    assert len(embeddings["binary"][0]) == 4  # 32 dimensions' bits
    np.testing.assert_allclose(embeddings["multi_vector"][-1], body["data"][0]["embedding"]["multi_vector"],
                               atol=1e-6)


async def test_several_types_refused_where_they_cannot_be_made(bge_m3: Path, tiny_embedder: Path) -> None:
    """A model of one output asked for sparse beside dense: a 400 naming the field; several
    types with another encoding or beside one type: a 400 naming the field (each is valid alone)."""
    models = (ModelSpec(model_id=str(bge_m3), served_model_name="m3", dtype="float32"),
              ModelSpec(model_id=str(tiny_embedder), served_model_name="dense", dtype="float32"))
    async with serve_in_process(spec_of(*models)) as client:
        refused = await client.post("/v1/embeddings", json={
            "model": "dense", "input": ["hello"], "embedding_types": ["float", "sparse"],
        })
        base64 = await client.post("/v1/embeddings", json={
            "model": "m3", "input": ["hello"], "embedding_types": ["sparse"], "encoding_format": "base64",
        })
        both = await client.post("/v1/embeddings", json={
            "model": "m3", "input": ["hello"], "embedding_types": ["sparse"], "embedding_type": "int8",
        })
        dense_only = await client.post("/v1/embeddings", json={"model": "dense", "input": ["hello"],
                                                                "embedding_types": ["float", "binary"]})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "embedding_types"
    assert "bge-m3" in refused.json()["error"]["message"]
    assert (base64.status_code, both.status_code) == (400, 400), (base64.text, both.text)
    params = (base64.json()["error"]["param"], both.json()["error"]["param"])
    assert params == ("encoding_format", "embedding_types")
    assert dense_only.status_code == 200, dense_only.text
    assert set(dense_only.json()["data"][0]["embedding"]) == {"float", "binary"}


async def test_bulk_job_writes_each_output_asked_from_one_pass(
    bge_m3: Path, flag_reference: dict[str, Any]
) -> None:
    """`embed --output dense --output sparse --output multi_vector`: a column each, as
    FlagEmbedding makes them, and a shard's rows run through the model once."""
    from infinity_cloud.bulk.job import EmbedJob, embed_shard
    from infinity_cloud.bulk.sources import Row

    job = EmbedJob(files=(), out="unused", outputs=("dense", "sparse", "multi_vector"))
    rows = [Row(i, f"doc-{i}", text) for i, text in enumerate(TEXTS)]
    async with Engine(ModelSpec(model_id=str(bge_m3), backend="openvino", dtype="float32")) as engine:
        before = engine.describe()[0]["stats"]["batches_done"]
        shard = await embed_shard(engine, job, rows)
        passes = engine.describe()[0]["stats"]["batches_done"] - before
    assert passes == 1, "the three columns of a shard from one forward pass"
    table = shard.table.sort_by("row")
    assert table.column_names == ["id", "row", "embedding", "sparse", "multi_vector"]
    by_type = EmbeddingsByType("m3", {
        "float": np.array(table["embedding"].to_pylist(), dtype=np.float32),
        "sparse": [SparseVector(np.array(v["indices"]), np.array(v["values"], dtype=np.float32))
                   for v in table["sparse"].to_pylist()],
        "multi_vector": [np.array(v, dtype=np.float32) for v in table["multi_vector"].to_pylist()],
    }, 0)
    worst = worst_differences(by_type, flag_reference)
    assert worst["dense_cosine"] >= 0.99999 and worst["colbert_cosine"] >= 0.99999
    assert worst["sparse_abs"] <= 1e-4


def test_embed_command_writes_the_columns_asked(bge_m3: Path, tmp_path: Path) -> None:
    """The command line's `--output`, each its column; an unknown output is refused by name."""
    import json

    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from infinity_cloud.cli import app as cli

    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    common = [str(source), "--model-id", str(bge_m3), "--dtype", "float32"]
    done = CliRunner().invoke(cli, ["embed", *common, "--out", str(tmp_path / "out"),
                                    "--output", "sparse", "--output", "dense"])
    assert done.exit_code == 0, done.output
    table = pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet")))
    assert table.column_names == ["id", "row", "sparse", "embedding"] and table.num_rows == len(TEXTS)
    bad = CliRunner().invoke(cli, ["embed", *common, "--out", str(tmp_path / "bad"), "--output", "colbert"])
    assert bad.exit_code != 0 and "'colbert'" in bad.output


async def test_chunks_and_similarity_take_the_dense_vectors(bge_m3: Path) -> None:
    """What reads a model's dense vectors (chunked embeddings, similarity) reads bge-m3's."""
    from infinity_cloud.engine.asks import ChunkedEmbedAsk, SimilarityAsk

    async with Engine(ModelSpec(model_id=str(bge_m3), backend="torch", dtype="float32")) as engine:
        dense = (await engine.embeddings(EmbedAsk(TEXTS))).embeddings
        chunks = await engine.chunked_embeddings(ChunkedEmbedAsk(TEXTS))
        similar = await engine.similarity(SimilarityAsk(TEXTS[0], TEXTS[1:]))
    np.testing.assert_allclose(chunks.embeddings, dense, atol=1e-5)  # short texts: a chunk each
    np.testing.assert_allclose(similar.scores, dense[1:] @ dense[0], atol=1e-5)
