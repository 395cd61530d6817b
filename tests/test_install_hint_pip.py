"""The install hint a message prints is a command pip runs as written (tests/unit/test_install_hint.py
checks what it names; this runs it, as a dry run: seconds, so not in the unit loop)."""

from __future__ import annotations

import shlex
import subprocess
import sys

from infinity_cloud.core.install_hint import install_command


def test_the_hint_for_this_clone_is_a_command_pip_runs() -> None:
    command = install_command("vision")
    assert command.startswith("pip install "), command
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", *shlex.split(command.removeprefix("pip install "))],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
