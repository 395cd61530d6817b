"""A stand-in for the Lambda runtime: a built image's handler in a process of its own, as
Lambda runs it (LAMBDA_TASK_ROOT at the build folder, the Dockerfile's ENV, the handler its
CMD names, imported once), invoked one event at a time over a pipe. No Lambda can run here
(moto runs functions in Docker only).

Its own process matters beyond faithfulness: the handler's engine measures the process's
resident memory against the function's memory budget, and a test process holding other
tests' models is not what a function holds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# The answers go out on a copy of stdout; what the handler prints goes to stderr.
RUNTIME = """
import importlib, json, os, sys
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
module_name, _, function = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module_name), function)
print("ready", file=answers, flush=True)
for line in sys.stdin:
    print(json.dumps(handler(json.loads(line), None)), file=answers, flush=True)
"""


def image_env(out: Path) -> tuple[dict[str, str], str]:
    """The Dockerfile's ENV (with LAMBDA_TASK_ROOT at `out`) and the handler its CMD names."""
    dockerfile = (out / "Dockerfile").read_text().replace("\\\n", " ")
    env = {"LAMBDA_TASK_ROOT": str(out)}
    for line in dockerfile.splitlines():
        if line.startswith("ENV "):
            for key, value in re.findall(r"(\w+)=(\S+)", line):
                env[key] = value.replace("${LAMBDA_TASK_ROOT}", str(out))
    (handler,) = json.loads(re.search(r"^CMD (.+)$", dockerfile, re.M).group(1))
    return env, handler


class LambdaRuntime:
    """The handler of the image built in `out`, started on the first `invoke` (Lambda's init)."""

    def __init__(self, out: Path, cwd: Path) -> None:
        self.out = out
        self.cwd = cwd
        self._process: subprocess.Popen[str] | None = None
        self.invocations = 0

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(event) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        assert line, f"the handler's process ended ({process.poll()})"
        self.invocations += 1
        return json.loads(line)

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None:
            env, handler = image_env(self.out)
            self._process = subprocess.Popen(
                [sys.executable, "-c", RUNTIME, handler], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, cwd=self.cwd,
                # The image's own package copy first, as in ${LAMBDA_TASK_ROOT}; its pinned
                # dependencies are this venv's.
                env={**os.environ, **env, "PYTHONPATH": str(self.out)},
            )
            assert self._process.stdout is not None
            ready = self._process.stdout.readline()
            assert ready.strip() == "ready", f"the handler did not import ({self._process.poll()})"
        return self._process

    def close(self) -> None:
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
