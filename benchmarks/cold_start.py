"""Cold start of the local server: process start to the first answered POST /embeddings.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/cold_start.py [--runs 6] [-- <serve flags>]

Each run starts `infinity-cloud serve` (the script next to this Python) as a fresh process,
polls POST /embeddings every 10 ms until it answers 200, and stops it. The model's exports
are built by a first, untimed run, so the timed runs measure a start with a cached export,
as every start after the first is. Prints each run, the median, and the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import roofline

SERVE = Path(sys.executable).with_name("infinity-cloud")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def first_answer(flags: list[str], timeout_s: float = 300.0) -> float:
    """Seconds from Popen to the first 200 from POST /embeddings."""
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen(
        [str(SERVE), "serve", "--port", str(port), *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(timeout=5) as client:
            while time.perf_counter() - started < timeout_s:
                if server.poll() is not None:
                    raise RuntimeError(f"the server exited with {server.returncode}")
                try:
                    response = client.post(f"http://127.0.0.1:{port}/embeddings", json={"input": ["hello"]})
                    if response.status_code == 200:
                        return time.perf_counter() - started
                except httpx.TransportError:
                    pass
                time.sleep(0.01)
        raise TimeoutError(f"no answer within {timeout_s} s")
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("flags", nargs="*", help="flags for `infinity-cloud serve` (after --)")
    args = parser.parse_args()
    first_answer(args.flags)  # builds and caches the exports; not timed
    runs = [first_answer(args.flags) for _ in range(args.runs)]
    print(json.dumps({
        **roofline.cpu_summary(),
        "serve_flags": args.flags,
        "runs_s": [round(r, 3) for r in runs],
        "median_s": round(statistics.median(runs), 3),
    }))


if __name__ == "__main__":
    main()
