"""What a served model tells its operators, read from a real server process over real HTTP:
the latency histograms on /metrics (by model and route template, queue time by model), and
the OpenTelemetry traces `--otlp-endpoint` exports, as a real OTLP/HTTP receiver decodes them."""

from __future__ import annotations

import gzip
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import FAKE, ROOT, server_process
from prometheus_client.parser import text_string_to_metric_families

from infinity_cloud.core.install_hint import install_command
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
        # A route with a parameter is labelled by its template, not by the path asked.
        assert http.post("/models/emb", json={"inputs": "four"}).status_code == 200
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
    assert delta(f"{request}_count", model="emb", route="/models/{model_id:path}") == 1
    assert delta(f"{request}_bucket", model="emb", route="/v1/embeddings", le="+Inf") == 5
    assert delta(f"{request}_sum", model="emb", route="/v1/embeddings") > 0
    # Queue time is per input, by model: 3 x 2 + 2 x 1 + 1 + 2 x 1 inputs each waited once for a batch.
    assert delta("infinity_cloud_queue_wait_seconds_count", model="emb", device="cpu") == 11
    assert delta("infinity_cloud_queue_wait_seconds_bucket", model="emb", device="cpu", le="+Inf") == 11
    assert delta("infinity_cloud_queue_wait_seconds_sum", model="emb", device="cpu") > 0
    assert delta("infinity_cloud_requests_total", model="emb", route="/rerank", status="400") == 2

    labels = {dict(key)["model"] for _, key in after if "model" in dict(key)}
    assert labels == {"emb"}
    routes = {dict(key)["route"] for _, key in after if "route" in dict(key)}
    assert routes == {"/v1/embeddings", "/embed", "/models/{model_id:path}", "/rerank"}
    # The buckets span this workload: a millisecond to a minute.
    bounds = sorted(float(dict(key)["le"]) for name, key in after
                    if name == f"{request}_bucket" and ("route", "/v1/embeddings") in key)
    assert bounds == [*LATENCY_BUCKETS, math.inf]
    assert bounds[0] <= 0.001 and 30 <= bounds[-2] <= 120


# -- traces: --otlp-endpoint, against a real OTLP/HTTP receiver ---------------------------------


