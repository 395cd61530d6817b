"""Whether an OpenVINO compilation survives on this CPU, tried in a child process first.

OpenVINO's reduced-precision kernels can kill the process rather than raise: 2026.4.1 on an
AMX CPU (Xeon with avx512_fp16) died of SIGFPE compiling a Qwen2 graph in bf16 whenever a
stream had one thread, and f32 on the same graph was fine. A signal cannot be caught in the
server, so each reduced-precision configuration is compiled and run once in a child (about a
second), and the verdict is kept beside the compiled blobs, per CPU.

Run as a program, this module is the child: `python -m infinity_cloud.backends.openvino_probe
MODEL_XML CONFIG_JSON` compiles, runs every stream at once on small inputs, exits 0.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from infinity_cloud.core.hardware import cpu_flags, cpu_model

# A compilation of a large model (bge-m3 in bf16) takes a minute on 2 cores: well inside.
PROBE_SECONDS = 900


@functools.cache
def _cpu_key() -> str:
    """The CPU a verdict holds for: a blob folder copied to another machine is probed again."""
    seen = cpu_model() + " " + " ".join(sorted(cpu_flags()))
    return hashlib.blake2b(seen.encode(), digest_size=8).hexdigest()


def crash_of(model_xml: Path, config: dict[str, Any], verdicts: Path) -> str | None:
    """None where `config` compiles and runs `model_xml` in a child; else how the child died
    ("killed by SIGFPE"). Cached in `verdicts` (a folder per configuration) for this CPU."""
    verdict = verdicts / f"probe-{_cpu_key()}.json"
    if verdict.is_file():
        return json.loads(verdict.read_text(encoding="utf-8"))["crash"]
    command = child_command(model_xml, config)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return f"no answer in {PROBE_SECONDS} s"  # not kept: a busy machine may answer next time
    if done.returncode == 0:
        crash = None
    elif done.returncode < 0:
        crash = f"killed by {signal.Signals(-done.returncode).name}"
    else:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        crash = f"exit status {done.returncode}: {last}"
    verdicts.mkdir(parents=True, exist_ok=True)
    partial = verdict.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"crash": crash, "config": config}), encoding="utf-8")
    partial.replace(verdict)
    return crash


def child_command(model_xml: Path, config: dict[str, Any]) -> list[str]:
    """The child that tries `config`: this module run as a program."""
    return [sys.executable, "-m", __name__, str(model_xml), json.dumps(config)]


def _inputs(port: Any) -> Any:
    """Small inputs of the port's type: 2 rows, 8 positions where the shape is open; masks of
    ones, other integers (token and type ids) zeros, floats a fixed noise."""
    import numpy as np

    shape = [dim.get_length() if dim.is_static else (2 if axis == 0 else 8)
             for axis, dim in enumerate(port.get_partial_shape())]
    kind = port.get_element_type().to_dtype()
    if np.issubdtype(kind, np.integer):
        fill = 1 if "mask" in port.any_name else 0
        return np.full(shape, fill, dtype=kind)
    return np.random.default_rng(0).standard_normal(shape).astype(kind)


def _child(model_xml: str, config_json: str) -> int:
    import numpy as np
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(model_xml), "CPU", json.loads(config_json))
    streams = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
    requests = [compiled.create_infer_request() for _ in range(streams)]
    feed = {port.any_name: _inputs(port) for port in compiled.inputs}
    for request in requests:
        request.start_async(feed)
    for request in requests:
        request.wait()
        if not np.isfinite(request.get_output_tensor(0).data).all():
            print("outputs that are not finite", file=sys.stderr)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:3]))
