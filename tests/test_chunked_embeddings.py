"""`POST /v1/embeddings/chunked` through the real app, on real all-MiniLM-L6-v2: documents cut
by the model's own tokenizer, each chunk's vector what sentence-transformers computes on that
chunk's tokens, the offsets pointing into the document, nothing truncated; bad sizes refused
with a 400 naming the field."""

from __future__ import annotations

import base64
import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import cosines, serve_in_process, spec_of
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer

from infinity_cloud.core.config import ModelSpec

SENTENCES = [
    "Late chunking embeds each chunk in the context of its whole document.",
    "Character splitters overflow the window, or waste most of it.",
    "The café's naïve résumé was 3.14 pages long!",
    "Is a chunk ever cut in the middle of a word?",
    "Antidisestablishmentarianism and internationalization are long words.",
]
# The body limit of the served app: a document is bounded by it, not by the per-text limit.
MAX_BYTES = 256 * 1024
MAX_CHARS = 2_000


def _document(seed: int, sentences: int) -> str:
    rng = random.Random(seed)
    spaces = [" ", " ", "\n\n", "  "]
    return "".join(rng.choice(SENTENCES) + rng.choice(spaces) for _ in range(sentences)).strip()


@pytest.fixture(scope="module")
async def client(minilm_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    model = ModelSpec(model_id=str(minilm_dir), served_model_name="minilm", backend="torch", dtype="float32")
    spec = spec_of(model, limits={"max_payload_bytes": MAX_BYTES, "max_chars_per_text": MAX_CHARS})
    async with serve_in_process(spec) as c:
        yield c


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> tuple[SentenceTransformer, Tokenizer]:
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return SentenceTransformer(str(minilm_dir), device="cpu"), tokenizer


def _reference_vector(model: SentenceTransformer, ids: list[int]) -> np.ndarray:
    """sentence-transformers' own modules (BERT, mean pooling, Normalize) on [CLS] ids [SEP]."""
    cls, sep = model.tokenizer.cls_token_id, model.tokenizer.sep_token_id
    input_ids = torch.tensor([[cls, *ids, sep]])
    features = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                "token_type_ids": torch.zeros_like(input_ids)}
    with torch.no_grad():
        return model(features)["sentence_embedding"][0].numpy()


async def test_each_chunk_is_its_own_tokens_embedded_with_offsets_into_its_document(client, reference):
    model, tokenizer = reference
    documents = [_document(1, 90), "One short document.", _document(2, 40)]
    body = {"model": "minilm", "input": documents, "chunk_tokens": 64, "overlap_tokens": 8}
    response = await client.post("/v1/embeddings/chunked", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    assert len(answer["data"][0]["chunks"]) > 5 and len(answer["data"][1]["chunks"]) == 1

    computed = 0
    for document, item in zip(documents, answer["data"], strict=True):
        encoding = tokenizer.encode(document, add_special_tokens=False)
        covered = np.zeros(len(document), bool)
        got, want = [], []
        for chunk in item["chunks"]:
            start, end = chunk["start"], chunk["end"]
            covered[start:end] = True
            # The chunk's tokens: the document's tokens that came from its characters.
            pairs = zip(encoding.ids, encoding.offsets, strict=True)
            ids = [i for i, (s, e) in pairs if start <= s and e <= end]
            assert chunk["tokens"] == len(ids) <= 64
            got.append(chunk["embedding"])
            want.append(_reference_vector(model, ids))
            computed += len(ids) + 2
        missed = [i for i in range(len(document)) if not covered[i] and not document[i].isspace()]
        assert missed == [], "every non-space character is in a chunk"
        assert cosines(np.array(got), np.array(want)).min() > 0.99999
    assert answer["usage"]["prompt_tokens"] == computed, "usage counts every token the model read"


async def test_chunks_fill_the_window_by_default_and_a_long_document_is_never_truncated(client, reference):
    _, tokenizer = reference
    document = _document(3, 300)
    assert len(document) > MAX_CHARS * 5, "longer than a text may be: a document is bounded by the body"
    response = await client.post("/v1/embeddings/chunked", json={"input": document})
    assert response.status_code == 200, response.text
    chunks = response.json()["data"][0]["chunks"]
    sizes = [c["tokens"] for c in chunks]
    assert max(sizes) <= 254 and min(sizes[:-1]) >= 0.9 * 254, "chunks fill MiniLM's 256 less CLS and SEP"
    assert sum(sizes) == len(tokenizer.encode(document, add_special_tokens=False).ids), "no overlap, no loss"
    assert chunks[-1]["end"] == len(document.rstrip())


async def test_base64_is_the_same_vectors(client) -> None:
    body = {"input": [_document(4, 20)], "chunk_tokens": 32}
    floats = (await client.post("/v1/embeddings/chunked", json=body)).json()["data"][0]["chunks"]
    packed = (await client.post("/v1/embeddings/chunked", json={**body, "encoding_format": "base64"})).json()
    for chunk, plain in zip(packed["data"][0]["chunks"], floats, strict=True):
        vector = np.frombuffer(base64.b64decode(chunk["embedding"]), dtype=np.float32)
        np.testing.assert_allclose(vector, plain["embedding"], rtol=1e-6)
        where = ("start", "end", "tokens")
        assert [chunk[k] for k in where] == [plain[k] for k in where]


@pytest.mark.parametrize(("body", "status", "param", "words"), [
    ({"input": "a", "chunk_tokens": 9, "overlap_tokens": 9}, 400, "overlap_tokens", "below the chunk's 9"),
    ({"input": "a b c", "chunk_tokens": 255}, 400, "chunk_tokens", "1 to 254 tokens"),
    ({"input": "a b c", "chunk_tokens": 0}, 400, "chunk_tokens", ""),
    ({"input": ["fine", "   \n"]}, 400, "input", "only whitespace"),
    ({"input": ""}, 400, "input", ""),
    ({"input": "word " * (MAX_BYTES // 5 + 10)}, 413, None, str(MAX_BYTES)),
])
async def test_bad_sizes_are_refused_naming_the_field(client, body, status, param, words) -> None:
    response = await client.post("/v1/embeddings/chunked", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param, error
    assert words in error["message"], error
    assert (await client.post("/v1/embeddings/chunked", json={"input": "still serving"})).status_code == 200


async def test_the_route_is_in_the_openapi_document(client) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert "/v1/embeddings/chunked" in paths and "/embeddings/chunked" in paths
    schema = paths["/v1/embeddings/chunked"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("ChunkedEmbeddingRequest")
