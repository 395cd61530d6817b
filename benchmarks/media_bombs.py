"""Decompression bombs against the image path: tiny files that decode to huge pictures, sent as
data URIs to `/embeddings` with `"modality": "image"`, and what they cost the server.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/media_bombs.py --out media_bombs.json \\
        [--clip FOLDER] [--side 8000] [--small-side 4096] [-- more serve flags]

One `infinity-cloud serve` process serves a tiny random-weight CLIP (--clip, else one built by
benchmarks/tiny_clip.py into a temporary folder), so text probes and images go to the same model.
Sections of the JSON printed (and written to --out):
- first_start (only when the folder has no exports yet): a start that builds them, stopped;
- idle: the (second) server's process-tree RSS after a warm-up (texts and one small image);
- single: one request per bomb, each with status, message (200 characters), seconds and the
  peak RSS above idle (sampled every 0.05 s): a flat-colour lossless WebP of --side x --side
  (~2 KB), a PNG of the same size, an RGBA lossless WebP and a JPEG of --small-side;
- bombs_x4_in_one: one request of --per-request (4) bombs (--bomb, default the big WebP);
  requests_x3_concurrent: --concurrent (3) such requests at once;
- probes: a one-text request every 0.1 s on the idle server, then while --concurrent bomb
  requests run: p50 / max ms of each and their ratio.
Server flags go after `--` (e.g. `-- --backend torch`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from overload import RssSampler, answer_summary
from tiny_clip import build_clip
from vs_infinity import Server, Side, free_port, servers_running, start_server, tree_rss_mb

MODEL = "clip"
SAMPLE_S = 0.05  # RSS sampling: a bomb's decode buffer can live well under a second
PROBE_EVERY_S = 0.1


@dataclass(frozen=True)
class Bomb:
    name: str
    mime: str
    data: bytes

    @property
    def uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"


def make_bombs(side: int, small_side: int) -> dict[str, Bomb]:
    """Flat colours: every format squeezes them to almost nothing, but a decoder still has to
    produce side x side x channels bytes."""
    from PIL import Image

    def encoded(image: Image.Image, fmt: str, **options: Any) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format=fmt, **options)
        return buffer.getvalue()

    big = Image.new("RGB", (side, side), (40, 120, 200))
    bombs = [
        Bomb(f"webp-{side}", "image/webp", encoded(big, "WEBP", lossless=True)),
        Bomb(f"png-{side}", "image/png", encoded(big, "PNG", optimize=True)),
    ]
    del big  # ~190 MB here in the client; not what is measured, but this machine is small
    # Half-transparent: the server composites alpha onto white, one more full-size copy.
    rgba = Image.new("RGBA", (small_side, small_side), (200, 30, 30, 128))
    bombs.append(Bomb(f"webp-rgba-{small_side}", "image/webp", encoded(rgba, "WEBP", lossless=True)))
    del rgba
    jpeg = Image.new("RGB", (small_side, small_side), (90, 160, 60))
    bombs.append(Bomb(f"jpeg-{small_side}", "image/jpeg", encoded(jpeg, "JPEG", quality=90)))
    return {bomb.name: bomb for bomb in bombs}


async def post_images(client: httpx.AsyncClient, uris: list[str]) -> httpx.Response | BaseException:
    try:
        return await client.post("/embeddings", json={"model": MODEL, "input": uris, "modality": "image"})
    except httpx.HTTPError as exc:  # a dropped connection is a result here, not a crash
        return exc


async def bomb_requests(
    url: str, pid: int, idle_mb: float, uris: list[str], at_once: int, timeout: float
) -> dict[str, Any]:
    """`at_once` requests of `uris`, sent together, with the server's RSS sampled meanwhile."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        with RssSampler(pid, SAMPLE_S) as rss:
            started = time.perf_counter()
            answers = await asyncio.gather(*(post_images(client, uris) for _ in range(at_once)))
            seconds = time.perf_counter() - started
    results = [answer_summary(answer) for answer in answers]
    peak = max(rss.samples)
    report: dict[str, Any] = {
        "requests": at_once, "images_per_request": len(uris),
        "request_bytes": sum(len(uri) for uri in uris) + 64,
        "seconds": round(seconds, 2), "rss_peak_mb": peak, "rss_peak_above_idle_mb": round(peak - idle_mb, 1),
        "rss_after_mb": tree_rss_mb(pid),
    }
    if at_once == 1:
        report.update(results[0])
    else:
        report["answers"] = results
    return report


def percentiles(latencies: list[float]) -> dict[str, Any]:
    if not latencies:
        return {"probes": 0}
    return {"probes": len(latencies), "p50_ms": round(1000 * statistics.median(latencies), 1),
            "max_ms": round(1000 * max(latencies), 1)}


async def probe_loop(client: httpx.AsyncClient, until: asyncio.Future[Any] | float) -> dict[str, Any]:
    """A one-text request every 0.1 s until `until` (a future, or a perf_counter time) is reached."""
    latencies: list[float] = []
    failures: dict[str, int] = {}

    def going() -> bool:
        return not until.done() if isinstance(until, asyncio.Future) else time.perf_counter() < until

    while going():
        started = time.perf_counter()
        try:
            response = await client.post("/embeddings", json={"model": MODEL, "input": ["a short probe"]})
            key = None if response.status_code == 200 else str(response.status_code)
        except httpx.HTTPError as exc:
            key = type(exc).__name__
        if key is None:
            latencies.append(time.perf_counter() - started)
        else:
            failures[key] = failures.get(key, 0) + 1
        await asyncio.sleep(PROBE_EVERY_S)
    return {**percentiles(latencies), **({"failures": failures} if failures else {})}


