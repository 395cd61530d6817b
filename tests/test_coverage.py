"""The coverage table (docs/models.md, "Architectures served") as tests: each row is one
parametrised case here, a tiny model of that architecture built at test time (hidden 32, 2
layers), served through the app by the default backend (`auto`) with the default precision,
and compared with sentence-transformers in float32. The table's every row must name a case
that exists here, and every case must have its row.

Each model is built once for the module and served on torch (no export to wait for: the
exports are tests/test_backends.py's); the precision is the default (`auto`).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cosines, serve_in_process, spec_of

from infinity_cloud import ModelSpec

DOCS = Path(__file__).resolve().parent.parent / "docs" / "models.md"
TEXTS = ["hello world", "What is the capital of France?", "a cat sat on the mat " * 40, "x"]
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "x", "a cat sat on the mat " * 40, "Berlin is in Germany"]

# case id -> (transformers config class, model class, config options, tokenizer, pooling or
# None for a sequence-classification reranker). Tokenizers: "wordpiece" (model_factory's
# BERT one), "decoder" (byte-level BPE that ends each text with EOS, for last-token pooling).
ENCODER = {"num_attention_heads": 2, "intermediate_size": 64}
DECODER = {"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
           "tie_word_embeddings": False}
# A reranker's logits drawn wide enough to differ between documents (as `build_cross_encoder`)
RERANKER = {"num_labels": 1, "initializer_range": 0.2}
CASES: dict[str, tuple[str, str, dict[str, Any], str, str | None]] = {
    "bert": ("BertConfig", "BertModel", ENCODER, "wordpiece", "mean"),
    "mpnet": ("MPNetConfig", "MPNetModel", ENCODER, "wordpiece", "mean"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", {**ENCODER, "pad_token_id": 0}, "wordpiece",
                    "cls"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", {"n_heads": 2, "hidden_dim": 64, "dim": 32,
                                                           "n_layers": 2}, "wordpiece", "mean"),
    "electra": ("ElectraConfig", "ElectraModel", {**ENCODER, "embedding_size": 32}, "wordpiece", "mean"),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model", ENCODER, "wordpiece", "mean"),
    "modernbert": ("ModernBertConfig", "ModernBertModel", {**ENCODER, "global_attn_every_n_layers": 2,
                                                           "local_attention": 16}, "wordpiece", "mean"),
    "qwen3": ("Qwen3Config", "Qwen3Model", {**DECODER, "head_dim": 16}, "decoder", "lasttoken"),
    "mistral": ("MistralConfig", "MistralModel", DECODER, "decoder", "lasttoken"),
    "bert-reranker": ("BertConfig", "BertForSequenceClassification", ENCODER, "wordpiece", None),
    "xlm-roberta-reranker": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification",
                             {**ENCODER, "pad_token_id": 0}, "wordpiece", None),
    "modernbert-reranker": ("ModernBertConfig", "ModernBertForSequenceClassification",
                            {**ENCODER, "global_attn_every_n_layers": 2, "local_attention": 16}, "wordpiece",
                            None),
    "qwen3-reranker": ("Qwen3Config", "Qwen3ForSequenceClassification", {**DECODER, "head_dim": 16},
                       "decoder", None),
}


def _tokenizer(kind: str, folder: Path) -> dict[str, int]:
    """Save the tokenizer into `folder`; the ids a config needs."""
    import model_factory
    from transformers import AutoTokenizer

    if kind == "wordpiece":
        model_factory.build_wordpiece_tokenizer(folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        return {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    eos, pad = "<|endoftext|>", "<|pad|>"
    backend = model_factory._train_byte_level_bpe([eos, pad], vocab_size=400)
    eos_id, pad_id = backend.token_to_id(eos), backend.token_to_id(pad)
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {eos}:0", pair=f"$A:0 {eos}:0 $B:1 {eos}:1", special_tokens=[(eos, eos_id)])
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos, pad_token=pad,
                            model_max_length=model_factory.MAX_LENGTH).save_pretrained(str(folder))
    return {"vocab_size": backend.get_vocab_size(), "pad_token_id": pad_id, "eos_token_id": eos_id,
            "bos_token_id": eos_id}


def build_case(path: Path, case: str) -> Path:
    """The tiny model of `case`: a sentence-transformers folder (embedders) or a
    sequence-classification folder with one logit (rerankers)."""
    import model_factory
    import transformers

    config_class, model_class, options, tokenizer, pooling = CASES[case]
    with tempfile.TemporaryDirectory(prefix=f"tiny-{case}-") as tmp:
        folder = Path(tmp) if pooling else path
        folder.mkdir(parents=True, exist_ok=True)
        ids = _tokenizer(tokenizer, folder)
        sizes = {"hidden_size": model_factory.HIDDEN, "num_hidden_layers": 2,
                 "max_position_embeddings": model_factory.MAX_LENGTH + 2}
        config = getattr(transformers, config_class)(**{**sizes, **ids, **options},
                                                     **({} if pooling else RERANKER))
        with model_factory._seeded():
            model = getattr(transformers, model_class)(config)
        model.save_pretrained(str(folder))
        if pooling:
            return model_factory._save_sentence_transformer(folder, path, pooling, normalize=True)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("coverage")
    return {case: build_case(root / case, case) for case in CASES}


def reference(path: Path, case: str) -> np.ndarray:
    """sentence-transformers' own float32 answer."""
    if CASES[case][4]:
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(path), device="cpu").encode(TEXTS, convert_to_numpy=True)
    import torch
    from sentence_transformers import CrossEncoder

    encoder = CrossEncoder(str(path), device="cpu", max_length=128)
    return encoder.predict([(QUERY, d) for d in DOCUMENTS], activation_fn=torch.nn.Identity())


