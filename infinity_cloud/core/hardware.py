"""What this machine offers, found without importing torch or any backend.

Backends and the `auto` choices read these so a serverless cold start never pays for a
library import just to learn that there is no GPU.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path


@functools.cache
def _cpuinfo(field: str) -> str:
    """The first `field` line of /proc/cpuinfo ("" where it does not exist)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(field):
            return line.partition(":")[2].strip()
    return ""


# The flags whose presence changes which kernels a CPU backend runs, and so the last digits
# of its numbers.
KERNEL_FLAGS = frozenset({
    "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_fp16",
})


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo does not exist)."""
    return frozenset(_cpuinfo("flags").split())


def kernel_flags() -> list[str]:
    """This CPU's flags among KERNEL_FLAGS, sorted: what a measurement on it depends on."""
    return sorted(KERNEL_FLAGS & cpu_flags())


def cpu_model() -> str:
    """The CPU's model name, as the kernel reports it ("" where it does not)."""
    return _cpuinfo("model name")


def cpu_clock_ghz() -> float | None:
    """The clock the kernel reports for the first CPU, GHz (None where it reports none)."""
    try:
        return float(_cpuinfo("cpu MHz")) / 1000
    except ValueError:
        return None


def cpu_has_fast_bf16() -> bool:
    """True where bfloat16 matmuls run in hardware (AMX tiles or AVX512-BF16)."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def int8_kernels() -> str:
    """The class of integer matrix kernels this CPU runs, the thing int8 accuracy and speed
    depend on: `amx`, `vnni` (AVX512-VNNI or AVX-VNNI: exact int32 accumulation), `avx512`,
    `avx2` (u8 x s8 pairs summed in int16, which can saturate) or `other`."""
    flags = cpu_flags()
    if "amx_int8" in flags:
        return "amx"
    if {"avx512_vnni", "avx_vnni"} & flags:
        return "vnni"
    if "avx512bw" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "other"


def usable_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def has_nvidia_gpu() -> bool:
    """A CUDA device node or driver is present; cheap enough to call at every start."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()


def has_neuron_device() -> bool:
    """An AWS Neuron device (Inferentia2, Trainium) is present."""
    return Path("/dev/neuron0").exists()