class OtlpReceiver:
    """An OTLP/HTTP collector's traces endpoint (POST /v1/traces, a protobuf
    ExportTraceServiceRequest), keeping every span it is sent."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[Any] = []
        self.paths: list[str] = []
        lock = self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    receiver.paths.append(self.path)
                    receiver.spans += [span for resource in request.resource_spans
                                       for scope in resource.scope_spans for span in scope.spans]
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def traces(self, route: str) -> dict[bytes, list[Any]]:
        """The spans of each finished trace whose request span has `route`, by trace id."""
        with self.lock:
            spans = list(self.spans)
        roots = {s.trace_id for s in spans if s.name == "request" and attributes(s).get("route") == route}
        return {trace: [s for s in spans if s.trace_id == trace] for trace in roots}


def attributes(span: Any) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    pytest.importorskip("opentelemetry.sdk", reason="the tracing extra: pip install -e '.[tracing]'")
    found = OtlpReceiver()
    yield found
    found.server.shutdown()


@pytest.fixture(scope="module")
def traced(tiny_embedder: Path, receiver: OtlpReceiver) -> Iterator[str]:
    # The SDK's batch processor sends every 100 ms instead of every 5 s.
    with server_process("--model-id", str(tiny_embedder), "--served-model-name", "emb", "--backend", FAKE,
                        "--log-level", "warning", "--deadline-s", "600", "--otlp-endpoint", receiver.url,
                        env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as url:
        yield url


def test_each_request_is_a_trace_of_its_queue_wait_batches_forward_passes_and_response(
    traced: str, receiver: OtlpReceiver
) -> None:
    texts = [[f"text {i} of request {r}" for i in range(3)] for r in range(4)]

    def post(inputs: list[str]) -> int:
        body = {"model": "emb", "input": inputs}
        return httpx.post(f"{traced}/v1/embeddings", json=body, timeout=60).status_code

    with ThreadPoolExecutor(4) as pool:  # at once: their inputs may share batches
        assert list(pool.map(post, texts)) == [200] * 4
    deadline = time.monotonic() + 60
    while len(traces := receiver.traces("/v1/embeddings")) < 4 or any(
        {"request", "response"} - {s.name for s in spans} for spans in traces.values()
    ):
        assert time.monotonic() < deadline, f"4 traces not received in 60 s: {receiver.spans}"
        time.sleep(0.1)
    assert set(receiver.paths) == {"/v1/traces"}  # a bare endpoint gets OTLP/HTTP's path
    assert len(traces) == 4
    for spans in traces.values():
        by_name: dict[str, list[Any]] = {}
        for span in spans:
            by_name.setdefault(span.name, []).append(span)
        assert set(by_name) == {"request", "queue wait", "batch", "forward", "response"}, by_name.keys()
        (request,) = by_name["request"]
        assert request.parent_span_id == b""
        assert request.kind == request.SPAN_KIND_SERVER
        assert attributes(request)["http.response.status_code"] == 200
        for span in spans:
            assert attributes(span)["model"] == "emb" and attributes(span)["route"] == "/v1/embeddings"
            assert request.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
            assert span.end_time_unix_nano <= request.end_time_unix_nano
        for name in ("queue wait", "batch", "response"):
            assert all(s.parent_span_id == request.span_id for s in by_name[name]), name
        batches = {b.span_id: b for b in by_name["batch"]}
        assert len(by_name["forward"]) == len(batches) == len(by_name["queue wait"])
        for forward in by_name["forward"]:
            batch = batches[forward.parent_span_id]
            assert batch.start_time_unix_nano == forward.start_time_unix_nano
            assert forward.end_time_unix_nano <= batch.end_time_unix_nano
        # Every input of the request was in one of its batches, each after its wait.
        assert sum(attributes(b)["batch.inputs_of_request"] for b in batches.values()) == 3
        waits = sorted(w.end_time_unix_nano for w in by_name["queue wait"])
        assert waits == sorted(b.start_time_unix_nano for b in batches.values())
        (response,) = by_name["response"]
        assert response.start_time_unix_nano >= max(b.end_time_unix_nano for b in batches.values())


def test_a_refused_request_is_a_trace_with_its_status_and_no_batch(
    traced: str, receiver: OtlpReceiver
) -> None:
    refused = httpx.post(f"{traced}/rerank", json={"query": "q", "documents": ["d"]}, timeout=60)
    assert refused.status_code == 400, refused.text
    deadline = time.monotonic() + 60
    while not (traces := receiver.traces("/rerank")):
        assert time.monotonic() < deadline, "no trace of the refused request in 60 s"
        time.sleep(0.1)
    (spans,) = traces.values()
    assert sorted(s.name for s in spans) == ["request", "response"]
    request = next(s for s in spans if s.name == "request")
    assert attributes(request)["http.response.status_code"] == 400
    assert attributes(request)["model"] == "emb"  # the model the call meant


def test_the_otlp_endpoint_without_the_tracing_extra_fails_at_start_with_its_pip_command(
    tiny_embedder: Path,
) -> None:
    # The SDK blocked as if not installed; serve stops before loading a model.
    code = (
        "import sys; sys.modules['opentelemetry.sdk'] = None\n"
        "from infinity_cloud.cli import app\n"
        f"app(['serve', '--model-id', {str(tiny_embedder)!r}, '--backend', {FAKE!r}, "
        "'--otlp-endpoint', 'http://127.0.0.1:4318', '--port', '0'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "300"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert install_command("tracing") in done.stderr, done.stderr
    assert "loading" not in done.stdout + done.stderr


def test_an_image_built_for_a_traced_spec_holds_the_tracing_extra() -> None:
    from infinity_cloud.core.config import DeploymentSpec, ModelSpec
    from infinity_cloud.targets import container

    model = ModelSpec(model_id="sentence-transformers/all-MiniLM-L6-v2", backend="onnx")
    traced = DeploymentSpec(models=(model,), server={"otlp_endpoint": "http://collector:4318"})
    assert "tracing" in container.image_extras(traced, "cpu")
    assert "tracing" not in container.image_extras(DeploymentSpec(models=(model,)), "cpu")
