"""ColQwen2 (Qwen2-VL): a page is a chat turn holding as many image tokens as its merged
patches (pages of any shape, each behind its own prompt); a query "Query: ...", padded with
ten pad tokens. Its graphs do not trace to ONNX (the vision tower's patch grid is data)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families.base import IMAGE_INPUTS, TEXT_INPUTS, graphs_of
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.page_reader import PageFacts, PageReader, token_vectors

if TYPE_CHECKING:
    from infinity_cloud.numerics.inputs import InputEncoder
    from infinity_cloud.text.tokenization import TextTokenizer

_GRAPHS = graphs_of(
    token_vectors("colqwen2_text", TEXT_INPUTS[:2], traceable=False),
    token_vectors("colqwen2_image", (*TEXT_INPUTS[:2], *IMAGE_INPUTS, "image_grid_thw"), traceable=False),
)


class ColQwen2(PageReader):
    name = "colqwen2"
    graphs = _GRAPHS

    def read(self, folder: ModelFolder) -> ModelInfo:
        processor = folder.processor_config
        pad = folder.token("pad_token", "<|endoftext|>")  # also the query augmentation token
        visual = processor.get("visual_prompt_prefix") or (
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image."
            "<|im_end|><|endoftext|>"
        )
        query = f"{processor.get('query_prefix') or 'Query: '}{{}}{pad * 10}\n"
        templates = {"query": query, "image": visual}
        return self.page_info(folder, PageFacts(templates, folder.preprocessor()), pad_token=pad)

    def page_encoder(self, facts: PageFacts, tokenizer: TextTokenizer) -> InputEncoder:
        from infinity_cloud.media.pages import PageEncoder

        def tokenize(text: str) -> list[int]:
            return tokenizer.encode([text], truncate=False, special_tokens=False)[0].ids

        return PageEncoder(facts.image_processor, facts.templates["image"], tokenize, tokenizer.pad_id)
