"""ColPali and ColQwen2: queries and page images to one vector per token, the same as
transformers' Col*ForRetrieval with its own processor on the same folder; late-interaction
scores the same as the processor's `score_retrieval`, from Python and through the rerank
routes. ColBERT: the same as sentence-transformers' MultiVectorEncoder."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import fake, serve_in_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.core.capability import Capability
from infinity_cloud.engine.asks import EmbedAsk, RerankAsk
from infinity_cloud.tasks.scores import maxsim

QUERIES = ["what was the revenue in the last quarter?", "a fox"]


@pytest.fixture(scope="session")
def colpali(build_model: Callable[..., Path]) -> Path:
    return build_model("colpali")


@pytest.fixture(scope="session")
def colqwen2(build_model: Callable[..., Path]) -> Path:
    return build_model("colqwen2")


def pages() -> list[bytes]:
    """Pictures of several sizes and modes (RGBA: transparency goes onto white)."""
    from PIL import Image

    rng = np.random.default_rng(7)
    out = []
    for (height, width), mode in [((40, 60), "RGB"), ((64, 32), "RGB"), ((30, 45), "RGBA"), ((32, 32), "L")]:
        channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
        pixels = (rng.random((height, width, channels)) * 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def reference(path: Path, queries: list[str], images: list[bytes]):
    """The model's own processor and retrieval model; each input's vectors cut to its real
    tokens (the model zeroes the padding)."""
    import torch
    from PIL import Image
    from transformers import AutoModelForPreTraining, AutoProcessor

    model = AutoModelForPreTraining.from_pretrained(str(path)).eval()
    processor = AutoProcessor.from_pretrained(str(path))
    asked = processor.process_queries(queries)
    read = processor.process_images([Image.open(io.BytesIO(b)) for b in images])
    with torch.no_grad():
        q, p = model(**asked).embeddings, model(**read).embeddings

    def cut(vectors: torch.Tensor, mask: torch.Tensor) -> list[np.ndarray]:
        return [row[: int(n)].numpy() for row, n in zip(vectors, mask.sum(dim=1), strict=True)]

    scores = processor.score_retrieval(q, p).numpy()
    return cut(q, asked["attention_mask"]), cut(p, read["attention_mask"]), scores


@pytest.mark.parametrize(("kind", "backend"), [
    ("colpali", "torch"), ("colpali", "onnx"), ("colpali", "openvino"), ("colqwen2", "torch"),
])
async def test_queries_and_pages_match_transformers(request: pytest.FixtureRequest, kind: str, backend: str):
    path = request.getfixturevalue(kind)
    images = pages()
    want_queries, want_pages, want_scores = reference(path, QUERIES, images)
    async with Engine(ModelSpec(model_id=str(path), backend=backend, dtype="float32")) as engine:
        asked = await engine.embeddings(EmbedAsk(QUERIES, accepts=(Capability.MULTI_VECTOR,)))
        read = await engine.embeddings(EmbedAsk([data_uri(b) for b in images], modality="image",
                                                accepts=(Capability.MULTI_VECTOR,)))
        facts = engine.describe()[0]
    assert facts["capabilities"] == ["multi_vector"] and facts["modalities"] == ["text", "image"]
    assert facts["dimensions"] == 16
    # ColPali reads every page at one size; ColQwen2 each at its own: pages cost what they hold.
    assert (len({v.shape[0] for v in read.embeddings}) == 1) == (kind == "colpali")
    for got, want in zip([*asked.embeddings, *read.embeddings], [*want_queries, *want_pages], strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=2e-5)
    scores = np.array([maxsim(q, read.embeddings) for q in asked.embeddings])
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4)


async def test_multi_vectors_over_http_and_rerank_by_image(colpali: Path) -> None:
    images = pages()
    want_queries, want_pages, want_scores = reference(colpali, QUERIES, images)
    uris = [data_uri(b) for b in images]
    # float32: random tiny weights leave scores too close together for bfloat16 to keep their order.
    model = ModelSpec(model_id=str(colpali), served_model_name="colpali", dtype="float32")
    async with serve_in_process(spec_of(model)) as client:
        plain = await client.post("/v1/embeddings", json={"model": "colpali", "input": QUERIES})
        as_bytes = {"model": "colpali", "input": uris, "modality": "image", "encoding_format": "base64"}
        packed = await client.post("/embeddings", json=as_bytes)
        ranked = await client.post("/rerank", json={
            "model": "colpali", "query": QUERIES[0], "documents": uris, "modality": "image", "top_n": 3,
        })
        cohere = await client.post("/v2/rerank", json={
            "model": "colpali", "query": QUERIES[1], "documents": uris, "modality": "image",
        })
        refused = [
            await client.post("/embeddings", json={"model": "colpali", "input": QUERIES, "dimensions": 8}),
            await client.post("/embeddings", json={"model": "colpali", "input": uris, "modality": "audio"}),
        ]
    assert plain.status_code == packed.status_code == ranked.status_code == cohere.status_code == 200
    for item, want in zip(plain.json()["data"], want_queries, strict=True):
        np.testing.assert_allclose(np.array(item["embedding"]), want, atol=1e-4)
    for item, want in zip(packed.json()["data"], want_pages, strict=True):
        matrix = np.frombuffer(base64.b64decode(item["embedding"]), "<f4").reshape(item["shape"])
        np.testing.assert_allclose(matrix, want, atol=1e-4)
    best = list(np.argsort(-want_scores[0], kind="stable")[:3])
    assert [r["index"] for r in ranked.json()["results"]] == best
    np.testing.assert_allclose([r["relevance_score"] for r in ranked.json()["results"]], want_scores[0][best],
                               rtol=1e-3)
    assert [r["index"] for r in cohere.json()["results"]] == list(np.argsort(-want_scores[1], kind="stable"))
    assert all(r.status_code == 400 for r in refused), [r.text for r in refused]
    assert "dimensions" in refused[0].text and "modality" in refused[1].text


async def test_image_documents_need_a_multi_vector_model(tiny_reranker: Path) -> None:
    spec = spec_of(ModelSpec(model_id=str(tiny_reranker), served_model_name="r"))
    async with serve_in_process(spec) as client:
        response = await client.post("/rerank", json={
            "model": "r", "query": "q", "documents": [data_uri(pages()[0])], "modality": "image",
        })
    assert response.status_code == 400 and "multi-vector" in response.text, response.text


# -- ColBERT -------------------------------------------------------------------------------

COLBERT_QUERIES = [
    "what is the capital of france?",
    "a much longer query that goes on about many things in the world, with more words than sixteen tokens",
]
COLBERT_DOCUMENTS = ["Paris is the capital, and the largest city, of France!", "water boils at 100 degrees."]


@pytest.mark.parametrize(("strategy", "attend"), [("fixed", False), ("min", True)])
@pytest.mark.parametrize("backend", ["torch", "onnx", "openvino"])
async def test_colbert_matches_sentence_transformers(
    build_model: Callable[..., Path], strategy: str, attend: bool, backend: str
) -> None:
    """Queries expanded with [MASK] (attended or not; cut to 16, or only padded to 16),
    documents without their punctuation: every vector equal to MultiVectorEncoder's."""
    from sentence_transformers import MultiVectorEncoder

    path = build_model("colbert", strategy=strategy, attend=attend)
    reference = MultiVectorEncoder(str(path), device="cpu")
    want = [t.numpy() for t in reference.encode_query(COLBERT_QUERIES)]
    want += [t.numpy() for t in reference.encode_document(COLBERT_DOCUMENTS)]
    async with Engine(ModelSpec(model_id=str(path), backend=backend, dtype="float32")) as engine:
        per_token = (Capability.MULTI_VECTOR,)
        asked = await engine.embeddings(EmbedAsk(COLBERT_QUERIES, use="query", accepts=per_token))
        read = await engine.embeddings(EmbedAsk(COLBERT_DOCUMENTS, use="document", accepts=per_token))
        ranked = await engine.rerank(RerankAsk(COLBERT_QUERIES[0], COLBERT_DOCUMENTS))
    for got, expected in zip([*asked.embeddings, *read.embeddings], want, strict=True):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=1e-5)
    scores = maxsim(want[0], want[2:])
    assert [r.index for r in ranked.results] == list(np.argsort(-scores))
    np.testing.assert_allclose([r.score for r in ranked.results], np.sort(scores)[::-1], rtol=1e-5)


