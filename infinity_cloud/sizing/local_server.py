"""A server started here for `bench --model-id`: `infinity-cloud serve` on the same spec, in a
process of its own (so its memory is its own and the load generator does not share its
interpreter), on a free loopback port; stopped when the measurement ends."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from infinity_cloud.config import DeploymentSpec
from infinity_cloud.sizing.bench import BenchError


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def local_server(spec: DeploymentSpec, ready_timeout_s: float = 1800.0) -> Iterator[str]:
    """Serve `spec` and yield its URL once every model is ready; its log goes to a file, shown
    in the error when it does not start."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="infinity-cloud-bench-") as folder:
        config = Path(folder) / "spec.yaml"
        given = spec.model_dump(mode="json", exclude_defaults=True)
        config.write_text(yaml.safe_dump(given), encoding="utf-8")
        log_path = Path(folder) / "server.log"
        command = [sys.executable, "-m", "infinity_cloud", "serve", "--config", str(config),
                   "--host", "127.0.0.1", "--port", str(port)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        url = f"http://127.0.0.1:{port}{spec.server.url_prefix}"
        try:
            _wait_ready(process, url, spec, ready_timeout_s, log_path)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(
    process: subprocess.Popen[bytes], url: str, spec: DeploymentSpec, timeout_s: float, log_path: Path
) -> None:
    keys = spec.server.keys
    headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise BenchError(f"the server exited with {process.returncode} before it was ready:\n{tail}")
        try:
            if httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise BenchError(f"the server was not ready after {timeout_s:.0f} s (its log: {log_path})")
