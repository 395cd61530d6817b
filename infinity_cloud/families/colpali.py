"""ColPali (PaliGemma): a page is its image tokens, then "<bos>Describe the image.\n"; a query
"<bos>Question: ...", padded with ten <pad> ("query augmentation"), which count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infinity_cloud.core.family import Example, ModelInfo
from infinity_cloud.families.base import IMAGE_INPUTS, TEXT_INPUTS, graphs_of
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.page_reader import PageFacts, PageReader, token_vectors

if TYPE_CHECKING:
    from infinity_cloud.numerics.inputs import InputEncoder
    from infinity_cloud.text.tokenization import TextTokenizer


def _page_example(info: ModelInfo, names: tuple[str, ...]) -> Example:
    """A page: its image tokens, then the prompt's text."""
    import torch

    vlm, facts = info.raw.get("vlm_config") or {}, info.facts(PageFacts)
    side = facts.image_size or 448
    tokens = (side // (facts.patch_size or 14)) ** 2
    ids = torch.tensor([[int(vlm.get("image_token_index", 0))] * tokens + [2, 5, 6, 7]] * 2)
    axes = {name: {0: "batch", 1: "sequence"} for name in names[:3]} | {"pixel_values": {0: "batch"}}
    return (ids, torch.ones_like(ids), torch.zeros_like(ids), torch.rand(2, 3, side, side)), axes


# Token types (all zero) make PaliGemma attend both ways over the real tokens; without them a
# padded batch is read causally.
_GRAPHS = graphs_of(
    token_vectors("colpali_text", TEXT_INPUTS),
    token_vectors("colpali_image", TEXT_INPUTS + IMAGE_INPUTS, example=_page_example),
)


class ColPali(PageReader):
    name = "colpali"
    graphs = _GRAPHS

    def read(self, folder: ModelFolder) -> ModelInfo:
        vision = (folder.config.get("vlm_config") or {}).get("vision_config") or {}
        processor = folder.processor_config
        bos, pad = folder.token("bos_token", "<bos>"), folder.token("pad_token", "<pad>")
        image_size, patch_size = int(vision.get("image_size") or 448), int(vision.get("patch_size") or 14)
        image_tokens = int(folder.preprocessor().get("image_seq_length") or (image_size // patch_size) ** 2)
        query_prefix = processor.get("query_prefix", "Question: ")
        visual_prefix = processor.get("visual_prompt_prefix", "Describe the image.")
        templates = {
            "query": f"{bos}{query_prefix}{{}}{pad * 10}\n",
            "image": "<image>" * image_tokens + f"{bos}{visual_prefix}\n",
        }
        facts = PageFacts(templates, folder.preprocessor(), image_size, patch_size)
        return self.page_info(folder, facts, pad_token=pad)

    def page_encoder(self, facts: PageFacts, tokenizer: TextTokenizer) -> InputEncoder:
        from infinity_cloud.media.images import ImageEncoder

        # Each page is read behind the same prompt: its ids are tokenised once, here.
        prompt = tokenizer.encode([facts.templates["image"]], truncate=False, special_tokens=False)[0].ids
        side, patch = facts.image_size or 224, facts.patch_size or 32
        return ImageEncoder(facts.image_processor, side, patch, False, prompt)
