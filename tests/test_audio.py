"""Audio embedding (CLAP): both towers against transformers' ClapModel with its own feature
extractor on the same folder, through every backend; WAV, FLAC and OGG at other rates and
channel counts; bad audio as a 400 naming the input."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import cosines, serve_in_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.engine.asks import EmbedAsk

TEXTS = ["a dog barking", "rain on a tin roof", "music"]


@pytest.fixture(scope="session")
def clap(build_model: Callable[..., Path]) -> Path:
    return build_model("clap")


def clip(seconds: float, rate: int, seed: int, channels: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * (300 + 200 * seed) * t) + 0.05 * rng.standard_normal(len(t))
    return np.stack([tone * (c + 1) / channels for c in range(channels)], axis=-1) if channels > 1 else tone


def encoded(wave: np.ndarray, rate: int, fmt: str) -> bytes:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, wave.astype(np.float32), rate, format=fmt)
    return buffer.getvalue()


# A second at the model's rate, three at 16 kHz in FLAC, two stereo ones at 44.1 kHz in OGG.
CLIPS = [(clip(1, 48_000, 0), 48_000, "WAV"), (clip(3, 16_000, 1), 16_000, "FLAC"),
         (clip(2, 44_100, 2, channels=2), 44_100, "OGG")]


def data_uri(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def reference(path: Path, texts: list[str], clips: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """transformers: soundfile decodes, channels averaged, soxr resamples to 48 kHz (what its
    own audio loader does), ClapFeatureExtractor, ClapModel (normalised embeddings)."""
    import soundfile
    import soxr
    import torch
    from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel

    model = ClapModel.from_pretrained(str(path)).eval()
    extractor = ClapFeatureExtractor.from_pretrained(str(path))
    waves = []
    for data in clips:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        waves.append(soxr.resample(samples.mean(axis=1), rate, 48_000, quality="HQ"))
    features = extractor(waves, sampling_rate=48_000, return_tensors="pt")
    tokens = AutoTokenizer.from_pretrained(str(path))(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        audio = model.get_audio_features(**features).pooler_output.numpy()
        text = model.get_text_features(**tokens).pooler_output.numpy()
    return text, audio


@pytest.mark.parametrize("backend", ["torch", "onnx", "openvino"])
async def test_both_towers_match_transformers(clap: Path, backend: str) -> None:
    clips = [encoded(*c) for c in CLIPS]
    want_text, want_audio = reference(clap, TEXTS, clips)
    async with Engine(ModelSpec(model_id=str(clap), backend=backend, dtype="float32")) as engine:
        text = await engine.embeddings(EmbedAsk(TEXTS))
        audio = await engine.embeddings(EmbedAsk([data_uri(c) for c in clips], modality="audio"))
        facts = engine.describe()[0]
    assert facts["modalities"] == ["text", "audio"] and facts["dimensions"] == 24
    assert cosines(text.embeddings, want_text).min() > 0.999
    assert cosines(audio.embeddings, want_audio).min() > 0.999
    assert (np.argmax(audio.embeddings @ want_audio.T, axis=1) == np.arange(len(clips))).all()


async def test_audio_over_http_and_bad_audio(clap: Path) -> None:
    clips = [encoded(*c) for c in CLIPS]
    _, want = reference(clap, ["-"], clips)
    spec = spec_of(ModelSpec(model_id=str(clap), served_model_name="clap"))
    async with serve_in_process(spec) as client:
        body = {"model": "clap", "input": [data_uri(c) for c in clips]}
        response = await client.post("/embeddings_audio", json=body)
        assert response.status_code == 200, response.text
        got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
        assert cosines(got, want).min() > 0.999
        blip = data_uri(encoded(clip(0.001, 48_000, 3), 48_000, "WAV"))
        cases = [
            ([data_uri(b"RIFF but not really a wave file")], "input 0", "not audio that can be decoded"),
            ([data_uri(clips[0]), data_uri(b"RIFF but not really a wave file")], "input 1", "it is text"),
            ([data_uri(clips[0]), blip], "input 1", "s long"),
        ]
        for inputs, where, what in cases:
            body = {"model": "clap", "input": inputs, "modality": "audio"}
            response = await client.post("/embeddings", json=body)
            assert response.status_code == 400, response.text
            assert where in response.text and what in response.text, response.text
            assert "BytesIO" not in response.text, response.text  # the decoder's name for its file
        fine = {"model": "clap", "input": [data_uri(clips[0])], "modality": "audio"}
        assert (await client.post("/embeddings", json=fine)).status_code == 200
        image = await client.post("/embeddings", json={**fine, "modality": "image"})
        assert image.status_code == 400 and "reads text and audio" in image.text, image.text


def test_long_audio_is_cut_to_the_window_deterministically(clap: Path) -> None:
    """Past the model's 10 s window, transformers crops at random; we take the first 10 s."""
    from infinity_cloud.families import read_model_info
    from infinity_cloud.media.audio import AudioEncoder

    preprocessor = AudioEncoder(read_model_info(clap).own_facts.audio_processor)  # as CLAP has it
    long = clip(12, 48_000, 4)
    first = preprocessor.prepare(encoded(long, 48_000, "WAV"), 0).array
    again = preprocessor.prepare(encoded(long, 48_000, "WAV"), 0).array
    window = preprocessor.prepare(encoded(long[: 10 * 48_000], 48_000, "WAV"), 0).array
    assert np.array_equal(first, again) and np.array_equal(first, window)


async def test_infinity_client_embeds_audio(clap: Path) -> None:
    """infinity_client's own audio call (its /embeddings_audio route), unchanged."""
    import httpx
    from infinity_client import Client
    from infinity_client.api.default import embeddings_audio
    from infinity_client.models import OpenAIEmbeddingInputAudio

    clips = [encoded(*c) for c in CLIPS[:2]]
    _, want = reference(clap, ["-"], clips)
    async with serve_in_process(spec_of(ModelSpec(model_id=str(clap), served_model_name="clap"))) as client:
        infinity = Client(base_url="http://testserver")
        infinity.set_async_httpx_client(httpx.AsyncClient(transport=client._transport, base_url="http://testserver"))
        result = await embeddings_audio.asyncio(
            client=infinity, body=OpenAIEmbeddingInputAudio(input_=[data_uri(c) for c in clips], model="clap")
        )
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert cosines(got, want).min() > 0.999
