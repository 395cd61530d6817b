"""Media cost what they cost: an image's decoding is sized from its header before it is
decoded (a compression bomb is a 400 at once), that memory is counted by the budget, large
JPEGs decode at a reduced scale, long audio decodes only the model's window, and decoding
runs in its own pool, so text is not stuck behind it."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import serve_in_process, spec_of
from test_audio import clip as audio_clip
from test_audio import encoded
from test_images import data_uri, embed_images, reference, unit

from infinity_cloud.admission.memory import MemoryBudget
from infinity_cloud.core.config import LimitsSpec, ModelSpec
from infinity_cloud.core.errors import PayloadTooLargeError
from infinity_cloud.media.decoding import MediaDecoder


@pytest.fixture(scope="module")
def clip(build_model: Callable[..., Path]) -> Path:
    return build_model("clip")


def flat(side: int, fmt: str, mode: str = "RGB") -> bytes:
    """A flat picture: a few hundred bytes on the wire whatever its size (a bomb)."""
    from PIL import Image

    buffer = io.BytesIO()
    extra = {"lossless": True} if fmt == "WEBP" else {}
    colour = (10, 200, 30, 128)[: len(mode)] if mode not in ("L", "LA", "P") else (90, 128)[: len(mode)]
    Image.new(mode, (side, side), colour if len(colour) > 1 else colour[0]).save(buffer, format=fmt, **extra)
    return buffer.getvalue()


def photo(width: int, height: int) -> bytes:
    """A smooth picture with edges, as a camera JPEG (what draft decoding is for)."""
    from PIL import Image, ImageDraw

    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    pixels = np.stack([np.sin(6 * x) * 0.5 + 0.5, y, 1 - x * y], axis=-1) * 255
    image = Image.fromarray(pixels.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for i in range(12):
        left, top = i * width // 14, i * height // 16
        draw.ellipse([left, top, left + width // 5, top + height // 5], fill=(30 * i % 255, 90, 200 - 10 * i))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


async def test_a_decompression_bomb_is_a_400_before_it_is_decoded(clip: Path) -> None:
    """A 2 KB WebP of 8000 x 8000 (1.2 GB decoded, as it was) is refused from its header."""
    bomb = flat(8000, "WEBP")
    assert len(bomb) < 4096
    async with serve_in_process(spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"))) as client:
        for data, mime in ((bomb, "image/webp"), (flat(8000, "PNG"), "image/png")):
            response = await embed_images(client, [data_uri(data, mime)])
            assert response.status_code == 400, response.text
            message = response.json()["error"]["message"]
            assert "input 0" in message and "8000x8000" in message and "16,777,216" in message
            assert "--media-max-pixels" in message
        fine = await embed_images(client, [data_uri(flat(64, "PNG"))])
        assert fine.status_code == 200, fine.text


# Peak resident memory of a block, in a fresh process: Linux's high-water mark, reset to the
# memory resident now first (/proc/self/clear_refs), so what was freed before cannot hide it.
PEAK = """
def resident(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))
def reset_peak():
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return resident("VmRSS:")
"""

MEASURE = PEAK + """
import io, json, sys
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.media.images import ImageEncoder
data = open(sys.argv[1], "rb").read()
preprocessor = ImageEncoder({}, 224, 32, True)
preprocessor.prepare(preprocessor.open(open(sys.argv[2], "rb").read(), 0, LimitsSpec())[0], 0)  # warm
before = reset_peak()
image, counted = preprocessor.open(data, 0, LimitsSpec())
preprocessor.prepare(image, 0)
print(json.dumps({"counted": counted, "peak": resident("VmHWM:") - before}))
"""


@pytest.mark.parametrize(("fmt", "mode"), [
    ("WEBP", "RGBA"), ("WEBP", "RGB"), ("PNG", "RGBA"), ("PNG", "RGB"), ("PNG", "P"), ("PNG", "L"),
    ("PNG", "LA"),
    ("JPEG", "RGB"), ("TIFF", "RGB"),
])
def test_what_decoding_is_counted_covers_what_it_takes(fmt: str, mode: str, tmp_path: Path) -> None:
    """The memory counted before decoding is at least the decoding's real peak (a fresh
    process's peak resident memory, above what it held before)."""
    path, warm = tmp_path / f"cap.{fmt.lower()}", tmp_path / "warm.png"
    path.write_bytes(flat(2048, fmt, mode))  # the bytes a pixel are the cap's; a quarter of the time
    warm.write_bytes(flat(64, "PNG"))
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(warm)], capture_output=True,
                          text=True, encoding="utf-8", timeout=120, check=True)
    measured = json.loads(done.stdout)
    if fmt != "JPEG":  # it was measured (a large JPEG decodes at a reduced scale: less)
        assert measured["peak"] > 2048 * 2048, measured
    assert measured["counted"] >= measured["peak"], measured
    assert measured["counted"] < 32 * 2048 * 2048, measured  # and not absurdly more


