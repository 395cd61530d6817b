"""Memory admission under the two reproductions of issue 50, against any build's server, on
127.0.0.1 only, each bounded in time:

- n1: `serve --memory-budget-mb 1400` (the default model, offline), then --requests concurrent
  `POST /tokenize`, each of --texts texts of --chars characters; then one-text
  `/v1/embeddings` and `/health` once a second for --after-s seconds. Reports each tokenize
  answer's status, seconds and size, the server's resident memory (idle, peak, at the end) and
  the statuses after.
- n2: a tiny CLIP (benchmarks/tiny_clip.py) under `--memory-budget-mb 1200`, one request of
  --urls image URLs of a ~19 MB PNG served from a local HTTP server (allow-listed with
  --media-allow-host 127.0.0.1); a 429 is retried after its Retry-After, at most --tries times.
  Reports each try's status, Retry-After and message, the bytes the picture server sent, and
  resident memory.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/memory_admission.py n1 --exe .venv/bin/infinity-cloud \\
        --out n1.json [--requests 2 --texts 80 --chars 200000]
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/memory_admission.py n2 --exe .venv/bin/infinity-cloud \\
        --out n2.json [--clip-dir /tmp/tiny-clip]

Run it once with another build's `infinity-cloud` as --exe (e.g. /work/main/.venv/bin/infinity-cloud)
to compare. The server's stdout/stderr go to OUT.log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil

HOST = "127.0.0.1"
MB = 2**20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


class Sampler:
    """The server's resident memory every 0.1 s, its peak since the last `reset`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, tree_rss(self.pid))

    def reset(self) -> None:
        self.peak = tree_rss(self.pid)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def server(exe: str, flags: list[str], log: Path, start_timeout_s: float = 300):
    port = free_port()
    command = [exe, "serve", "--host", HOST, "--port", str(port), *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        with httpx.Client(base_url=url, timeout=10) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited ({proc.returncode}); see {log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server was not healthy in {start_timeout_s:.0f} s; see {log}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/health").status_code == 200:
                        break
                time.sleep(0.2)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def texts(count: int, chars: int, seed: int = 5) -> list[str]:
    """Texts of words from the standard library's docstrings (no corpus needed)."""
    import collections
    import inspect

    words = " ".join(inspect.getdoc(m) or "" for m in (collections, inspect, json, random, threading)).split()
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts, length = [], 0
        while length < chars:
            word = rng.choice(words)
            parts.append(word)
            length += len(word) + 1
        out.append(" ".join(parts)[:chars])
    return out


def message_of(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    try:
        return response.json()["error"]["message"][:300]
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


def n1(args: argparse.Namespace) -> dict[str, Any]:
    body = {"inputs": texts(args.texts, args.chars)}
    flags = ["--memory-budget-mb", str(args.budget_mb)]
    with server(args.exe, flags, args.out.with_suffix(".log")) as (url, proc):
        sampler = Sampler(proc.pid)
        idle = tree_rss(proc.pid)
        sampler.reset()
        answers: list[dict[str, Any]] = [{} for _ in range(args.requests)]

        def tokenize(i: int) -> None:
            started = time.perf_counter()
            try:
                with httpx.Client(base_url=url, timeout=args.timeout_s) as client:
                    response = client.post("/tokenize", json=body)
                answers[i] = {"status": response.status_code,
                              "seconds": round(time.perf_counter() - started, 1),
                              "body_mb": round(len(response.content) / MB, 1),
                              "message": message_of(response)}
            except httpx.HTTPError as exc:
                answers[i] = {"status": None, "error": f"{type(exc).__name__}: {exc}"}

        threads = [threading.Thread(target=tokenize, args=(i,)) for i in range(args.requests)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak = sampler.peak
        after = []
        with httpx.Client(base_url=url, timeout=30) as client:
            for second in range(args.after_s):
                embed = client.post("/v1/embeddings", json={"input": ["one short text"]})
                health = client.get("/health")
                after.append({"s": second, "embeddings": embed.status_code, "health": health.status_code,
                              "retry_after": embed.headers.get("retry-after"),
                              "rss_mb": round(tree_rss(proc.pid) / MB), "message": message_of(embed)})
                time.sleep(1)
        sampler.stop()
        return {"scenario": "n1", "exe": args.exe, "budget_mb": args.budget_mb, "requests": args.requests,
                "texts": args.texts, "chars": args.chars, "rss_idle_mb": round(idle / MB),
                "rss_peak_mb": round(peak / MB), "rss_end_mb": round(tree_rss(proc.pid) / MB),
                "tokenize": answers, "after": after}


class _Pictures(BaseHTTPRequestHandler):
    png = b""
    sent = 0
    lock = threading.Lock()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.png)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the fetcher may hang up (a refusal mid-download)
            self.wfile.write(self.png)
            with self.lock:
                type(self).sent += len(self.png)

    def log_message(self, *args: object) -> None:
        pass


def noise_png(side: int) -> bytes:
    """A PNG of random RGB noise (it does not compress): side 2,500 is about 19 MB."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(3).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def n2(args: argparse.Namespace) -> dict[str, Any]:
    clip = args.clip_dir
    if not (clip / "config.json").exists():
        subprocess.run([sys.executable, str(Path(__file__).with_name("tiny_clip.py")), "--out", str(clip)],
                       check=True, stdout=subprocess.DEVNULL)
    _Pictures.png = noise_png(args.side)
    pictures = ThreadingHTTPServer((HOST, 0), _Pictures)
    threading.Thread(target=pictures.serve_forever, daemon=True).start()
    base = f"http://{HOST}:{pictures.server_address[1]}"
    urls = [f"{base}/picture-{i}.png" for i in range(args.urls)]
    flags = ["--model-id", str(clip), "--memory-budget-mb", str(args.budget_mb), "--media-allow-host", HOST]
    try:
        with server(args.exe, flags, args.out.with_suffix(".log")) as (url, proc):
            sampler = Sampler(proc.pid)
            idle = tree_rss(proc.pid)
            sampler.reset()
            tries = []
            with httpx.Client(base_url=url, timeout=args.timeout_s) as client:
                for _ in range(args.tries):
                    started, sent = time.perf_counter(), _Pictures.sent
                    response = client.post("/v1/embeddings", json={"input": urls, "modality": "image"})
                    retry = response.headers.get("retry-after")
                    tries.append({"status": response.status_code, "retry_after": retry,
                                  "seconds": round(time.perf_counter() - started, 2),
                                  "downloaded_mb": round((_Pictures.sent - sent) / MB),
                                  "rss_peak_mb": round(sampler.peak / MB), "message": message_of(response)})
                    if response.status_code != 429:
                        break
                    time.sleep(float(retry or 1))
            sampler.stop()
            return {"scenario": "n2", "exe": args.exe, "budget_mb": args.budget_mb, "urls": args.urls,
                    "png_mb": round(len(_Pictures.png) / MB, 1), "rss_idle_mb": round(idle / MB),
                    "rss_peak_mb": round(sampler.peak / MB), "rss_end_mb": round(tree_rss(proc.pid) / MB),
                    "downloaded_mb": round(_Pictures.sent / MB), "tries": tries}
    finally:
        pictures.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["n1", "n2"])
    parser.add_argument("--exe", required=True, help="the build's infinity-cloud")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-mb", type=int, help="default: 1400 (n1), 1200 (n2)")
    parser.add_argument("--timeout-s", type=float, default=300, help="a client's wait for one answer")
    parser.add_argument("--requests", type=int, default=2, help="n1: concurrent /tokenize requests")
    parser.add_argument("--texts", type=int, default=80, help="n1: texts per request")
    parser.add_argument("--chars", type=int, default=200_000, help="n1: characters per text")
    parser.add_argument("--after-s", type=int, default=30, help="n1: seconds of one-text probes after")
    parser.add_argument("--clip-dir", type=Path, default=Path("/tmp/memory-admission-clip"), help="n2")
    parser.add_argument("--urls", type=int, default=20, help="n2: image URLs in the request")
    parser.add_argument("--side", type=int, default=2500, help="n2: the noise PNG's side in pixels")
    parser.add_argument("--tries", type=int, default=5, help="n2: tries, a 429 retried after Retry-After")
    args = parser.parse_args()
    if args.budget_mb is None:
        args.budget_mb = 1400 if args.scenario == "n1" else 1200
    report = (n1 if args.scenario == "n1" else n2)(args)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