@pytest.mark.parametrize("case", list(CASES))
async def test_architecture_is_served_as_sentence_transformers_computes_it(
    models: dict[str, Path], case: str
) -> None:
    want = reference(models[case], case)
    # torch: no export to wait for (the exports' own tests are tests/test_backends.py's)
    async with serve_in_process(spec_of(ModelSpec(model_id=str(models[case]), served_model_name=case,
                                                  backend="torch"))) as client:
        (entry,) = (await client.get("/models")).json()["data"]
        await check_answers(client, entry, case, want)


async def check_answers(client: Any, entry: dict[str, Any], case: str, want: np.ndarray) -> None:
    if CASES[case][4]:
        response = await client.post("/embeddings", json={"model": case, "input": TEXTS})
        assert response.status_code == 200, response.text
        got = np.array([row["embedding"] for row in response.json()["data"]])
        assert cosines(got, want).min() >= (0.99999 if entry["dtype"] == "float32" else 0.999), entry
    else:
        response = await client.post("/rerank", json={"model": case, "query": QUERY, "documents": DOCUMENTS,
                                                      "raw_scores": True})
        assert response.status_code == 200, response.text
        got = np.zeros(len(DOCUMENTS))
        for row in response.json()["results"]:
            got[row["index"]] = row["relevance_score"]
        assert np.abs(got - want).max() <= (1e-4 if entry["dtype"] == "float32" else 0.1), (got, want, entry)
        assert list(np.argsort(-got)) == list(np.argsort(-want))


def table_rows() -> list[list[str]]:
    """The rows of docs/models.md's table of architectures served (cells, stripped)."""
    text = DOCS.read_text().split("## Architectures served", 1)[1].split("\n## ", 1)[0]
    table = text.split("### Known not to be served", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("|") and not re.match(r"\|\s*-", line) and "Architecture" not in line]


def test_every_row_of_the_coverage_table_names_a_test_that_exists() -> None:
    rows = table_rows()
    named = {re.search(r"\[([\w.-]+)\]", row[-1]).group(1) for row in rows if "test_coverage" in row[-1]}
    assert named == set(CASES), (named ^ set(CASES))
    for row in rows:
        assert re.search(r"tests/[\w/]+\.py::\w+", row[-1]), row  # the others name their own test