def image_encoder(path: Path) -> Any:
    """The encoder the model's family gives its image tower, as a server loads it."""
    from infinity_cloud.families import read_model_info
    from infinity_cloud.text.tokenization import TextTokenizer

    info = read_model_info(path)
    tokenizer = TextTokenizer.load(path, info.max_length, info.vocab_size, info.pad_token)
    return info.family.encoders(info, tokenizer)["image"]


async def test_decoding_is_held_from_the_memory_budget(clip: Path) -> None:
    """An image whose decoding is more than the budget has is a 413 that says how much,
    before it is decoded; one that fits decodes."""
    preprocessor = image_encoder(clip)
    idle = 0  # this budget counts only what is held: the test process's own memory is not the point
    budget = MemoryBudget(200 * 2**20, resident=lambda: idle)
    decoder = MediaDecoder(LimitsSpec(), budget, workers=1)
    try:
        with pytest.raises(PayloadTooLargeError, match=r"would take about \d+ MB"):
            await decoder.prepare_all(preprocessor, [flat(4096, "WEBP", "RGBA")], deadline_s=None)
        assert budget.held_bytes == 0
        (pixels,) = await decoder.prepare_all(preprocessor, [flat(2048, "PNG", "RGBA")], deadline_s=None)
        assert pixels.array.shape == (3, 32, 32) and budget.held_bytes == 0
    finally:
        decoder.close()


