"""A server started here for `bench --model-id`: `infinity-cloud serve` on the same spec, in a
process of its own (so its memory is its own and the load generator does not share its
interpreter), on the loopback address at the spec's `--port` where one is given, else a free
port; stopped when the measurement ends, however it ends: `stopped_by_signals` turns SIGINT,
SIGTERM and SIGHUP into an exception, so the stop in `local_server` runs for them too."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.sizing.bench import BenchError

HOST = "127.0.0.1"
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 30.0


class Interrupted(KeyboardInterrupt):
    """bench was asked to stop by a signal (`signum`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """While inside, SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread, so that
    `finally` blocks run (SIGTERM's default ends the process at once, and a server started
    here would be left running, its parent gone). Elsewhere than the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in STOPPING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_of(spec: DeploymentSpec) -> int:
    """The port asked for (`--port`, the config's, INFINITY_CLOUD_PORT), else a free one; a port
    taken is refused here: a server already there would answer the health check in place of
    the one started, and bench would measure it."""
    asked = "port" in spec.server.model_fields_set and spec.server.port
    if not asked:
        return _free_port()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            sock.bind((HOST, spec.server.port))
        except OSError as exc:
            raise BenchError(
                f"port {spec.server.port} is taken ({exc.strerror}): give another --port, or none "
                "for a free one"
            ) from None
    return spec.server.port


@contextlib.contextmanager
def local_server(spec: DeploymentSpec, ready_timeout_s: float = 1800.0) -> Iterator[str]:
    """Serve `spec` and yield its URL once every model is ready; its log goes to a file, shown
    in the error when it does not start. The server runs in a session of its own, so a Ctrl-C
    at the terminal reaches bench alone, which stops it (in order, and only once)."""
    port = _port_of(spec)
    with tempfile.TemporaryDirectory(prefix="infinity-cloud-bench-") as folder:
        config = Path(folder) / "spec.yaml"
        given = spec.model_dump(mode="json", exclude_defaults=True)
        config.write_text(yaml.safe_dump(given), encoding="utf-8")
        log_path = Path(folder) / "server.log"
        command = [sys.executable, "-m", "infinity_cloud", "serve", "--config", str(config),
                   "--host", HOST, "--port", str(port)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(), start_new_session=True
            )
        url = f"http://{HOST}:{port}{spec.server.url_prefix}"
        try:
            _wait_ready(process, url, spec, ready_timeout_s, log_path)
            yield url
        finally:
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL it after STOP_GRACE_S; a second signal to
    bench meanwhile is held back (in the main thread), so the stop is not cut short."""
    held = threading.current_thread() is threading.main_thread()
    if held:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    try:
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)


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
            answered = httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200
            if answered and process.poll() is None:  # ours answered, not a server there before it
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise BenchError(f"the server was not ready after {timeout_s:.0f} s (its log: {log_path})")
