"""A GPU asked for and not usable (issue 56's start check): `--device cuda` refuses to start,
saying why; `--device auto` on a machine with an NVIDIA driver that torch cannot use serves
on the CPU and says so once, loudly. This machine has no NVIDIA driver: the first is run for
real; the second needs a driver that is there and unusable, which only the facts that
`cuda_check` reads can stand in for (`cuda_facts`: libcuda's answers and torch's)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, free_port

from infinity_cloud.backends import cuda_check, registry
from infinity_cloud.backends.cuda_check import CudaFacts
from infinity_cloud.core.hardware import has_nvidia_gpu


@pytest.mark.skipif(has_nvidia_gpu(), reason="this checks a machine without a usable GPU")
@pytest.mark.parametrize("device", [["--device", "cuda"], ["--device", "cuda", "--device-ids", "0,1"],
                                    ["--device", "cuda:1"]])
def test_serve_on_cuda_without_a_gpu_exits_saying_why(tiny_embedder: Path, device: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "infinity_cloud", "serve", "--model-id", str(tiny_embedder),
         "--port", str(free_port()), *device], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert f"model {tiny_embedder}: --device {device[1]}, but this machine shows no NVIDIA GPU" in out, out
    assert "Traceback" not in out


def test_a_model_asked_onto_cuda_in_process_refuses_to_load_saying_why(
    tiny_embedder: Path, unusable_driver: None
) -> None:
    """Not through `serve` (the Engine API, a hot load): the load itself refuses, with the reason."""
    from infinity_cloud.core.config import DeploymentSpec, ModelSpec
    from infinity_cloud.core.errors import InfinityCloudError
    from infinity_cloud.engine import Engine

    model = ModelSpec(model_id=str(tiny_embedder), served_model_name="m", device="cuda")
    with pytest.raises(InfinityCloudError, match=r"model m asks for device cuda, but the NVIDIA driver "
                       r"550\.90\.07 is too old.*refusing to serve on the CPU"):
        Engine.loaded(DeploymentSpec(models=(model,)))


# A driver that runs CUDA 12.4, and a torch built for CUDA 13 (PyPI's default): unusable.
OLD_DRIVER = CudaFacts("2.13.0", "13.0", False, 12040, "550.90.07", init_error=0, devices=1)


@pytest.fixture
def unusable_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_check, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(cuda_check, "cuda_facts", lambda: OLD_DRIVER)
    cuda_check.usable_gpu.cache_clear()
    yield
    cuda_check.usable_gpu.cache_clear()


def test_auto_with_an_unusable_driver_serves_on_the_cpu_saying_so_once(
    unusable_driver: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        first, second = registry.auto_backends("auto"), registry.auto_backends("auto")
    assert first == second == [n for n in registry.auto_order("cpu") if registry.installed(n)]
    loud = [r for r in caplog.records if "device auto" in r.getMessage()]
    assert len(loud) == 1 and loud[0].levelno == logging.WARNING
    assert "is too old" in loud[0].getMessage() and "serving on the CPU" in loud[0].getMessage()


def test_auto_with_a_usable_gpu_picks_the_gpu_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    usable = CudaFacts("2.13.0+cu126", "12.6", True, 12040, "550.90.07", devices=1)
    monkeypatch.setattr(cuda_check, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(cuda_check, "cuda_facts", lambda: usable)
    cuda_check.usable_gpu.cache_clear()
    try:
        wanted = [n for n in registry.auto_order("cuda") if registry.installed(n)]
        assert registry.auto_backends("auto") == wanted
    finally:
        cuda_check.usable_gpu.cache_clear()


def test_auto_without_any_driver_is_the_cpu_and_nothing_loud(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cuda_check, "has_nvidia_gpu", lambda: False)
    cuda_check.usable_gpu.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert registry.auto_backends("auto")[0] == registry.auto_order("cpu")[0]
        assert not [r for r in caplog.records if "device auto" in r.getMessage()]
    finally:
        cuda_check.usable_gpu.cache_clear()
