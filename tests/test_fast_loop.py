"""`tests/unit` is the fast loop: it runs on its own, needs no model, and imports neither
torch nor a backend runtime nor a cloud SDK (what makes the full suite take minutes)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

HEAVY = ("torch", "transformers", "sentence_transformers", "onnxruntime", "openvino", "ctranslate2",
         "modal", "boto3")


def test_the_unit_tests_run_alone_without_torch() -> None:
    script = (
        "import sys, pytest\n"
        # in this process (-n 0), whose imports are what is checked
        "code = pytest.main(['-q', '-p', 'no:cacheprovider', '-n', '0', 'tests/unit'])\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "sys.exit(code or (3 if heavy else 0))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "HEAVY []" in done.stdout and " passed" in done.stdout, done.stdout[-3000:]
