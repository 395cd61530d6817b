"""Late chunking through the real app: `/v1/embeddings/chunked` with `late_chunking: true`, and
Jina's shape on `/v1/embeddings`, each against late chunking computed by hand with transformers
on the same tiny model (AutoModel's token states of the whole document, read in overlapping
windows where it is longer than the model's window; the mean of each chunk's own tokens;
normalised), on torch and OpenVINO."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import serve_in_process, spec_of
from tokenizers import Tokenizer
from transformers import AutoModel

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.engine import Engine

PROSE = ("late chunking reads each chunk in the context of its whole document so a pronoun knows "
         "what it means . the city of berlin is large ; it has many people ! is a window ever cut ?")
WORDS = PROSE.split(" ")
WINDOW = 128  # the tiny model's max_position_embeddings (model_factory.MAX_LENGTH)
ROOM = WINDOW - 2  # beside [CLS] and [SEP]
OVERLAP = ROOM // 8  # tasks.late_chunking.WINDOW_OVERLAP_SHARE


def _document(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.fixture(scope="module", params=["torch", "openvino"])
async def client(request: pytest.FixtureRequest, tiny_embedder: Path) -> AsyncIterator[httpx.AsyncClient]:
    model = ModelSpec(model_id=str(tiny_embedder), served_model_name="tiny", backend=request.param,
                      dtype="float32")
    async with serve_in_process(spec_of(model)) as c:
        yield c


@pytest.fixture(scope="module")
def reference(tiny_embedder: Path) -> tuple[torch.nn.Module, Tokenizer]:
    tokenizer = Tokenizer.from_file(str(tiny_embedder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return AutoModel.from_pretrained(str(tiny_embedder)).eval(), tokenizer


def _hand_states(model: torch.nn.Module, ids: list[int], cls: int, sep: int) -> np.ndarray:
    """Each of the document's own tokens' state, read in windows of ROOM tokens sharing OVERLAP,
    each token's kept from the window where it sits farthest from a cut (split at the middle of
    the shared tokens)."""
    starts = [0]
    while starts[-1] + ROOM < len(ids):
        starts.append(starts[-1] + ROOM - OVERLAP)
    states = np.zeros((len(ids), model.config.hidden_size), np.float32)
    for i, first in enumerate(starts):
        stop = min(first + ROOM, len(ids))
        window = torch.tensor([[cls, *ids[first:stop], sep]])
        with torch.no_grad():
            out = model(input_ids=window, attention_mask=torch.ones_like(window),
                        token_type_ids=torch.zeros_like(window)).last_hidden_state[0, 1:-1].numpy()
        keep_first = first if i == 0 else first + OVERLAP // 2
        keep_stop = stop if i == len(starts) - 1 else starts[i + 1] + OVERLAP // 2
        states[keep_first:keep_stop] = out[keep_first - first : keep_stop - first]
    return states


def _hand_late_chunks(reference, document: str, spans: list[tuple[int, int]]) -> tuple[np.ndarray, int]:
    """Each character span's tokens' mean state, normalised; and the windows' token count."""
    model, tokenizer = reference
    encoding = tokenizer.encode(document, add_special_tokens=False)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    states = _hand_states(model, encoding.ids, cls, sep)
    vectors = []
    for start, end in spans:
        own = [t for t, (s, _) in enumerate(encoding.offsets) if start <= s < end]
        assert own, (start, end)
        mean = states[own].mean(0)
        vectors.append(mean / np.linalg.norm(mean))
    windows = 1 if len(encoding.ids) <= ROOM else 1 + -(-(len(encoding.ids) - ROOM) // (ROOM - OVERLAP))
    return np.stack(vectors), len(encoding.ids) + (windows - 1) * OVERLAP + 2 * windows


@pytest.mark.parametrize("words", [60, 400])  # shorter than the window; ~4 windows
async def test_late_chunks_are_the_hand_computed_ones(client, reference, words) -> None:
    document = _document(words, words)
    body = {"input": document, "chunk_tokens": 24, "overlap_tokens": 4, "late_chunking": True}
    response = await client.post("/v1/embeddings/chunked", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    chunks = answer["data"][0]["chunks"]
    got = np.array([c["embedding"] for c in chunks], np.float32)
    want, computed = _hand_late_chunks(reference, document, [(c["start"], c["end"]) for c in chunks])
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1)
    assert cosine.min() >= 0.99999, cosine
    assert answer["usage"]["prompt_tokens"] == computed, "usage counts the tokens the windows computed"

    plain = (await client.post("/v1/embeddings/chunked", json={**body, "late_chunking": False})).json()
    assert [c["start"] for c in plain["data"][0]["chunks"]] == [c["start"] for c in chunks], "same chunks"
    alone = np.array([c["embedding"] for c in plain["data"][0]["chunks"]], np.float32)
    assert (alone * got).sum(1).min() < 0.9999, "a late chunk is read in context, not on its own"


async def test_jinas_shape_is_each_input_pooled_in_the_context_of_all(client, reference) -> None:
    pieces = [_document(7, 30), _document(8, 50), _document(9, 100)]  # 180 words: two windows
    body = {"model": "tiny", "input": pieces, "late_chunking": True}
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    got = np.array([d["embedding"] for d in response.json()["data"]], np.float32)
    document, spans, at = " ".join(pieces), [], 0
    for piece in pieces:
        spans.append((at, at + len(piece)))
        at += len(piece) + 1
    want, computed = _hand_late_chunks(reference, document, spans)
    assert ((got * want).sum(1) / np.linalg.norm(got, axis=1)).min() >= 0.99999
    assert response.json()["usage"]["prompt_tokens"] == computed
    plain = (await client.post("/v1/embeddings", json={"model": "tiny", "input": pieces})).json()
    assert len(plain["data"]) == 3
    assert plain["data"][0]["embedding"] != response.json()["data"][0]["embedding"]


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/embeddings", {"input": [[5, 6, 7]], "late_chunking": True}, "input"),
    ("/v1/embeddings", {"input": ["a b", "   "], "late_chunking": True}, "input"),
    ("/v1/embeddings", {"input": ["a b"], "late_chunking": True, "embedding_type": "int8"}, "embedding_type"),
    ("/v1/embeddings", {"input": ["a b"], "late_chunking": True, "output_dtype": "int8"}, "output_dtype"),
    ("/v1/embeddings/chunked", {"input": "a b c", "chunk_tokens": 4, "overlap_tokens": 4,
                                "late_chunking": True}, "overlap_tokens"),
    ("/v1/embeddings/chunked", {"input": "a b", "chunk_tokens": 127, "late_chunking": True}, "chunk_tokens"),
    ("/v1/embeddings/chunked", {"input": "", "late_chunking": True}, "input"),
])
async def test_bad_late_chunking_requests_get_a_400_naming_the_field(client, route, body, param) -> None:
    response = await client.post(route, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text
    served = await client.post(route, json={"input": "still serving", "late_chunking": True})
    assert served.status_code == 200, served.text


async def test_the_token_states_tower_is_built_on_the_first_late_call_not_at_load(tiny_embedder) -> None:
    model = ModelSpec(model_id=str(tiny_embedder), served_model_name="tiny", backend="torch", dtype="float32")
    engine = Engine(spec_of(model))
    async with serve_in_process(engine) as client:
        served = engine.model("tiny")
        assert served.loaded.lazy == {}, "cold start and memory: nothing built for late chunking at load"
        assert (await client.post("/v1/embeddings", json={"input": ["a b", "c d"]})).status_code == 200
        assert served.loaded.lazy == {}
        aside = engine.fleet.memory._aside
        late = await client.post("/v1/embeddings", json={"input": ["a b", "c d"], "late_chunking": True})
        assert late.status_code == 200, late.text
        assert list(served.loaded.lazy) == ["text:token_states"] and served.healthy
        assert served.towers == ("text",), "not a modality of the model"
        tower = served.loaded.lazy["text:token_states"]
        kept = served._bytes_per_batch_token() * tower.replicas[0].queue.batch_tokens
        assert engine.fleet.memory._aside - aside == kept > 0, \
            "its full batches' working set is kept in the memory budget, as the model's own towers' are"


async def test_a_models_dense_layer_follows_each_chunks_pooling(build_model) -> None:
    """sentence-transformers' Pooling -> Dense -> Normalize, with the chunk's span as what is
    pooled: the Dense layer maps each chunk's mean state (and not each token's)."""
    from sentence_transformers import SentenceTransformer

    path = build_model("bert_embedder", dense_out=16)
    model = ModelSpec(model_id=str(path), served_model_name="dense", backend="torch", dtype="float32")
    document = _document(11, 200)
    async with serve_in_process(spec_of(model)) as client:
        body = {"input": document, "chunk_tokens": 32, "late_chunking": True}
        response = await client.post("/v1/embeddings/chunked", json=body)
    assert response.status_code == 200, response.text
    chunks = response.json()["data"][0]["chunks"]
    got = np.array([c["embedding"] for c in chunks], np.float32)
    assert got.shape[1] == 16
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    encoding = tokenizer.encode(document, add_special_tokens=False)
    states = _hand_states(AutoModel.from_pretrained(str(path)).eval(), encoding.ids,
                          tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"))
    dense = SentenceTransformer(str(path), device="cpu")[2]
    for vector, chunk in zip(got, chunks, strict=True):
        own = [t for t, (s, _) in enumerate(encoding.offsets) if chunk["start"] <= s < chunk["end"]]
        with torch.no_grad():
            mapped = dense({"sentence_embedding": torch.tensor(states[own].mean(0))[None]})
        want = mapped["sentence_embedding"][0].numpy()
        assert float(vector @ want) / np.linalg.norm(want) / np.linalg.norm(vector) >= 0.99999
