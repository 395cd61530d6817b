"""Slow clients against a real server process, `infinity-cloud serve` and SageMaker's
`serve` alike: headers or a body that do not arrive within their deadline get a 408 and the
connection closed (slowloris); clients in time are served."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import FAKE, free_port, server_process


@pytest.fixture(scope="module", params=["serve", "sagemaker"])
def url(request: pytest.FixtureRequest, tiny_embedder: Path, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[str]:
    if request.param == "serve":
        deadlines = ("--header-timeout-s", "1", "--body-timeout-s", "1")
        with server_process("--model-id", str(tiny_embedder), "--backend", FAKE, *deadlines) as running:
            yield running
        return
    folder = tmp_path_factory.mktemp("sagemaker-serve")
    config = folder / "infinity-cloud.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"model_id": str(tiny_embedder), "backend": FAKE}],
        "server": {"header_timeout_s": 1, "body_timeout_s": 1, "log_level": "warning"},
    }))
    port = free_port()
    env = {**os.environ, "INFINITY_CLOUD_CONFIG": str(config), "SAGEMAKER_BIND_TO_PORT": str(port),
           "SM_MODEL_DIR": str(folder / "no-model-data")}
    with (folder / "serve.log").open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "infinity_cloud.targets.sagemaker.serve", "serve"],
                                   stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (folder / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (folder / "serve.log").read_text()
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


def exchange(url: str, *parts: bytes) -> bytes:
    """Send `parts` on a raw connection, then read until the server closes it (or 15 s pass:
    a hang fails the test instead of stalling it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as conn:
        for part in parts:
            conn.sendall(part)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def test_headers_that_never_finish_get_408_and_a_closed_connection(url: str) -> None:
    answer = exchange(url, b"POST /embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == 408 and "headers" in error["message"] and "--header-timeout-s" in error["message"]


def test_a_body_that_never_finishes_gets_408(url: str) -> None:
    head = (b"POST /embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    answer = exchange(url, head, b'{"input": ')
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"body" in answer


def test_a_silent_connection_is_closed_too(url: str) -> None:
    assert exchange(url).startswith(b"HTTP/1.1 408")


def test_clients_in_time_are_served_on_kept_alive_connections(url: str) -> None:
    with httpx.Client(base_url=url, timeout=15) as client:
        for _ in range(3):  # one connection, several requests
            assert client.post("/embeddings", json={"input": "hello"}).status_code == 200


def test_a_body_past_the_limit_is_read_and_answered_with_a_413(url: str) -> None:
    """The body is read to its end before the answer, so the client reads a 413 instead of a
    reset from a server that closed on unread data."""
    size = 16 * 2**20 + 1  # the default limit, and one byte more
    head = (b"POST /embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % size)
    answer = exchange(url, head, b'{"input": "' + b"a" * (size - 13) + b'"}')
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"over the limit of 16777216 bytes" in answer
