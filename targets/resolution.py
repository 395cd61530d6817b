"""Requirements resolved for an image's platform, from the package index, wheels only: pip's
own resolver run as a dry run for the image's Python, architecture and C library
(`pip install --dry-run --only-binary=:all: --platform ... --python-version ...`), so a
build finds out here, not in `docker build` or the cloud, that a pin has no wheel there.

The package index is whatever pip is configured with here (pip.conf, PIP_INDEX_URL).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from infinity_cloud.core.errors import ConfigError
from infinity_cloud.core.progress import slow_step
from infinity_cloud.targets.platforms import ImagePlatform

# How long pip may take to answer (it fetches metadata only, but for every candidate).
RESOLVE_TIMEOUT_S = 300
_NOT_FOUND = re.compile(r"No matching distribution found for ([^\s;]+)")
_CANNOT = re.compile(r"Cannot install (.+?) because these package versions have conflicting dependencies")
_CONFLICT = re.compile(r"The conflict is caused by:\s*\n((?:\s+.+\n?)+)")
_REQUIRES_PYTHON = re.compile(r"Ignored the following versions that require a different python version")
# What pip prints when it cannot reach the index (as opposed to finding nothing there).
_UNREACHABLE = (
    "NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
    "Name or service not known", "ConnectTimeoutError", "ProxyError", "Max retries exceeded",
    "Network is unreachable", "Connection refused", "ReadTimeoutError", "No route to host",
    "SSLError", "Could not fetch URL", "HTTP error 40", "HTTP error 50", "403 Client Error",
    "401 Client Error",
)
# Once the index could not be asked, a process does not ask again (a build asks a few times).
_unreachable: list[str] = []


# Set to 0 to build without asking the index (offline): the tested versions, unchecked.
RESOLVE_ENV = "INFINITY_CLOUD_RESOLVE_IMAGES"


def enabled() -> bool:
    return os.environ.get(RESOLVE_ENV, "1").lower() not in {"0", "false", "no", "off"}


class Unresolvable(ConfigError):
    """The requirements have no installable set of wheels on the image's platform."""


class IndexUnreachable(Exception):
    """pip could not reach the package index (or is not installed here)."""


def resolve(requirements: Iterable[str], platform: ImagePlatform, *, deps: bool = True) -> dict[str, str]:
    """The version pip installs of each requested package on `platform` (canonical name ->
    version); the base image's own packages (`platform.shipped`) constrain the choice.
    Unresolvable names the package that fails; IndexUnreachable when the index cannot be
    asked. Answers are kept for the process: an index changes slower than a build runs."""
    if _unreachable:
        raise IndexUnreachable(_unreachable[0])
    try:
        return dict(_resolve(tuple(requirements), platform, deps))
    except IndexUnreachable as exc:
        _unreachable.append(str(exc))
        raise


def forget() -> None:
    """Ask the index afresh: what it answered, and whether it could be reached."""
    _resolve.cache_clear()
    _unreachable.clear()


@functools.lru_cache(maxsize=64)
def _resolve(
    requirements: tuple[str, ...], platform: ImagePlatform, deps: bool
) -> tuple[tuple[str, str], ...]:
    from packaging.utils import canonicalize_name

    with tempfile.TemporaryDirectory(prefix="infinity-cloud-resolve-") as tmp:
        report, constraints = Path(tmp) / "report.json", Path(tmp) / "constraints.txt"
        kept = "".join(f"{name}{spec}\n" for name, spec in platform.shipped)
        constraints.write_text(kept, encoding="utf-8")
        command = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--only-binary=:all:", "--implementation", "cp", "--python-version", platform.python,
            # --target: older pips (23.x) refuse --platform without it; nothing is written.
            "--target", str(Path(tmp) / "target"), "--report", str(report),
            "--retries", "1", "--timeout", "30", "--disable-pip-version-check",
            "-c", str(constraints), *(() if deps else ("--no-deps",)),
        ]
        for tag in platform.pip_platforms():
            command += ["--platform", tag]
        try:
            # Seconds to a minute: said as it starts, so a build is never silent that long.
            asking = f"resolving {len(requirements)} requirements for {platform} with the package index"
            with slow_step(asking):
                done = subprocess.run(
                    [*command, *requirements], capture_output=True, timeout=RESOLVE_TIMEOUT_S,
                    encoding="utf-8", errors="replace",
                )
        except subprocess.TimeoutExpired:
            raise IndexUnreachable(f"pip did not answer within {RESOLVE_TIMEOUT_S} s") from None
        output = done.stdout + done.stderr
        if done.returncode != 0:
            if "No module named pip" in output:
                raise IndexUnreachable("pip is not installed in this environment (python -m ensurepip)")
            if any(sign in output for sign in _UNREACHABLE) and "(from versions: none)" in output:
                raise IndexUnreachable(_last_error(output))
            raise Unresolvable(_explain(output, str(platform), platform.shipped))
        installed = json.loads(report.read_text(encoding="utf-8"))["install"]
    return tuple(sorted(
        (canonicalize_name(item["metadata"]["name"]), item["metadata"]["version"]) for item in installed
    ))


def _explain(output: str, described: str, shipped: tuple[tuple[str, str], ...] = ()) -> str:
    """pip's refusal as one message: the package and the platform, and why."""
    found = _NOT_FOUND.search(output)
    if found:
        why = " (its versions there need another Python)" if _REQUIRES_PYTHON.search(output) else ""
        return f"{found.group(1)} has no wheel for {described}{why}"
    cannot, conflict = _CANNOT.search(output), _CONFLICT.search(output)
    if cannot or conflict:
        what = cannot.group(1) if cannot else "the requirements"
        lines = conflict.group(1).splitlines() if conflict else []
        causes = "; ".join(line.strip() for line in lines if line.strip())
        image_has = [f"{name}{spec}" for name, spec in shipped if name in what]
        because = f" (the base image ships {', '.join(image_has)})" if image_has else ""
        return f"cannot install {what} on {described}{because}" + (f": {causes}" if causes else "")
    return f"the requirements do not resolve for {described}: {_last_error(output)}"


def _last_error(output: str) -> str:
    lines = output.strip().splitlines()
    errors = [line.removeprefix("ERROR: ").strip() for line in lines if line.startswith("ERROR")]
    return errors[-1] if errors else lines[-1][:300] if lines else "pip failed"
