"""A tiny CLIP with RANDOM weights, built at bench time with no hub: for benchmarks that need an
image model (benchmarks/media_bombs.py) and care about the server's media path, not the model.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/tiny_clip.py --out /tmp/tiny-clip [--image-size 224]

Writes a transformers folder (`CLIPModel.save_pretrained`: config.json, model.safetensors), a
byte-level BPE tokenizer trained here on the standard library's docstrings (tokenizer.json,
tokenizer_config.json) and preprocessor_config.json from transformers' PIL CLIP image processor
(resize the shortest edge to --image-size, centre crop): `infinity-cloud serve --model-id OUT`
serves it for text and images. Two layers, width 32, patch size image_size / 7 (49 patches),
so the forward pass is cheap and the numbers measure decoding and resizing. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

SEED = 7
WIDTH = 32
MAX_TOKENS = 77  # CLIP's text context


def _tokenizer() -> Any:
    """Byte-level BPE with CLIP's start/end tokens around every text (the end token pools)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from infinity_cloud.tasks.quantization import calibration_texts

    start, end = "<|startoftext|>", "<|endoftext|>"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    # Every byte in the alphabet, so no text ever needs an unknown token.
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=[start, end],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(calibration_texts(512), trainer=trainer)
    start_id, end_id = bpe.token_to_id(start), bpe.token_to_id(end)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{start}:0 $A:0 {end}:0", special_tokens=[(start, start_id), (end, end_id)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=start, eos_token=end, pad_token=end,
                                   unk_token=end, model_max_length=MAX_TOKENS)


def build_clip(out: Path, image_size: int = 224) -> dict[str, Any]:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    started = time.perf_counter()
    tokenizer = _tokenizer()
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    tower = {"hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "num_hidden_layers": 2,
             "num_attention_heads": 2}
    config = CLIPConfig(
        text_config={**tower, "vocab_size": len(tokenizer), "max_position_embeddings": MAX_TOKENS, **ids},
        vision_config={**tower, "image_size": image_size, "patch_size": image_size // 7},
        projection_dim=WIDTH,
    )
    # The PIL flavour: the server reads preprocessor_config.json, and no torchvision is needed.
    processor = CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                      crop_size={"height": image_size, "width": image_size})
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):  # a fixed model without touching the caller's RNG
        torch.manual_seed(SEED)
        model = CLIPModel(config).eval()
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    parameters = sum(p.numel() for p in model.parameters())
    return {"path": str(out), "image_size": image_size, "parameters": parameters,
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    print(json.dumps(build_clip(args.out, args.image_size)))


if __name__ == "__main__":
    main()