async def test_tei_embed_all_gives_a_colbert_models_document_vectors(
    build_model: Callable[..., Path]
) -> None:
    from sentence_transformers import MultiVectorEncoder

    path = build_model("colbert", strategy="fixed", attend=False)
    reference = MultiVectorEncoder(str(path), device="cpu")
    want = [t.numpy() for t in reference.encode_document(COLBERT_DOCUMENTS)]
    model = ModelSpec(model_id=str(path), served_model_name="colbert", backend="torch", dtype="float32")
    spec = spec_of(model)
    async with serve_in_process(spec) as client:
        response = await client.post("/embed_all", json={"inputs": COLBERT_DOCUMENTS})
        assert response.status_code == 200, response.text
    for got, expected in zip(response.json(), want, strict=True):
        np.testing.assert_allclose(np.array(got), expected, atol=1e-5)


async def test_colbert_refuses_token_ids(build_model: Callable[..., Path]) -> None:
    """Its query and document prompts are text, so token ids are a 400 (they were a 500)."""
    path = build_model("colbert", strategy="fixed", attend=False)
    async with serve_in_process(spec_of(fake(path, "colbert"))) as client:
        for ids in ([[5, 6, 7]], [5, 6]):
            response = await client.post("/embeddings", json={"input": ids})
            assert response.status_code == 400 and "not token ids" in response.text, response.text


