from __future__ import annotations

import httpx
from conftest import serve_in_process, spec_of

from infinity_cloud.core.config import ModelSpec


async def test_in_process_embeddings(tiny_embedder):
    async with serve_in_process(spec_of(ModelSpec(model_id=str(tiny_embedder)))) as client:
        response = await client.post("/v1/embeddings", json={"input": ["hello world"]})
        assert response.status_code == 200
        assert len(response.json()["data"][0]["embedding"]) == 32


def test_live_server_serves_three_models(live_server):
    models = httpx.get(f"{live_server}/v1/models").json()["data"]
    assert {m["id"]: m["capabilities"] for m in models} == {
        "minilm": ["embed"],
        "reranker": ["rerank"],
        "classifier": ["classify"],
    }