async def test_a_large_jpeg_decodes_reduced_and_embeds_as_in_full(clip: Path) -> None:
    """A 12 MP JPEG is decoded at a quarter of its sides (DCT scaling), a fraction of the
    memory; its embedding agrees with transformers' from the full-size decode."""
    from infinity_cloud.media.images import decoding_bytes, open_image

    big = photo(4032, 3024)
    image = open_image(big, 0)
    assert decoding_bytes(image) < 4032 * 3024  # less than one byte a pixel of the full size
    preprocessor = image_encoder(clip)
    assert preprocessor.prepare(big, 0).array.shape[1:] == (32, 32)
    async with serve_in_process(spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"))) as client:
        response = await embed_images(client, [data_uri(big, "image/jpeg")])
        assert response.status_code == 200, response.text
        ours = unit(np.array([response.json()["data"][0]["embedding"]]))
    _, theirs = reference(clip, [], [big])
    assert float(ours[0] @ theirs[0]) > 0.999


def test_long_audio_decodes_only_the_window(build_model: Callable[..., Path]) -> None:
    """An hour of FLAC silence is a few KB: only the model's window of it is decoded, and
    what is counted is the window's, not the hour's."""
    from infinity_cloud.families import read_model_info
    from infinity_cloud.media.audio import AudioEncoder

    preprocessor = AudioEncoder(read_model_info(build_model("clap")).own_facts.audio_processor)
    hour = encoded(np.zeros(3600 * 48_000, dtype=np.float32), 48_000, "FLAC")
    assert len(hour) < 2**20
    opened, counted = preprocessor.open(hour, 0, LimitsSpec())
    assert counted < 50 * 2**20  # the window's 10 s at 48 kHz, not 3600 s
    features = preprocessor.prepare(opened, 0).array
    window = preprocessor.prepare(encoded(np.zeros(10 * 48_000, dtype=np.float32), 48_000, "FLAC"), 0).array
    assert np.array_equal(features, window)
    tone = audio_clip(12, 48_000, 4)
    cut = preprocessor.prepare(preprocessor.open(encoded(tone, 48_000, "WAV"), 0, LimitsSpec())[0], 0).array
    assert np.array_equal(cut, preprocessor.prepare(encoded(tone[: 10 * 48_000], 48_000, "WAV"), 0).array)


async def test_text_is_not_stuck_behind_decoding(clip: Path) -> None:
    """Two requests of large PNGs decoding (their pool is their own) do not hold up a text
    request on the same server: it is answered while they still decode."""
    spec = spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"))
    heavy = [data_uri(flat(4096, "PNG", "RGBA"))] * 3
    async with serve_in_process(spec) as client:
        images = [asyncio.ensure_future(embed_images(client, heavy)) for _ in range(2)]
        await asyncio.sleep(0.3)  # both are decoding by now
        text = await client.post("/embeddings", json={"model": "clip", "input": ["a photo of a cat"]})
        assert text.status_code == 200, text.text
        assert not any(task.done() for task in images), "an image request finished first: nothing was shown"
        for answer in await asyncio.gather(*images):
            assert answer.status_code == 200, answer.text


async def test_decoding_time_is_judged_like_the_models_queue(clip: Path) -> None:
    """Media whose decoding alone would pass the platform's limit on one request are a 413
    before any decoding; alone past the deadline (which bounds waiting), they are decoded;
    behind other requests' decoding past it, a 429 with Retry-After; nothing stays held after."""
    from infinity_cloud.core.errors import QueueFullError
    preprocessor = image_encoder(clip)
    budget = MemoryBudget(None)
    decoder = MediaDecoder(LimitsSpec(), budget, workers=1)
    large = flat(4096, "PNG", "RGBA")
    try:
        seconds = decoder.estimated_s(preprocessor.open(large, 0, LimitsSpec())[1])
        with pytest.raises(PayloadTooLargeError, match=r"decoding these media would take about .* limit"):
            await decoder.prepare_all(preprocessor, [large], deadline_s=None, request_limit_s=seconds / 2)
        assert len(await decoder.prepare_all(preprocessor, [large], deadline_s=seconds / 2)) == 1
        busy = asyncio.ensure_future(decoder.prepare_all(preprocessor, [large] * 3, deadline_s=None))
        await asyncio.sleep(0.2)  # its three are counted as queued
        with pytest.raises(QueueFullError, match="decoding other requests' media") as refused:
            await decoder.prepare_all(preprocessor, [large], deadline_s=seconds / 2)
        assert refused.value.retry_after_s >= 1
        assert len(await busy) == 3 and decoder._queued_bytes == 0 and budget.held_bytes == 0
    finally:
        decoder.close()


MEASURE_REQUEST = PEAK + """
import asyncio, json, sys
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.media.decoding import MediaDecoder
from infinity_cloud.media.images import ImageEncoder
from infinity_cloud.admission.memory import MemoryBudget
data, count = open(sys.argv[1], "rb").read(), int(sys.argv[2])
preprocessor = ImageEncoder({}, 224, 32, True)
decoder = MediaDecoder(LimitsSpec(), MemoryBudget(None), workers=1)
before = reset_peak()
asyncio.run(decoder.prepare_all(preprocessor, [data] * count, deadline_s=None))
print(json.dumps(resident("VmHWM:") - before))
"""


def test_a_requests_images_decode_one_at_a_time(tmp_path: Path) -> None:
    """Four images at the cap in one request peak at about what one does: each one's pixels
    are freed before the next is decoded (the peak resident memory of a fresh process)."""
    path = tmp_path / "cap.webp"
    path.write_bytes(flat(4096, "WEBP", "RGBA"))
    peaks = []
    for count in (1, 4):
        done = subprocess.run([sys.executable, "-c", MEASURE_REQUEST, str(path), str(count)], check=True,
                              capture_output=True, text=True, encoding="utf-8", timeout=120)
        peaks.append(json.loads(done.stdout))
    assert peaks[0] > 4096 * 4096 * 4 and peaks[1] < 1.3 * peaks[0], peaks
