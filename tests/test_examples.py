"""The examples run as written (their docstrings' commands), against a real server where
they need one."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, server_process


def run_example(path: str, **environ: str) -> str:
    run = subprocess.run([sys.executable, str(ROOT / path)], cwd=ROOT, capture_output=True, encoding="utf-8",
                         errors="replace", timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1", **environ})
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_the_in_process_example_runs() -> None:
    assert run_example("examples/in_process.py").startswith("(2, 128) tokens:")


def test_the_openai_example_runs_against_the_default_server(minilm_dir) -> None:
    with server_process("--model-id", str(minilm_dir)) as url:
        out = run_example("examples/openai_client.py", INFINITY_CLOUD_URL=url)
    assert out.startswith("3 vectors of 384 dims") and "similarity of text 0 to the others" in out
