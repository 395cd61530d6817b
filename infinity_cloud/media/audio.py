"""Audio to CLAP's `input_features`, as its feature extractor makes them
(`preprocessor_config.json`): decoded (soundfile: WAV, FLAC, OGG, MP3), mixed down to mono,
resampled to the model's rate (soxr, the resampler transformers and librosa use), repeated
to fill the model's window, and turned into a log-mel spectrogram with numpy only.

Deterministic where the reference is not: a clip longer than the window is cut to its first
`max_length_s` seconds (transformers' `rand_trunc` crops at random).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError, ModelLoadError
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.media import MediaEncoder
from infinity_cloud.media.decoding_errors import undecodable
from infinity_cloud.numerics.inputs import ModelInputs

# Shorter than this a clip holds nothing to hear.
MIN_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class Clip:
    """One input's bytes, and how many of its frames (at its own rate) the window needs
    (None: not read from its header yet)."""

    data: bytes
    frames: int | None




@dataclass(frozen=True, slots=True)
class Features:
    """One clip's log-mel spectrogram; its length is what it costs a batch (its frames)."""

    array: np.ndarray  # (1, frames, mel bins) float32

    def __len__(self) -> int:
        return int(self.array.shape[1])


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    return np.where(hz >= 1000, 15 + np.log(np.maximum(hz, 1e-300) / 1000) * 27 / np.log(6.4), 3 * hz / 200)


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= 15, 1000 * np.exp(np.log(6.4) / 27 * (mel - 15)), 200 * mel / 3)


