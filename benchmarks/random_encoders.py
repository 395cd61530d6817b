"""Encoders with real models' shapes and RANDOM weights, built at bench time with no hub.

    python benchmarks/random_encoders.py --out DIR --tokenizer .gpu/model [--tiny] [--only NAME ...]

Writes one sentence-transformers folder per model under DIR (DIR/bert-base, DIR/xlmr-large):
config.json and model.safetensors from transformers' own `save_pretrained` (a fixed seed, float32
weights, `torch_dtype`/`dtype` float32 in config.json), the tokenizer files copied from
--tokenizer (a BERT WordPiece tokenizer: all-MiniLM-L6-v2's, the same uncased vocabulary as
bge-base-en-v1.5), and modules.json, sentence_bert_config.json (max_seq_length),
1_Pooling/config.json and 2_Normalize, so that our server (`infinity-cloud serve --model-id
DIR/NAME`), Infinity (`infinity_emb v2 --model-id DIR/NAME`) and sentence-transformers load it.

- bert-base: BertConfig with BAAI/bge-base-en-v1.5's shapes (12 layers, hidden 768, 12 heads,
  intermediate 3072, 512 positions, vocab 30522), mean pooling (bge-base itself pools by CLS:
  the two models here cover both pooling paths);
- xlmr-large: XLMRobertaConfig with BAAI/bge-m3's shapes (24 layers, hidden 1024, 16 heads,
  intermediate 4096, 8194 positions, vocab 250002), CLS pooling.

Both keep max_seq_length 512, so a 32 x 32 cell is passage-sized (bge-m3 itself accepts 8192).
Random weights measure speed, memory and precision agreement, not embedding quality; a random
encoder's embeddings of different texts are much alike, so gpu_check.py reports, beside the plain
cosine, one taken after the mean embedding is subtracted. --tiny builds 2-layer, 64-hidden
versions of the same two (same vocabularies and pooling) for a CPU test of the scripts.
Prints one JSON line per model: name, path, parameters, seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

SEED = 22
MAX_SEQ_LENGTH = 512
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")

# name -> (transformers config class, shapes, pooling, the real model whose shapes these are)
MODELS: dict[str, dict[str, Any]] = {
    "bert-base": {
        "config": "BertConfig", "model": "BertModel", "shapes_of": "BAAI/bge-base-en-v1.5", "pooling": "mean",
        "shapes": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                       intermediate_size=3072, max_position_embeddings=512, vocab_size=30522),
        "extra": {},
    },
    "xlmr-large": {
        "config": "XLMRobertaConfig", "model": "XLMRobertaModel", "shapes_of": "BAAI/bge-m3",
        "pooling": "cls",
        "shapes": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                       intermediate_size=4096, max_position_embeddings=8194, vocab_size=250002),
        # The tokenizer is BERT's (ids below 30522, so below this vocabulary): its [PAD] is id 0,
        # so pad_token_id is 0 here, not XLM-R's 1. RoBERTa-style models number positions from
        # pad_token_id + 1 and give the padding id's embedding row zeros, so both must agree.
        # [CLS] 101 / [SEP] 102 stand for XLM-R's <s> 0 / </s> 2. One token type, as XLM-R has.
        "extra": dict(pad_token_id=0, bos_token_id=101, eos_token_id=102, type_vocab_size=1,
                      layer_norm_eps=1e-5),
    },
}
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def copy_tokenizer(source: Path, dest: Path) -> None:
    """The WordPiece tokenizer's files; tokenizer.json without the fixed padding and 128-token
    truncation that all-MiniLM-L6-v2's file was saved with (each loader sets its own)."""
    missing = [name for name in ("tokenizer.json", *TOKENIZER_FILES) if not (source / name).is_file()]
    if missing:
        raise SystemExit(f"error: {source} lacks tokenizer files {missing}")
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, dest / name)
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    tokenizer["truncation"] = None
    tokenizer["padding"] = None
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config["model_max_length"] = MAX_SEQ_LENGTH
    write_json(dest / "tokenizer_config.json", config)


def build(name: str, out: Path, tokenizer: Path, tiny: bool = False, seed: int = SEED) -> dict[str, Any]:
    import sentence_transformers
    import torch
    import transformers

    spec = MODELS[name]
    started = time.perf_counter()
    dest = out / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shapes = {**spec["shapes"], **(TINY if tiny else {})}
    config = getattr(transformers, spec["config"])(**shapes, **spec["extra"])
    torch.manual_seed(seed)
    model = getattr(transformers, spec["model"])(config).eval()
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(dest, max_shard_size="20GB")  # one model.safetensors
    del model
    # float32 said outright: a loader told dtype "auto" computes in what config.json says.
    saved = json.loads((dest / "config.json").read_text())
    saved.update(torch_dtype="float32", dtype="float32")
    write_json(dest / "config.json", saved)
    copy_tokenizer(tokenizer, dest)
    hidden = shapes["hidden_size"]
    write_json(dest / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    write_json(dest / "sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
    write_json(dest / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": spec["pooling"] == "cls",
        "pooling_mode_mean_tokens": spec["pooling"] == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    })
    (dest / "2_Normalize").mkdir(exist_ok=True)
    write_json(dest / "config_sentence_transformers.json", {
        "__version__": {"sentence_transformers": sentence_transformers.__version__,
                        "transformers": transformers.__version__, "pytorch": torch.__version__},
        "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine",
    })
    (dest / "README.md").write_text(
        f"Random weights (seed {seed}) with {spec['shapes_of']}'s shapes"
        f"{' (tiny: ' + json.dumps(TINY) + ')' if tiny else ''}, {spec['pooling']} pooling, "
        f"max_seq_length {MAX_SEQ_LENGTH}; built by benchmarks/random_encoders.py. Not a trained model.\n"
    )
    return {
        "name": name, "path": str(dest), "shapes_of": spec["shapes_of"], "tiny": tiny,
        "pooling": spec["pooling"], "parameters": params, "max_seq_length": MAX_SEQ_LENGTH,
        **shapes, "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write DIR/NAME into")
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="folder with a BERT tokenizer (tokenizer.json, vocab.txt, ...)")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64: for a CPU test")
    parser.add_argument("--only", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    for name in args.only:
        print(json.dumps(build(name, args.out, args.tokenizer, args.tiny, args.seed)), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