async def test_colbert_asked_for_quantised_types_is_a_400_not_a_calibration(
    build_model: Callable[..., Path],
) -> None:
    """Cohere's embed asks for `embedding_types`; a ColBERT model has no int8/uint8 ranges. The
    answer says what the model is, at once and every time (it started a calibration of the
    multi-vector model, which failed, and answered 503 "calibrating")."""
    path = build_model("colbert", strategy="fixed", attend=False)
    async with serve_in_process(spec_of(fake(path, "colbert"))) as client:
        for types in (["uint8"], ["int8", "float"]):
            body = {"model": "colbert", "texts": ["a b"], "input_type": "search_document",
                    "embedding_types": types}
            for _ in range(2):
                response = await client.post("/v2/embed", json=body)
                assert response.status_code == 400, response.text
                assert "multi-vector" in response.text, response.text


async def test_colbert_roles_over_http(build_model: Callable[..., Path]) -> None:
    from sentence_transformers import MultiVectorEncoder

    path = build_model("colbert", strategy="fixed", attend=False)
    reference = MultiVectorEncoder(str(path), device="cpu")
    spec = spec_of(ModelSpec(model_id=str(path), served_model_name="colbert", dtype="float32"))
    async with serve_in_process(spec) as client:
        as_queries = await client.post(
            "/embeddings", json={"model": "colbert", "input": COLBERT_QUERIES, "input_type": "query"}
        )
        as_documents = await client.post("/embeddings", json={"model": "colbert", "input": COLBERT_DOCUMENTS})
    assert as_queries.status_code == as_documents.status_code == 200
    for item, want in zip(as_queries.json()["data"], reference.encode_query(COLBERT_QUERIES), strict=True):
        np.testing.assert_allclose(np.array(item["embedding"]), want.numpy(), atol=1e-5)
    # No input_type: documents, as sentence-transformers' encode() reads them.
    documents = reference.encode_document(COLBERT_DOCUMENTS)
    for item, want in zip(as_documents.json()["data"], documents, strict=True):
        np.testing.assert_allclose(np.array(item["embedding"]), want.numpy(), atol=1e-5)
