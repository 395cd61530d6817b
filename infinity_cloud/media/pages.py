"""Page images for ColQwen2 (a Qwen2-VL reader): each image resized to a multiple of its patch
grid within a pixel budget (keeping its aspect), cut into patches, and read behind a prompt
holding one image token per merged patch, so pages of different shapes cost what they hold.
As transformers' Qwen2-VL image processor and ColQwen2Processor make them, with Pillow and
numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError
from infinity_cloud.media import MediaEncoder
from infinity_cloud.media.images import decode, decoding_bytes, open_image, probe_pictures
from infinity_cloud.numerics.inputs import ModelInputs

IMAGE_TOKEN = "<|image_pad|>"


@dataclass(frozen=True, slots=True)
class Page:
    """One page: its prompt's token ids, its patches (patches, channels x frames x patch²) and
    its grid (frames, rows, columns). Its length (batch cost) is its prompt's."""

    ids: list[int]
    patches: np.ndarray
    grid: tuple[int, int, int]

    def __len__(self) -> int:
        return len(self.ids)


def fitted_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, scaled into [min_pixels, max_pixels]
    keeping the aspect ratio (Qwen2-VL's `smart_resize`)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an aspect ratio of {max(height, width) / min(height, width):.0f} is beyond 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


class PageEncoder(MediaEncoder):
    """A page tower's input encoder, from its image processor's settings (`config`) and the
    prompt each page is read behind (`prompt`, its image token repeated per merged patch)."""

    kind = "page"

    def __init__(
        self, config: dict[str, Any], prompt: str, tokenize: Callable[[str], list[int]], pad_id: int
    ) -> None:
        size = config.get("size") or {}
        self.patch = int(config.get("patch_size", 14))
        self.merge = int(config.get("merge_size", 2))
        self.frames = int(config.get("temporal_patch_size", 2))
        self.min_pixels = int(config.get("min_pixels") or size.get("shortest_edge", 56 * 56))
        self.max_pixels = int(config.get("max_pixels") or size.get("longest_edge", 28 * 28 * 1280))
        self.resample = int(config.get("resample", 3))
        self.rescale = float(config.get("rescale_factor", 1 / 255))
        self.mean = np.array(config["image_mean"], np.float32)
        self.std = np.array(config["image_std"], np.float32)
        self.prompt = prompt
        self._tokenize, self.pad_id = tokenize, pad_id
        # A page at the pixel budget: one token per merged patch, and the prompt's few.
        self.cost = self.max_pixels // (self.patch * self.merge) ** 2 + 32

    def open(self, data: bytes, index: int, limits: LimitsSpec) -> tuple[Any, int]:
        """One input's page, its header read, and what decoding it takes at its peak."""
        image = open_image(data, index, limits.media_max_pixels)
        return image, decoding_bytes(image)

    def prepare(self, data: bytes | Any, index: int) -> Page:
        """One page (its bytes, or `open_image`'s picture) as patches behind its prompt."""
        image = open_image(data, index) if isinstance(data, bytes) else data
        try:
            height, width = fitted_size(
                image.height, image.width, self.patch * self.merge, self.min_pixels, self.max_pixels
            )
        except ValueError as exc:
            raise InvalidInputError(f"input {index}: {exc}", param="input", index=index) from exc
        image = decode(image, index, (width, height)).resize((width, height), self.resample)
        array = (np.asarray(image).astype(np.float64) * self.rescale).astype(np.float32)
        array = ((array - self.mean) / self.std).transpose(2, 0, 1)  # channels, height, width
        rows, columns, p, m = height // self.patch, width // self.patch, self.patch, self.merge
        # Patches in merge-block order, each repeated over the model's frames (a still image).
        blocks = array.reshape(3, rows // m, m, p, columns // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        blocks = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], self.frames, p, p))
        patches = np.ascontiguousarray(blocks.reshape(rows * columns, 3 * self.frames * p * p))
        text = self.prompt.replace(IMAGE_TOKEN, IMAGE_TOKEN * (rows * columns // m**2))
        return Page(self._tokenize(text), patches, (1, rows, columns))

    def collate(self, items: Sequence[Page], rows: int | None = None) -> ModelInputs:
        """Prompts padded on the right, patches zero-padded to the most any page has."""
        pages = [*items, *[items[0]] * (max(rows or 0, len(items)) - len(items))]
        longest, most = max(len(p) for p in pages), max(len(p.patches) for p in pages)
        ids = np.full((len(pages), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        patches = np.zeros((len(pages), most, pages[0].patches.shape[1]), dtype=np.float32)
        for row, page in enumerate(pages):
            ids[row, : len(page)], mask[row, : len(page)] = page.ids, 1
            patches[row, : len(page.patches)] = page.patches
        grids = np.array([page.grid for page in pages], dtype=np.int64)
        arrays = {"input_ids": ids, "attention_mask": mask, "pixel_values": patches, "image_grid_thw": grids}
        return ModelInputs(arrays)

    def probes(self) -> list[Page]:
        return [self.prepare(data, index) for index, data in enumerate(probe_pictures())]
