"""A reduced precision is judged by what the task needs (`numerics.fidelity`): a reranker's
order of the check's pairs (one of them cut at the model's limit) and its worst score
difference, not an embedding cosine. Tiny BERT cross-encoders built here: one whose scores
are close together (bfloat16 and int8 rounding swap them), one whose order a cosine of 0.9998
hides a swap in, and one whose order bfloat16 keeps. This CPU may have no bfloat16 kernels,
so `dtype auto` is made to pick bfloat16 by the flag reader (`hardware.cpu_flags`); torch
runs bfloat16 on any CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import serve_in_process, spec_of

from infinity_cloud import ModelSpec
from infinity_cloud.backends import exports
from infinity_cloud.core import hardware
from infinity_cloud.numerics import fidelity

# name -> (seed offset, classifier weight scale, classifier bias), drawn as `build_cross_encoder`
RERANKERS = {
    # logits 4 +- 0.01: bfloat16 rounds them to steps of 0.03, int8 swaps some (a cosine says 0)
    "close": (0, 0.01, 4.0),
    # a spread of logits whose bfloat16 swaps one pair; its cosine, 0.99984, passed the old check
    "swapped": (0, 3.0, 0.0),
    # the same spread, drawn otherwise: bfloat16 keeps its order, within 0.1 of each logit
    "faithful": (3, 3.0, 0.0),
}


def build_scaled_cross_encoder(path: Path, seed: int, scale: float, bias: float) -> Path:
    """A tiny BertForSequenceClassification (one logit) with its classifier's weights scaled
    and its bias set, so its scores are as close together as the test needs."""
    import torch
    from model_factory import SEED, _seeded, _tiny_bert_config, build_wordpiece_tokenizer
    from transformers import AutoTokenizer, BertForSequenceClassification

    build_wordpiece_tokenizer(path)
    vocabulary = len(AutoTokenizer.from_pretrained(str(path)))
    config = _tiny_bert_config(vocabulary, num_labels=1, initializer_range=0.2)
    with _seeded(SEED + seed):
        model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight *= scale
        model.classifier.bias.fill_(bias)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("precision-rerankers")
    return {name: build_scaled_cross_encoder(root / name, *draw) for name, draw in RERANKERS.items()}


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The flag reader says AVX512-BF16, so `dtype auto` on torch picks bfloat16; the export
    cache (verdicts) is this test's own."""
    real = hardware.cpu_flags
    monkeypatch.setattr(hardware, "cpu_flags", lambda: real() | {"avx512_bf16"})
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path / "cache"))


async def served(path: Path, **spec: object) -> dict[str, object]:
    """The model's /models entry, after a rerank through the app is answered."""
    model = ModelSpec(model_id=str(path), served_model_name="rr", **spec)
    async with serve_in_process(spec_of(model)) as client:
        response = await client.post("/rerank", json={"model": "rr", "query": "capital of France?",
                                                      "documents": ["Paris", "Berlin", "a cat"]})
        assert response.status_code == 200, response.text
        (entry,) = (await client.get("/models")).json()["data"]
    return entry


def verdict(cache: Path, kind: str) -> dict[str, object]:
    (folder,) = [p for p in cache.glob(f"{kind}-*") if p.is_dir() and ".building-" not in p.name]
    return exports.export_metadata(folder)


@pytest.mark.parametrize("name", ["close", "swapped"])
async def test_auto_serves_float32_where_bfloat16_changes_a_rerankers_order(
    rerankers: dict[str, Path], bf16_cpu: None, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    with caplog.at_level("WARNING", logger="infinity_cloud"):
        entry = await served(rerankers[name], backend="torch", dtype="auto")
    measured = verdict(tmp_path / "cache", "fidelity")
    assert measured["order_changes"] >= 1, measured
    assert (entry["dtype"], entry["backend"]) == ("float32", "torch")
    assert "bfloat16 disagrees with float32" in entry["precision_note"], entry
    assert "changes the order" in entry["precision_note"], entry
    (line,) = [r.getMessage() for r in caplog.records if "serving float32 instead" in r.getMessage()]
    assert "changes the order of the scores" in line and "\n" not in line
    if name == "swapped":  # what a cosine made of it: it would have kept bfloat16
        assert measured["agreement"] >= fidelity.MIN_AGREEMENT["bfloat16"], measured
        assert measured["worst_score_difference"] <= fidelity.MAX_SCORE_DIFFERENCE["bfloat16"], measured


async def test_auto_keeps_bfloat16_where_the_order_and_scores_hold(
    rerankers: dict[str, Path], bf16_cpu: None, tmp_path: Path
) -> None:
    entry = await served(rerankers["faithful"], backend="torch", dtype="auto")
    measured = verdict(tmp_path / "cache", "fidelity")
    assert measured["order_changes"] == 0
    assert measured["worst_score_difference"] <= fidelity.MAX_SCORE_DIFFERENCE["bfloat16"]
    assert (entry["dtype"], entry["precision_note"]) == ("bfloat16", None), entry


async def test_fastest_leaves_out_an_int8_that_changes_the_order(
    rerankers: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dtype fastest` on ONNX Runtime measures float32 and int8; int8 swaps the close
    reranker's scores, so it is left out however fast it is, and /models says so."""
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path / "cache"))
    entry = await served(rerankers["close"], backend="onnx", dtype="fastest")
    measured = verdict(tmp_path / "cache", "dtype-choice")["measured"]
    assert measured["int8"]["order_changes"] >= 1, measured
    assert entry["dtype"] == "float32"
    assert "int8 left out: disagrees with float32" in entry["precision_note"], entry


async def test_a_rerankers_check_includes_a_pair_cut_at_its_limit(build_model: Callable[..., Path]) -> None:
    """The pairs a reranker's precision is checked on include one past the model's limit,
    cut to it, as a caller's long document is."""
    from infinity_cloud.core.capability import Capability
    from infinity_cloud.tasks.registry import task_for
    from infinity_cloud.text.tokenization import TextTokenizer

    tokenizer = TextTokenizer.load(build_model("bert_reranker"), max_length=512)
    pairs = task_for(Capability.RERANK).fidelity_probes(tokenizer)
    assert len(pairs) == len(fidelity.PROBES)  # the query, then one pair per other probe and the long one
    assert max(len(p) for p in pairs) == 512  # the fixed probes are shorter
    embedded = task_for(Capability.EMBED).fidelity_probes(tokenizer)
    assert len(embedded) == len(fidelity.PROBES)  # an embedder's probes are as they were