def mel_filters(rate: int, n_fft: int, bins: int, low: float, high: float) -> np.ndarray:
    """(n_fft/2 + 1, bins) triangular filters on Slaney's scale, each of unit area (Slaney's
    normalisation): transformers' `mel_filter_bank(norm="slaney", mel_scale="slaney")`."""
    edges = _slaney_hz(np.linspace(_slaney_mel(low), _slaney_mel(high), bins + 2))
    frequencies = np.linspace(0, rate // 2, n_fft // 2 + 1)
    slopes = edges[None, :] - frequencies[:, None]
    widths = np.diff(edges)
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    return np.maximum(0, np.minimum(rising, falling)) * (2 / (edges[2:] - edges[:-2]))[None, :]


class AudioEncoder(MediaEncoder):
    """An audio tower's input encoder, from its feature extractor's settings (`config`)."""

    kind = "audio"

    def __init__(self, config: dict[str, Any]) -> None:
        try:
            import soundfile
            import soxr
        except ImportError as exc:
            raise ModelLoadError(
                f"serving an audio model needs soundfile and soxr ({exc.name} is missing): "
                f"{install_command('audio')}"
            ) from exc
        self._soundfile, self._soxr = soundfile, soxr
        truncation, padding = config.get("truncation", "rand_trunc"), config.get("padding", "repeatpad")
        if truncation != "rand_trunc" or padding not in ("repeatpad", "repeat", "pad"):
            raise ModelLoadError(
                f"audio truncation {truncation!r} with padding {padding!r} is not served (fused CLAP "
                "checkpoints crop at random); models with rand_trunc are"
            )
        self.padding = padding
        self.rate = int(config.get("sampling_rate", 48_000))
        self.samples = int(float(config.get("max_length_s", 10)) * self.rate)
        self.hop = int(config.get("hop_length", 480))
        self.n_fft = int(config.get("fft_window_size", 1024))
        bins = int(config.get("feature_size", 64))
        self.filters = mel_filters(
            self.rate, self.n_fft, bins, float(config.get("frequency_min", 0)),
            float(config.get("frequency_max", 14_000)),
        )
        self.window = np.hanning(self.n_fft + 1)[:-1]  # periodic Hann
        self.cost = self.samples // self.hop + 1  # frames: every clip fills the window

    def open(self, data: bytes, index: int, limits: LimitsSpec) -> tuple[Clip, int]:
        """One input's clip, its header read: what decoding it takes at its peak (only the
        window's length of it is decoded), before any of it is."""
        try:
            info = self._soundfile.info(io.BytesIO(data))
        except Exception as exc:  # libsndfile's errors: unknown format, corrupt stream
            raise undecodable(index, "audio", "WAV, FLAC, OGG and MP3", data, exc) from exc
        frames = min(info.frames, math.ceil(self.samples * info.samplerate / self.rate) + 1)
        # The samples read (float32, every channel), their mono mix and resampling in float32.
        return Clip(data, frames), frames * (info.channels + 2) * 4 + self.samples * 8

    def prepare(self, data: bytes | Clip, index: int) -> Features:
        """Decode and turn one clip into features; a bad one is a 400 naming input `index`."""
        clip = data if isinstance(data, Clip) else Clip(data, None)
        wave = self._decode(clip, index)
        return Features(self._log_mel(self._fill(wave))[None])

    def _decode(self, clip: Clip, index: int) -> np.ndarray:
        try:
            # Only the window is read: a long clip (an hour of FLAC silence is a few KB) would
            # otherwise decode to gigabytes, to be cut to the window's seconds.
            frames = -1 if clip.frames is None else clip.frames
            samples, rate = self._soundfile.read(
                io.BytesIO(clip.data), frames=frames, dtype="float32", always_2d=True
            )
        except Exception as exc:  # libsndfile's errors: unknown format, corrupt stream
            raise undecodable(index, "audio", "WAV, FLAC, OGG and MP3", clip.data, exc) from exc
        if len(samples) < MIN_SECONDS * rate:
            raise InvalidInputError(
                f"input {index}: the audio is {len(samples) / rate:.4f} s long; at least "
                f"{MIN_SECONDS} s is needed",
                param="input", index=index,
            )
        mono = samples.mean(axis=1)
        if rate != self.rate:
            mono = self._soxr.resample(mono, rate, self.rate, quality="HQ")
        return mono[: self.samples]

    def _fill(self, wave: np.ndarray) -> np.ndarray:
        """Short clips fill the window as the extractor's `padding` says: repeated, then zeros."""
        if len(wave) < self.samples and self.padding in ("repeatpad", "repeat"):
            repeats = self.samples // len(wave) + (self.padding == "repeat")
            wave = np.tile(wave, repeats)[: self.samples]
        return np.pad(wave, (0, self.samples - len(wave)))

    def _log_mel(self, wave: np.ndarray) -> np.ndarray:
        """Centred STFT (reflect padding), power spectrum, mel filters, decibels: (frames, bins)."""
        half = self.n_fft // 2
        padded = np.pad(wave.astype(np.float64), (half, half), mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, self.n_fft)[:: self.hop]
        # transformers keeps the spectrum in complex64 before squaring it: so do we, to the bit.
        spectrum = np.fft.rfft(frames * self.window, axis=-1).astype(np.complex64)
        power = np.abs(spectrum).astype(np.float64) ** 2
        return (10 * np.log10(np.maximum(power @ self.filters, 1e-10))).astype(np.float32)

    def collate(self, items: Sequence[Features], rows: int | None = None) -> ModelInputs:
        return ModelInputs.stack("input_features", [item.array for item in items], rows)

    def probes(self) -> list[Features]:
        """Fixed synthetic clips (a chord, a sweep, noise) for warm-up and precision checks."""
        import soundfile

        rng = np.random.default_rng(0)
        t = np.arange(int(0.5 * self.rate)) / self.rate
        clips = [
            0.3 * (np.sin(2 * np.pi * 440 * t) + np.sin(2 * np.pi * 660 * t)),
            0.5 * np.sin(2 * np.pi * (200 + 4000 * t) * t),
            0.2 * rng.standard_normal(len(t)),
        ]
        out = []
        for index, clip in enumerate(clips):
            buffer = io.BytesIO()
            soundfile.write(buffer, clip.astype(np.float32), self.rate, format="WAV")
            out.append(self.prepare(buffer.getvalue(), index))
        return out
