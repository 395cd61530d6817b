"""The platform an image installs its Python packages on: the base image's Python, its CPU
architecture and its C library. An image's requirements are resolved for this, not for the
building machine (whose venv may run a newer Python or another CPU).
"""

from __future__ import annotations

import platform as host
import re
from dataclasses import dataclass

from infinity_cloud.core.errors import ConfigError

# Oldest glibc a manylinux wheel may target (manylinux2014).
_OLDEST_GLIBC_MINOR = 17
_PYTHON_TAG = re.compile(r"(?:^|[/:])python:(\d+)\.(\d+)")
_PY_IN_TAG = re.compile(r"-py(\d)(\d+)-")
_UBUNTU = re.compile(r"ubuntu(\d+)\.04")
# The C library of the images the targets start FROM: Debian (python:*-slim, Modal's
# debian_slim), Amazon Linux 2023 (Lambda's Python 3.12 and later) and 2 (3.11 and older),
# Ubuntu (the Neuron images).
DEBIAN_GLIBC = (2, 36)
# A python:X.Y-slim-<release> tag names its Debian release.
DEBIAN_RELEASES = {"buster": (2, 28), "bullseye": (2, 31), "bookworm": (2, 36), "trixie": (2, 41)}
UBUNTU_GLIBC = {20: (2, 31), 22: (2, 35), 24: (2, 39)}
AL2023_GLIBC = (2, 34)
AL2_GLIBC = (2, 26)


@dataclass(frozen=True)
class ImagePlatform:
    """Where an image's packages install. `shipped` are packages the base image already holds
    ((name, version specifier) pairs), which the image must keep: its own software needs them."""

    python: str
    arch: str = "x86_64"  # or aarch64
    glibc: tuple[int, int] = DEBIAN_GLIBC
    image: str = ""
    shipped: tuple[tuple[str, str], ...] = ()

    def pip_platforms(self) -> list[str]:
        """Every wheel platform tag this C library runs, newest first (pip expands none of
        the manylinux_2_X tags by itself)."""
        major, minor = self.glibc
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, _OLDEST_GLIBC_MINOR - 1, -1)]
        return [*tags, f"manylinux2014_{self.arch}"]

    def __str__(self) -> str:
        major, minor = self.glibc
        where = f" ({self.image})" if self.image else ""
        return f"Python {self.python} on linux/{self.arch}, glibc {major}.{minor}{where}"


def arch_of(name: str) -> str:
    """x86_64 or aarch64, from any of the names platforms use (amd64, arm64, ...)."""
    name = name.lower()
    if name in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if name in ("aarch64", "arm64", "armv8"):
        return "aarch64"
    raise ValueError(f"unknown CPU architecture {name!r}")


def this_machine_arch() -> str:
    """The architecture a `docker build` on this machine makes by default."""
    return arch_of(host.machine())


def python_of(image: str) -> str | None:
    """The Python an image runs, read from its name: python:3.11-slim,
    public.ecr.aws/lambda/python:3.12, or a Neuron tag's -py310-; None when it does not say."""
    found = _PYTHON_TAG.search(image)
    if found:
        return f"{found.group(1)}.{found.group(2)}"
    found = _PY_IN_TAG.search(image)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def glibc_of(image: str, python: str) -> tuple[int, int]:
    """The glibc an image's distribution ships, read from its name."""
    if "lambda/python" in image:
        return AL2023_GLIBC if tuple(map(int, python.split("."))) >= (3, 12) else AL2_GLIBC
    found = _UBUNTU.search(image)
    if found:
        return UBUNTU_GLIBC.get(int(found.group(1)), UBUNTU_GLIBC[20])
    release = next((name for name in DEBIAN_RELEASES if f"-{name}" in image), None)
    return DEBIAN_RELEASES[release] if release else DEBIAN_GLIBC


def image_platform(image: str, arch: str = "x86_64", *, shipped: dict[str, str] | None = None
                   ) -> ImagePlatform | None:
    """The platform of a base image, or None when its Python cannot be told from its name
    (a custom image: its requirements are then not checked)."""
    python = python_of(image)
    if python is None:
        return None
    ships = tuple(sorted((shipped or {}).items()))
    return ImagePlatform(python, arch_of(arch), glibc_of(image, python), image, ships)


def required_platform(image: str, arch: str = "x86_64", *, shipped: dict[str, str] | None = None,
                      example: str = "python:X.Y") -> ImagePlatform:
    """`image_platform`, for an image whose requirements must be checked: one whose name does
    not tell its Python is refused (`example`: a name that does)."""
    found = image_platform(image, arch, shipped=shipped)
    if found is None:
        raise ConfigError(
            f"cannot tell the Python of base image {image!r} from its name: start FROM {example} (or an "
            "image whose tag names its Python), so its requirements can be resolved for it"
        )
    return found
