"""Images to a vision tower's `pixel_values`, as the model's own image processor makes them
(`preprocessor_config.json`: resize, centre crop, rescale, normalise), with Pillow and numpy
only, so an ONNX or OpenVINO server needs neither torch nor transformers for images. A model
that reads an image behind a prompt (ColPali) gets the prompt's token ids with each batch.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError, ModelLoadError
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.media import MediaEncoder
from infinity_cloud.media.decoding_errors import decoder_reason, undecodable
from infinity_cloud.numerics.inputs import ModelInputs

# Below this a picture holds too little to embed (an icon, a tracking pixel): refused, not
# silently upscaled.
MIN_SIDE = 8
# What Pillow decodes, as a refusal names it.
IMAGE_FORMATS = "PNG, JPEG, WebP, GIF, BMP and TIFF"
# The default pixel cap (--media-max-pixels): 4096 x 4096, above a 12-megapixel photo
# (4032 x 3024) and an A4 page scanned at 300 dpi (2480 x 3508, 8.7 MP), while the models
# read at most about 1 MP (CLIP/SigLIP 224-448 px a side, ColPali 448, Qwen2-VL pages 1 MP
# by default). What decoding one takes is counted (`decoding_bytes`) before it is decoded.
MAX_PIXELS: int = LimitsSpec.model_fields["media_max_pixels"].default
# JPEGs above this are decoded at a reduced scale (`decode`): below it, pixels stay exactly
# what transformers decodes.
DRAFT_PIXELS = 4_000_000
_BAND_ROWS = 256
# What a decoder holds whatever the picture's size (tables, row buffers): a 2048 x 2048 JPEG
# drafted to 512 x 512 peaked at 3.3 MB, its pixels 0.8 MB.
_DECODER_BYTES = 2 * 2**20
# OpenAI CLIP's statistics (the processor default when the config names none).
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# PIL's resampling filters by transformers' `resample` integers (PIL's own numbering).
_BICUBIC = 3


@dataclass(frozen=True, slots=True)
class Pixels:
    """One preprocessed image; its length is what it costs a batch (the tower's tokens)."""

    array: np.ndarray  # (channels, height, width) float32
    tokens: int

    def __len__(self) -> int:
        return self.tokens


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ModelLoadError(
            f"serving an image model needs Pillow: {install_command('vision')}"
        ) from exc
    return Image


class ImageEncoder(MediaEncoder):
    """An image tower's input encoder; `class_token`: its tower reads one besides the patches
    (CLIP), which an image's cost counts; `prompt_ids`: the prompt it reads each image behind
    (ColPali's), whose tokens are then what an image costs."""

    kind = "image"

    def __init__(
        self, config: dict[str, Any], image_size: int, patch_size: int, class_token: bool,
        prompt_ids: list[int] | None = None,
    ) -> None:
        _pil()  # Pillow is there, or the model does not load
        self.size = config.get("size") or {"shortest_edge": image_size}
        if isinstance(self.size, int):  # old configs: one number, the shortest edge
            self.size = {"shortest_edge": self.size}
        self.do_resize = bool(config.get("do_resize", True))
        self.do_center_crop = bool(config.get("do_center_crop", "shortest_edge" in self.size))
        crop = config.get("crop_size") or {"height": image_size, "width": image_size}
        self.crop = (crop, crop) if isinstance(crop, int) else (int(crop["height"]), int(crop["width"]))
        self.resample = int(config.get("resample", _BICUBIC))
        self.rescale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else 1.0
        normalize = config.get("do_normalize", True)
        self.mean = np.array(config.get("image_mean", _CLIP_MEAN) if normalize else (0, 0, 0), np.float32)
        self.std = np.array(config.get("image_std", _CLIP_STD) if normalize else (1, 1, 1), np.float32)
        self.prompt_ids = prompt_ids
        # What an image costs a batch: its patches (and CLIP's class token), or its prompt's tokens.
        self.tokens = len(prompt_ids) if prompt_ids else (image_size // patch_size) ** 2 + class_token
        self.cost = self.tokens

    def open(self, data: bytes, index: int, limits: LimitsSpec) -> tuple[Any, int]:
        """One input's picture, its header read, and what decoding it takes at its peak."""
        image = open_image(data, index, limits.media_max_pixels)
        return image, decoding_bytes(image)

    def prepare(self, data: bytes | Any, index: int) -> Pixels:
        """Decode and preprocess one image (its bytes, or `open_image`'s picture); a bad one
        is a 400 naming input `index`."""
        image = open_image(data, index) if isinstance(data, bytes) else data
        needed = self._resized(image.width, image.height) if self.do_resize else None
        image = decode(image, index, needed)
        if self.do_resize:
            image = image.resize(self._resized(image.width, image.height), self.resample)
        array = np.asarray(image)  # (height, width, channels) bytes
        if self.do_center_crop:
            array = _center_crop(array, *self.crop)
        # Rescaled in float64, then normalised in float32: transformers' order, to the bit.
        array = (array.astype(np.float64) * self.rescale).astype(np.float32)
        array = (array - self.mean) / self.std
        return Pixels(np.ascontiguousarray(array.transpose(2, 0, 1), dtype=np.float32), self.tokens)

    def _resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after resizing, as transformers computes it."""
        if "shortest_edge" in self.size:
            edge = int(self.size["shortest_edge"])
            if width <= height:
                return edge, int(edge * height / width)
            return int(edge * width / height), edge
        return int(self.size["width"]), int(self.size["height"])

    def collate(self, items: Sequence[Pixels], rows: int | None = None) -> ModelInputs:
        inputs = ModelInputs.stack("pixel_values", [item.array for item in items], rows)
        if self.prompt_ids is None:
            return inputs
        ids = np.tile(np.array(self.prompt_ids, dtype=np.int64), (inputs.rows, 1))
        return ModelInputs({
            "input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids),
            **inputs.arrays,
        })

    def probes(self) -> list[Pixels]:
        return [self.prepare(data, index) for index, data in enumerate(probe_pictures())]


def open_image(data: bytes, index: int, max_pixels: int = MAX_PIXELS) -> Any:
    """One input's picture, its header read but not its pixels: its size is checked (at most
    `max_pixels`, at least `MIN_SIDE` a side) before any memory goes to decoding it; a bad one
    is a 400 naming input `index`."""
    Image = _pil()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise InvalidInputError(f"input {index} is too large an image to decode: {exc}",
                                param="input", index=index) from exc
    except (OSError, ValueError) as exc:
        raise undecodable(index, "an image", IMAGE_FORMATS, data, exc) from exc
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidInputError(
            f"input {index}: the image is {width}x{height} pixels, more than the {max_pixels:,} "
            "served (--media-max-pixels); send it scaled down: models read far fewer",
            param="input", index=index,
        )
    if min(width, height) < MIN_SIDE:
        raise InvalidInputError(
            f"input {index}: the image is {width}x{height} pixels; images need at least "
            f"{MIN_SIDE} pixels a side", param="input", index=index,
        )
    return image


def decoding_bytes(image: Any) -> int:
    """What decoding `image` (opened, not loaded) to RGB and resizing it takes at its peak,
    from its header: its pixels as decoded, the decoder's and the resize's working space, the
    decoder's own buffers where it keeps them (WebP: its canvas, copied), and RGBA plus RGB
    where it is converted. Bytes a pixel measured at 2048 and 4096 pixels a side (peak
    resident memory, tests/test_media_costs.py): RGB PNG or TIFF 4.2-4.9, RGBA PNG 9-10, grey
    or palette 10-14, WebP 16-18.4; counted here 5.5, 11.5, 14.5-15.5 and 18.5-24.5."""
    pixels = image.width * image.height
    if image.format == "JPEG" and pixels > DRAFT_PIXELS:
        # Drafted to at most half a side (a quarter of the pixels), and libjpeg's own buffers.
        return pixels * 3 // 4 + _DECODER_BYTES
    working = 2.5 if image.mode == "RGB" else 7.5 if image.mode == "RGBA" else 13.5
    per_pixel = len(image.getbands()) + working
    if image.format == "WEBP":  # libwebp's canvas, and the frame Pillow copies from it
        per_pixel += 13
    return int(pixels * per_pixel) + _DECODER_BYTES


def decode(data: bytes | Any, index: int, needed: tuple[int, int] | None = None) -> Any:
    """One input (its bytes, or `open_image`'s picture) as an RGB picture; a bad one is a 400
    naming input `index`. `needed`: the (width, height) the model resizes it to: a large JPEG
    is decoded at a reduced scale still at least twice that (its DCT scaling, `draft`)."""
    image = open_image(data, index) if isinstance(data, bytes) else data
    try:
        if needed is not None and image.format == "JPEG" and image.width * image.height > DRAFT_PIXELS:
            image.draft("RGB", (2 * needed[0], 2 * needed[1]))
        image.load()
    except (OSError, ValueError) as exc:  # a header that reads, its pixels that do not
        raise InvalidInputError(
            f"input {index} is a {image.format or 'picture'} image whose pixels cannot be decoded "
            f"(the file is cut short or corrupt): {decoder_reason(exc)}",
            param="input", index=index,
        ) from exc
    if image.mode == "RGB":
        return image
    return _onto_white(image.convert("RGBA") if image.mode != "RGBA" else image)


def _onto_white(rgba: Any) -> Any:
    """transformers' convert_to_rgb: transparency composited onto white, not dropped; done a
    band of rows at a time (the same pixels) so a large picture costs its RGBA and RGB copies,
    not four full ones."""
    Image = _pil()
    out = Image.new("RGB", rgba.size)
    white = Image.new("RGBA", (rgba.width, _BAND_ROWS), (255, 255, 255, 255))
    for top in range(0, rgba.height, _BAND_ROWS):
        box = (0, top, rgba.width, min(rgba.height, top + _BAND_ROWS))
        band = rgba.crop(box)
        if band.size != white.size:
            white = white.crop((0, 0, *band.size))
        out.paste(Image.alpha_composite(white, band).convert("RGB"), box[:2])
    return out


def probe_pictures() -> list[bytes]:
    """Fixed synthetic pictures (gradients, stripes, noise) as PNGs, for warm-up and precision
    checks."""
    Image = _pil()
    side = 64
    y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
    rng = np.random.default_rng(0)
    pictures = [
        np.stack([x, y, 1 - x], axis=-1),
        np.stack([np.sin(12 * x) * 0.5 + 0.5, y * y, np.cos(9 * y) * 0.5 + 0.5], axis=-1),
        rng.random((side, side, 3), dtype=np.float32),
        np.stack([(x > 0.5), (y > 0.5), (x + y > 1)], axis=-1).astype(np.float32),
    ]
    out = []
    for picture in pictures:
        buffer = io.BytesIO()
        Image.fromarray((picture * 255).astype(np.uint8)).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def _center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """The middle height x width, zero-padded where the image is smaller (transformers')."""
    h, w = array.shape[:2]
    if h < height or w < width:
        top_pad, left_pad = max(0, (height - h) // 2), max(0, (width - w) // 2)
        padded = np.zeros((max(h, height), max(w, width), array.shape[2]), dtype=array.dtype)
        padded[top_pad : top_pad + h, left_pad : left_pad + w] = array
        array, h, w = padded, padded.shape[0], padded.shape[1]
    top, left = (h - height) // 2, (w - width) // 2
    return array[top : top + height, left : left + width]
