"""The user's `kubectl`, run with the spec's context and namespace: how `deploy`, `status`,
`delete` and `invoke` reach the cluster. Each call is one line of shell that `--dry-run`
prints exactly as it would run it."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from infinity_cloud.targets.base import TargetError, one_line
from infinity_cloud.targets.kubernetes.spec import KubernetesSpec

# Server-side apply under a field manager of our own: a field another tool set (an HPA's
# replica count, a mesh's sidecar) is kept, and a conflict is said, not overwritten.
FIELD_MANAGER = "infinity-cloud"
TIMEOUT_S = 120


def program() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise TargetError(
            "kubectl is not installed: install it (https://kubernetes.io/docs/tasks/tools/), or apply "
            "the rendered folder with your own tools (`kubectl apply -k DIR`, Argo CD, Flux)"
        )
    return found


def command(settings: KubernetesSpec, *args: str) -> list[str]:
    """A kubectl command line with the spec's context and namespace."""
    context = ["--context", settings.context] if settings.context else []
    return ["kubectl", *context, "--namespace", settings.namespace, *args]


def shown(argv: Sequence[str]) -> str:
    return shlex.join(argv)


def run(argv: list[str], *, stdin: str | None = None, timeout: float = TIMEOUT_S) -> str:
    """Run it; its stdout. A failure is a TargetError with kubectl's own message."""
    try:
        done = subprocess.run(
            [program(), *argv[1:]], input=stdin, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise TargetError(f"`{shown(argv)}` did not finish in {timeout:.0f} s") from None
    if done.returncode != 0:
        raise TargetError(f"`{shown(argv)}` failed: {one_line(done.stderr or done.stdout, 600)}")
    return done.stdout


def get_json(argv: list[str]) -> Any:
    return json.loads(run(argv) or "{}")