async def probes(url: str, uris: list[str], at_once: int, idle_s: float, timeout: float) -> dict[str, Any]:
    """Probe latency on the idle server, then while `at_once` bomb requests are served."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        await asyncio.sleep(2)  # let the previous section's work drain: this is the idle baseline
        idle = await probe_loop(client, time.perf_counter() + idle_s)
        bombs = asyncio.gather(*(post_images(client, uris) for _ in range(at_once)))
        loaded = await probe_loop(client, bombs)
        answers = await bombs
    ratio: dict[str, float] = {}
    if loaded.get("probes") and idle.get("probes"):
        ratio = {"p50_ratio": round(loaded["p50_ms"] / idle["p50_ms"], 1),
                 "max_ratio": round(loaded["max_ms"] / idle["max_ms"], 1)}
    return {"idle": idle, "under_bombs": loaded, **ratio,
            "bomb_statuses": [answer_summary(answer)["status"] for answer in answers]}


def warm_up(url: str) -> None:
    """Texts and one ordinary image, so lazy first-use costs are not counted as a bomb's."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (256, 256), (128, 128, 128)).save(buffer, format="PNG")
    small = Bomb("warm", "image/png", buffer.getvalue())
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(3):
            client.post("/embeddings", json={"model": MODEL, "input": ["warm up"] * 4}).raise_for_status()
            client.post("/embeddings", json={"model": MODEL, "input": [small.uri], "modality": "image"}
                        ).raise_for_status()


def new_server(model: Path, flags: list[str]) -> Server:
    port = free_port()
    side = Side("ours", "ours", tuple(flags))
    return Server(side, [*side.command(model, port, Path("-")), "--served-model-name", MODEL], port,
                  Path(f"/tmp/media-bombs-{port}.log"))


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--clip", type=Path, help="a CLIP folder (default: build a tiny one in a temp dir)")
    parser.add_argument("--side", type=int, default=8000, help="pixels a side of the big WebP and PNG")
    parser.add_argument("--small-side", type=int, default=4096,
                        help="pixels a side of the RGBA WebP and JPEG")
    parser.add_argument("--bomb", default="webp", choices=["webp", "png", "webp-rgba", "jpeg"],
                        help="the bomb repeated in the multi-image requests")
    parser.add_argument("--per-request", type=int, default=4)
    parser.add_argument("--concurrent", type=int, default=3)
    parser.add_argument("--idle-probe-s", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="client timeout per request, s")
    parser.add_argument("--out", type=Path)
    parser.add_argument("flags", nargs="*", help="after --: more `serve` flags")
    args = parser.parse_args()

    bombs = make_bombs(args.side, args.small_side)
    chosen = next(bomb for name, bomb in bombs.items() if name.rsplit("-", 1)[0] == args.bomb)
    report: dict[str, Any] = {
        "flags": args.flags,
        "bombs": {name: {"bytes": len(b.data), "data_uri_bytes": len(b.uri)} for name, b in bombs.items()},
    }
    scratch = None
    if args.clip is None:
        scratch = Path(tempfile.mkdtemp(prefix="media-bombs-clip-"))
        args.clip = scratch / "clip"
        report["clip"] = build_clip(args.clip)
    try:
        if not (args.clip / ".infinity-cloud").exists():
            # A first start exports the model (ONNX / OpenVINO) in-process, which leaves torch's
            # memory in the RSS; one start to build the exports, a fresh one to measure.
            primer = new_server(args.clip, args.flags)
            with servers_running([primer]):
                start_server(primer, MODEL, 600)
                report["first_start"] = {"first_answer_s": primer.first_answer_s,
                                         "rss_mb": primer.rss_after_load_mb}
        server = new_server(args.clip, args.flags)
        report["server_log"] = str(server.log_path)
        with servers_running([server]):
            start_server(server, MODEL, 600)
            assert server.proc is not None
            pid = server.proc.pid
            report["first_answer_s"] = server.first_answer_s
            warm_up(server.url)
            time.sleep(2)
            idle_mb = tree_rss_mb(pid)
            report["idle"] = {"rss_mb": idle_mb}
            report["single"] = {
                name: asyncio.run(bomb_requests(server.url, pid, idle_mb, [bomb.uri], 1, args.timeout))
                for name, bomb in bombs.items()
            }
            uris = [chosen.uri] * args.per_request
            report[f"bombs_x{args.per_request}_in_one"] = {"bomb": chosen.name, **asyncio.run(
                bomb_requests(server.url, pid, idle_mb, uris, 1, args.timeout))}
            report[f"requests_x{args.concurrent}_concurrent"] = {"bomb": chosen.name, **asyncio.run(
                bomb_requests(server.url, pid, idle_mb, uris, args.concurrent, args.timeout))}
            report["probes"] = {"bomb": chosen.name, "bomb_requests": args.concurrent, **asyncio.run(
                probes(server.url, uris, args.concurrent, args.idle_probe_s, args.timeout))}
            report["rss_end_mb"] = tree_rss_mb(pid)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
