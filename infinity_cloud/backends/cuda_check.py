"""Whether torch can run on a GPU here, and if not, exactly why: no driver or device in the
container, a driver too old for the CUDA torch was built with, or a GPU none of its kernels
are built for. The driver is asked through libcuda itself, since torch only says that CUDA
is unavailable.

`device auto` loads a model on the CPU when torch sees no GPU, which on a GPU instance is a
tenfold slowdown that nothing reports: so a model asked onto `cuda` refuses to start with the
reason (`require_usable_gpu`), `auto` on a machine with an NVIDIA driver but no usable GPU
says so once, loudly (`models.replicas`), and a GPU image (its environment names the device,
`IMAGE_DEVICE_ENV`) stops at start.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.hardware import has_nvidia_gpu

log = logging.getLogger(__name__)

# The oldest driver of each CUDA major version (NVIDIA's CUDA release notes, minor version
# compatibility): a build for CUDA X.y runs on any driver from the first one of X's branch.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
CUDA_ERROR_NO_DEVICE = 100
_DRIVER_RELEASE = re.compile(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class CudaFacts:
    """What decides whether CUDA works here."""

    torch: str | None  # torch's version; None when it is not installed
    torch_cuda: str | None  # the CUDA torch was built for ("12.6"); None for a CPU build
    torch_sees_gpu: bool
    driver_cuda: int | None = None  # the newest CUDA the driver runs, as cuDriverGetVersion says (12040)
    driver: str | None = None  # the driver's release ("550.90.07")
    init_error: int = 0  # cuInit's result
    devices: int = 0
    device_capability: tuple[int, int] | None = None  # the first GPU's, as torch reads it ((7, 0): V100)
    torch_archs: tuple[str, ...] = ()  # what torch's kernels are built for ("sm_80", "compute_90")


@functools.cache  # once a process: preflight, each model's load and `auto` all ask
def cuda_facts() -> CudaFacts:
    try:
        import torch
    except ImportError:
        torch_facts: tuple[str | None, str | None, bool] = (None, None, False)
    else:
        torch_facts = (torch.__version__, torch.version.cuda, torch.cuda.is_available())
        if torch_facts[2]:  # torch sees a GPU: whether its kernels are built for it is the last question
            return CudaFacts(*torch_facts, device_capability=torch.cuda.get_device_capability(0),
                             torch_archs=tuple(torch.cuda.get_arch_list()))
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")  # the driver's library, mounted by the GPU runtime
    except OSError:
        return CudaFacts(*torch_facts)
    version, count = ctypes.c_int(0), ctypes.c_int(0)
    libcuda.cuDriverGetVersion(ctypes.byref(version))
    init_error = libcuda.cuInit(0)
    if init_error == 0:
        libcuda.cuDeviceGetCount(ctypes.byref(count))
    return CudaFacts(*torch_facts, version.value or None, _driver_release(), init_error, count.value)


def _driver_release() -> str | None:
    try:
        found = _DRIVER_RELEASE.search(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def cuda_problem(facts: CudaFacts) -> str | None:
    """Why torch cannot run on a GPU here, or None when it can."""
    if facts.torch_sees_gpu:
        return _unbuilt_arch(facts)
    if facts.driver_cuda is None:
        return ("no NVIDIA driver is visible in this container (libcuda.so.1 cannot be loaded): the machine "
                "has no GPU, or the container was started without access to it")
    driver = f"the NVIDIA driver {facts.driver or '(release unknown)'}"
    runs = f"CUDA {facts.driver_cuda // 1000}.{facts.driver_cuda % 1000 // 10}"
    if facts.torch is None or facts.torch_cuda is None:
        what = "not installed" if facts.torch is None else f"{facts.torch}, a CPU build"
        return f"{driver} runs {runs}, but this image's torch is {what}"
    needed = int(facts.torch_cuda.split(".")[0])
    if facts.driver_cuda // 1000 < needed:
        oldest = MIN_DRIVER.get(needed, f"one made for CUDA {needed}")
        return (f"{driver} is too old: it runs up to {runs}, and this image's torch {facts.torch} is built "
                f"for CUDA {facts.torch_cuda}, which needs driver {oldest} or newer")
    if facts.init_error == CUDA_ERROR_NO_DEVICE or (facts.init_error == 0 and facts.devices == 0):
        return f"{driver} ({runs}) sees no CUDA device"
    if facts.init_error:
        return f"{driver} ({runs}) failed to start CUDA (cuInit error {facts.init_error})"
    return f"torch {facts.torch} does not see the {facts.devices} CUDA device(s) that {driver} ({runs}) has"


def _unbuilt_arch(facts: CudaFacts) -> str | None:
    """torch sees a GPU whose architecture none of its kernels are built for (a CUDA 13 build
    on a V100): every kernel would fail with "no kernel image is available". A cubin runs on
    its major version's later minors; PTX (compute_XY) is compiled for any newer GPU."""
    if facts.device_capability is None or not facts.torch_archs:
        return None
    major, minor = facts.device_capability
    for arch in facts.torch_archs:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit():
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        binary = kind == "sm" and built[0] == major and built[1] <= minor
        if binary or (kind == "compute" and built <= (major, minor)):
            return None
    return (f"this GPU's architecture is sm_{major}{minor}, and this image's torch {facts.torch} (CUDA "
            f"{facts.torch_cuda}) has kernels only for {', '.join(facts.torch_archs)}")


def require_usable_gpu(facts: CudaFacts | None = None, asked: str = "this is a GPU image") -> None:
    """Refuse to start what would otherwise serve on the CPU: `asked`, what wanted the GPU."""
    problem = cuda_problem(facts or cuda_facts())
    if problem:
        raise ConfigError(f"{asked}, but {problem}; refusing to serve on the CPU")


@functools.cache
def usable_gpu() -> bool:
    """Whether `device auto` runs on a GPU here: an NVIDIA driver is present and torch can use
    it. Present but unusable is said once, loudly, with the reason: the models then run on the
    CPU, many times slower, which nothing else would report."""
    if not has_nvidia_gpu():
        return False
    problem = cuda_problem(cuda_facts())
    if problem:
        log.warning("device auto: this machine has an NVIDIA driver, but %s; serving on the CPU instead "
                    "(ask for --device cuda to refuse to start instead)", problem)
    return problem is None
