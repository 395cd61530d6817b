"""What a served model tells its operators, read from a real server process over real HTTP:
the latency histograms on /metrics (by model and route template, queue time by model)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import FAKE, server_process
from prometheus_client.parser import text_string_to_metric_families

from infinity_cloud.server.metrics import LATENCY_BUCKETS

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(url: str) -> Samples:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def server(tiny_embedder: Path) -> Iterator[str]:
    with server_process("--model-id", str(tiny_embedder), "--served-model-name", "emb", "--backend", FAKE,
                        "--log-level", "warning", "--deadline-s", "600") as url:
        yield url


def test_latency_histograms_count_requests_by_model_and_route_template(server: str) -> None:
    before = samples(server)
    with httpx.Client(base_url=server, timeout=60) as http:
        for _ in range(3):  # two inputs each
            answered = http.post("/v1/embeddings", json={"model": "emb", "input": ["one", "two"]})
            assert answered.status_code == 200
        for _ in range(2):  # TEI's route, one input each
            assert http.post("/embed", json={"inputs": "three"}).status_code == 200
        # A name the server does not know is never a label of its own: the one embedder answers
        # OpenAI's model names, and a call it cannot answer goes under the model it meant.
        for i in range(2):
            served = http.post("/v1/embeddings", json={"model": f"no-such-{i}", "input": ["x"]})
            assert served.status_code == 200
            refused = http.post("/rerank", json={"model": f"no-such-{i}", "query": "q", "documents": ["d"]})
            assert refused.status_code == 400, refused.text
    after = samples(server)

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        assert key in after, f"no {name}{labels} in /metrics: {sorted(k for k in after if k[0] == name)}"
        return after[key] - before.get(key, 0.0)

    request = "infinity_cloud_request_seconds"
    assert delta(f"{request}_count", model="emb", route="/v1/embeddings") == 5
    assert delta(f"{request}_count", model="emb", route="/embed") == 2
    assert delta(f"{request}_bucket", model="emb", route="/v1/embeddings", le="+Inf") == 5
    assert delta(f"{request}_sum", model="emb", route="/v1/embeddings") > 0
    # Queue time is per input, by model: 3 x 2 + 2 x 1 + 2 x 1 inputs each waited once for a batch.
    assert delta("infinity_cloud_queue_wait_seconds_count", model="emb") == 10
    assert delta("infinity_cloud_queue_wait_seconds_bucket", model="emb", le="+Inf") == 10
    assert delta("infinity_cloud_queue_wait_seconds_sum", model="emb") > 0
    assert delta("infinity_cloud_requests_total", model="emb", route="/rerank", status="400") == 2

    labels = {dict(key)["model"] for _, key in after if "model" in dict(key)}
    assert labels == {"emb"}
    routes = {dict(key)["route"] for _, key in after if "route" in dict(key)}
    assert routes == {"/v1/embeddings", "/embed", "/rerank"}
    # The buckets span this workload: a millisecond to a minute.
    bounds = sorted(float(dict(key)["le"]) for name, key in after
                    if name == f"{request}_bucket" and ("route", "/v1/embeddings") in key)
    assert bounds == [*LATENCY_BUCKETS, math.inf]
    assert bounds[0] <= 0.001 and 30 <= bounds[-2] <= 120
