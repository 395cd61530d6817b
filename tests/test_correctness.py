"""The engine in-process against the reference libraries on the same folder, in float32:
sentence-transformers for embeddings and reranking, a transformers pipeline for
classification. Also token-id input, length limits, Matryoshka dimensions and ordering."""

from __future__ import annotations

import asyncio
import functools
import re
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cosines
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    pipeline,
)

from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import InputTooLongError, InvalidInputError
from infinity_cloud.engine import Engine
from infinity_cloud.engine.asks import ClassifyAsk, EmbedAsk, RerankAsk

COSINE = 0.9999
RTOL = 1e-4
SCORE_ATOL = 1e-4

# ~500 words: past every model's limit (128 tokens for the tiny ones, 256 for MiniLM)
LONG_TEXT = " ".join(["the quick brown fox jumps over the lazy dog while people read a story"] * 40)

TEXTS = [
    "hello world",
    "What is the capital of France?",
    "Paris is the capital of France.",
    "x",
    "   padded   with   spaces   ",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 2024 3.14159",
    "Punctuation!? (brackets) [square] {curly} <angle> -- em—dash; semi: colon...",
    "UPPER CASE and MiXeD cAsE",
    "Café naïve résumé coöperate façade",
    "日本語のテキストも埋め込めます。",
    "Ελληνικά κείμενα και русский текст",
    "emoji 🙂🚀🔥 and symbols ∑∫√∞ ≠ ≤",
    "tabs\tand\nnew\nlines",
    "a word repeated " * 20,
    LONG_TEXT,
    "Embedding models turn sentences into vectors; rerankers score query-document pairs.",
    "[CLS] literal special tokens [SEP] in text",
    "http://example.com/path?query=1&other=two#frag",
    "The cat sat on the mat. The dog sat on the log.",
    "the",
    " ",
]

# Tiny sentence-transformers folders: name -> (builder, options). Each is compared to
# SentenceTransformer loaded from the very same folder. "-wide" ones are re-drawn by `widen`.
EMBEDDERS: dict[str, tuple[str, dict[str, Any]]] = {
    "mean-normalized": ("bert_embedder", {}),
    "mean-raw": ("bert_embedder", {"normalize": False}),
    "cls": ("bert_embedder", {"pooling": "cls", "normalize": False}),
    "cls-wide": ("bert_embedder", {"pooling": "cls", "normalize": False}),
    "max": ("bert_embedder", {"pooling": "max", "normalize": False}),
    "mean_sqrt_len": ("bert_embedder", {"pooling": "mean_sqrt_len_tokens", "normalize": False}),
    "dense-tanh": ("bert_embedder", {"pooling": "cls", "normalize": False, "dense_out": 16}),
    "dense-tanh-wide": ("bert_embedder", {"pooling": "cls", "normalize": False, "dense_out": 16}),
    "dense-identity": ("bert_embedder", {"normalize": False, "dense_out": 16, "dense_activation": None}),
    "dense-tanh-normalized": ("bert_embedder", {"pooling": "max", "dense_out": 16}),
    "decoder-lasttoken": ("decoder_embedder", {}),
    "roberta": ("roberta_embedder", {}),
}
NORMALIZED = {"mean-normalized", "dense-tanh-normalized", "decoder-lasttoken", "roberta"}


# -- engines and references, loaded once per module ------------------------------------


@pytest.fixture(scope="module")
async def engine_for() -> AsyncIterator[Callable[..., Any]]:
    """engine_for(path, **spec): one started Engine per (folder, spec), stopped at the end."""
    engines: dict[tuple[str, tuple[tuple[str, Any], ...]], Engine] = {}
    async with AsyncExitStack() as stack:

        async def get(path: Path, **spec: Any) -> Engine:
            key = (str(path), tuple(sorted(spec.items())))
            if key not in engines:
                model = ModelSpec(model_id=str(path), device="cpu", dtype="float32", **spec)
                engines[key] = await stack.enter_async_context(Engine(model))
            return engines[key]

        yield get


@functools.cache
def sentence_transformer(path: Path) -> SentenceTransformer:
    return SentenceTransformer(str(path), device="cpu")


@functools.cache
def cross_encoder(path: Path) -> CrossEncoder:
    return CrossEncoder(str(path), device="cpu")


@functools.cache
def tokenizer(path: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def widen(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """A copy of a built folder with its transformer weights re-drawn at initializer_range
    0.2 instead of 0.02. The tiny models' CLS states and logits barely depend on the input
    (cosines between different texts up to 0.999999, scores within 1e-4 of each other), so a
    comparison at the tolerances here could pass with the wrong text's output; with these
    weights it cannot."""
    root = tmp_path_factory.mktemp("wide")

    @functools.cache
    def make(path: Path) -> Path:
        wide = root / path.name
        shutil.copytree(path, wide)
        config = AutoConfig.from_pretrained(str(path))
        config.initializer_range = 0.2
        scoring = config.architectures[0].endswith("ForSequenceClassification")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(7)
            model = (AutoModelForSequenceClassification if scoring else AutoModel).from_config(config)
        model.save_pretrained(str(wide))  # replaces config.json and the weights, keeps the rest
        return wide

    return make


@pytest.fixture(scope="module")
def embedder(build_model: Callable[..., Path], widen: Callable[[Path], Path]) -> Callable[[str], Path]:
    def get(name: str) -> Path:
        path = build_model(EMBEDDERS[name][0], **EMBEDDERS[name][1])
        return widen(path) if name.endswith("-wide") else path

    return get


def reference_embeddings(path: Path, texts: list[str]) -> np.ndarray:
    return sentence_transformer(path).encode(texts, batch_size=8, convert_to_numpy=True)


def assert_embeddings_match(ours: np.ndarray, ref: np.ndarray, normalized: bool) -> None:
    assert ours.dtype == np.float32
    assert ours.shape == ref.shape
    cos = cosines(ours, ref)
    assert cos.min() >= COSINE, f"cosine per text: {np.round(cos, 6)}"
    norms = np.linalg.norm(ours, axis=1)
    if normalized:
        np.testing.assert_allclose(norms, 1.0, rtol=RTOL)
    else:
        np.testing.assert_allclose(norms, np.linalg.norm(ref, axis=1), rtol=RTOL)
    # Element-wise: relative, with an absolute floor at 1e-4 of each vector's size so that
    # components near zero are judged on the vector's scale, not their own.
    scale = np.linalg.norm(ref, axis=1, keepdims=True)
    np.testing.assert_array_less(np.abs(ours - ref), RTOL * np.abs(ref) + RTOL * scale)
    # Each row is nearest its own reference row: no row got another input's vector.
    distances = np.linalg.norm(ours[:, None, :] - ref[None, :, :], axis=-1)
    np.testing.assert_array_equal(distances.argmin(axis=1), np.arange(len(ref)))


def token_count(path: Path, texts: list[str], max_length: int | None = None) -> list[int]:
    """Tokens per text as the reference tokenizer makes them (special tokens included)."""
    tok = tokenizer(path)
    kwargs = {"truncation": True, "max_length": max_length} if max_length else {}
    return [len(ids) for ids in tok(texts, **kwargs)["input_ids"]]


# -- the real all-MiniLM-L6-v2 -----------------------------------------------------------


@pytest.mark.slow
async def test_minilm_matches_sentence_transformers(engine_for, minilm_dir: Path) -> None:
    engine = await engine_for(minilm_dir)
    result = await engine.embeddings(EmbedAsk(TEXTS))
    ref = reference_embeddings(minilm_dir, TEXTS)
    assert result.embeddings.shape == (len(TEXTS), 384)
    assert_embeddings_match(result.embeddings, ref, normalized=True)

    st = sentence_transformer(minilm_dir)
    assert st.max_seq_length == 256
    assert token_count(minilm_dir, [LONG_TEXT])[0] > 256  # the long text really is truncated
    features = st.preprocess(TEXTS)
    assert result.prompt_tokens == int(features["attention_mask"].sum())
    assert result.prompt_tokens == sum(token_count(minilm_dir, TEXTS, max_length=256))


# -- tiny embedders: every pooling, Dense heads, normalisation on and off ----------------


@pytest.mark.parametrize("name", sorted(EMBEDDERS))
async def test_tiny_embedder_matches_sentence_transformers(engine_for, embedder, name: str) -> None:
    path = embedder(name)
    engine = await engine_for(path)
    result = await engine.embeddings(EmbedAsk(TEXTS))
    ref = reference_embeddings(path, TEXTS)
    assert_embeddings_match(result.embeddings, ref, normalized=name in NORMALIZED)
    assert (np.linalg.norm(ref, axis=1).round(4) == 1.0).all() == (name in NORMALIZED)
    limit = sentence_transformer(path).max_seq_length
    assert limit == 128
    assert result.prompt_tokens == sum(token_count(path, TEXTS, max_length=limit))


@pytest.mark.parametrize("name", ["mean-normalized", "cls-wide", "roberta", "decoder-lasttoken"])
async def test_the_torch_backend_itself_matches_sentence_transformers(engine_for, embedder, name: str):
    """torch is the reference the other backends are checked against, and `auto` picks
    OpenVINO on CPU: so it is checked on its own here (texts of many lengths in one batch,
    so a broken mask shows)."""
    path = embedder(name)
    engine = await engine_for(path, backend="torch")
    assert engine.describe()[0]["backend"] == "torch"
    result = await engine.embeddings(EmbedAsk(TEXTS))
    reference = reference_embeddings(path, TEXTS)
    assert_embeddings_match(result.embeddings, reference, normalized=name in NORMALIZED)


async def test_roberta_long_inputs(engine_for, embedder) -> None:
    """RoBERTa offsets positions by the padding id: inputs right at the 128 limit must work."""
    path = embedder("roberta")
    texts = [LONG_TEXT, "short", "another beginning entirely: " + LONG_TEXT, LONG_TEXT[:150]]
    lengths = token_count(path, texts)
    assert lengths[0] > 128 and lengths[2] > 128 and lengths[1] < lengths[3] < 128
    result = await (await engine_for(path)).embeddings(EmbedAsk(texts))
    assert_embeddings_match(result.embeddings, reference_embeddings(path, texts), normalized=True)
    assert result.prompt_tokens == sum(min(n, 128) for n in lengths)


# -- reranker ----------------------------------------------------------------------------

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog.",
    LONG_TEXT,
    "x",
    "Café naïve résumé 日本語 🙂",
    "capital capital capital",
    "France",
    "london is a big city in the north of the world",
]


@pytest.fixture(scope="module", params=["tiny", "wide"])
def reranker(request: pytest.FixtureRequest, tiny_reranker: Path, widen: Callable[[Path], Path]) -> Path:
    return tiny_reranker if request.param == "tiny" else widen(tiny_reranker)


@functools.cache
def rerank_reference(path: Path) -> dict[str, np.ndarray]:
    model = cross_encoder(path)
    pairs = [(QUERY, doc) for doc in DOCUMENTS]
    return {
        "default": model.predict(pairs, batch_size=4),
        "raw": model.predict(pairs, batch_size=4, activation_fn=torch.nn.Identity()),
    }


@pytest.mark.parametrize("raw_scores", [False, True])
@pytest.mark.parametrize("top_n", [None, 0, 1, 3, len(DOCUMENTS), 50])
async def test_rerank_matches_cross_encoder(
    engine_for, reranker: Path, raw_scores: bool, top_n: int | None
) -> None:
    engine = await engine_for(reranker)
    result = await engine.rerank(RerankAsk(QUERY, DOCUMENTS, top_n=top_n, raw_scores=raw_scores))
    ref = rerank_reference(reranker)["raw" if raw_scores else "default"]
    expected = len(DOCUMENTS) if not top_n else min(top_n, len(DOCUMENTS))
    assert len(result.results) == expected
    scores = [r.score for r in result.results]
    assert scores == sorted(scores, reverse=True)
    assert len({r.index for r in result.results}) == expected
    for r in result.results:
        assert r.score == pytest.approx(float(ref[r.index]), abs=SCORE_ATOL), r.index
    # The top n are the reference's n best (a near-tie at the cut could swap, hence the slack).
    assert min(scores) >= np.sort(ref)[::-1][expected - 1] - SCORE_ATOL
    if not raw_scores:
        assert all(0.0 < s < 1.0 for s in scores)
    pair_tokens = tokenizer(reranker)([QUERY] * len(DOCUMENTS), DOCUMENTS, truncation=True)
    assert result.prompt_tokens == sum(len(ids) for ids in pair_tokens["input_ids"])


def test_rerank_reference_is_sigmoid_of_logits(reranker: Path) -> None:
    ref = rerank_reference(reranker)
    raw = ref["raw"].astype(np.float64)
    np.testing.assert_allclose(ref["default"], 1 / (1 + np.exp(-raw)), atol=1e-6)


def test_wide_reranker_scores_spread(widen: Callable[[Path], Path], tiny_reranker: Path) -> None:
    """The wide reranker's scores are far apart, so the order tests above mean something."""
    gaps = np.diff(np.sort(rerank_reference(widen(tiny_reranker))["raw"]))
    assert gaps.min() > 10 * SCORE_ATOL


# -- classifier --------------------------------------------------------------------------

CLASSIFY_TEXTS = ["I love this!", "this is terrible", LONG_TEXT, "x", "Café 日本語 🙂", "the weather today"]


@pytest.fixture(scope="module", params=["tiny", "wide"])
def classifier(request: pytest.FixtureRequest, tiny_classifier: Path, widen: Callable[[Path], Path]) -> Path:
    return tiny_classifier if request.param == "tiny" else widen(tiny_classifier)


@functools.cache
def classify_reference(path: Path) -> dict[str, Any]:
    classify = pipeline("text-classification", model=str(path), top_k=None, device="cpu")
    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.inference_mode():
        features = tokenizer(path)(CLASSIFY_TEXTS, padding=True, truncation=True, return_tensors="pt")
        logits = model(**features).logits
    return {
        "pipeline": classify(CLASSIFY_TEXTS, truncation=True),
        "logits": logits.numpy(),
        "labels": [model.config.id2label[i] for i in range(model.config.num_labels)],
    }


async def test_classify_matches_pipeline(engine_for, classifier: Path) -> None:
    result = await (await engine_for(classifier)).classify(ClassifyAsk(CLASSIFY_TEXTS))
    assert len(result.labels) == len(CLASSIFY_TEXTS)
    for ours, ref in zip(result.labels, classify_reference(classifier)["pipeline"], strict=True):
        assert [label for label, _ in ours] == [d["label"] for d in ref]  # highest first
        assert [score for _, score in ours] == pytest.approx([d["score"] for d in ref], abs=SCORE_ATOL)
        assert sum(score for _, score in ours) == pytest.approx(1.0, abs=1e-6)
    assert result.prompt_tokens == sum(token_count(classifier, CLASSIFY_TEXTS, max_length=128))


async def test_classify_raw_scores_are_logits(engine_for, classifier: Path) -> None:
    result = await (await engine_for(classifier)).classify(ClassifyAsk(CLASSIFY_TEXTS, raw_scores=True))
    reference = classify_reference(classifier)
    for ours, logits in zip(result.labels, reference["logits"], strict=True):
        scores = [score for _, score in ours]
        assert scores == sorted(scores, reverse=True)
        got = dict(ours)
        assert set(got) == set(reference["labels"])
        assert [got[label] for label in reference["labels"]] == pytest.approx(logits.tolist(), abs=SCORE_ATOL)


def test_wide_classifier_labels_differ(widen: Callable[[Path], Path], tiny_classifier: Path) -> None:
    """Different texts get different top labels, so the label-order test means something."""
    ref = classify_reference(widen(tiny_classifier))["pipeline"]
    assert len({scores[0]["label"] for scores in ref}) > 1


# -- token-id input and length limits ------------------------------------------------------

ID_TEXTS = ["hello world", "What is the capital of France?", LONG_TEXT, "Café 🙂"]


@pytest.mark.parametrize("name", ["mean-normalized", "decoder-lasttoken", "roberta"])
async def test_token_ids_equal_text(engine_for, embedder, name: str) -> None:
    """--token-ids model: ids of the model's own vocabulary."""
    path = embedder(name)
    engine = await engine_for(path, token_ids="model")
    ids = tokenizer(path)(ID_TEXTS, add_special_tokens=False)["input_ids"]
    assert len(ids[2]) > 128  # the long one is truncated on both paths
    from_ids = await engine.embeddings(EmbedAsk(ids))
    from_text = await engine.embeddings(EmbedAsk(ID_TEXTS))
    np.testing.assert_allclose(from_ids.embeddings, from_text.embeddings, rtol=1e-5, atol=1e-6)
    assert from_ids.prompt_tokens == from_text.prompt_tokens


@pytest.mark.parametrize("bad", [-1, "vocab_size", 10**9])
async def test_token_id_outside_vocabulary(engine_for, tiny_embedder: Path, bad: int | str) -> None:
    engine = await engine_for(tiny_embedder, token_ids="model")
    vocab_size = engine.model().loaded.info.vocab_size
    bad_id = vocab_size if bad == "vocab_size" else bad
    with pytest.raises(InvalidInputError, match=rf"input 1 holds token id {bad_id}\b") as err:
        await engine.embeddings(EmbedAsk([[5, 6], [7, bad_id, 8]]))
    assert err.value.param == "input"
    last = await engine.embeddings(EmbedAsk([[vocab_size - 1]]))
    assert last.embeddings.shape == (1, 32)  # the last id is fine


@pytest.mark.parametrize("name", ["mean-normalized", "roberta"])
async def test_openai_token_ids_mean_their_text(engine_for, embedder, cl100k, name: str) -> None:
    """The default: ids are OpenAI's cl100k_base (made here by tiktoken itself), decoded and
    tokenized by the model, so they give the vectors and token counts of the text."""
    engine = await engine_for(embedder(name))
    from_ids = await engine.embeddings(EmbedAsk([cl100k.encode(text) for text in ID_TEXTS]))
    from_text = await engine.embeddings(EmbedAsk(ID_TEXTS))
    np.testing.assert_allclose(from_ids.embeddings, from_text.embeddings, rtol=1e-5, atol=1e-6)
    assert from_ids.prompt_tokens == from_text.prompt_tokens


@pytest.mark.parametrize("bad", [-1, 100256, 10**9])
async def test_openai_token_id_outside_cl100k(engine_for, tiny_embedder: Path, bad: int) -> None:
    engine = await engine_for(tiny_embedder)
    with pytest.raises(InvalidInputError, match=rf"input 1 holds token id {bad}, which is not in OpenAI's"):
        await engine.embeddings(EmbedAsk([[15339], [15339, bad]]))


async def test_token_ids_refused_or_read_as_the_models_own(engine_for, tiny_embedder: Path) -> None:
    refusing = await engine_for(tiny_embedder, token_ids="refuse")
    with pytest.raises(InvalidInputError, match="takes text, not token ids"):
        await refusing.embeddings(EmbedAsk([[15339]]))
    own = await engine_for(tiny_embedder, token_ids="model")
    assert (await own.embeddings(EmbedAsk([[15]]))).prompt_tokens == 3  # [CLS] 15 [SEP]
    # An OpenAI SDK client's ids are cl100k_base's whatever the setting: never read as ours.
    with pytest.raises(InvalidInputError, match=r"OpenAI's cl100k_base ids.*--token-ids openai"):
        await own.embeddings(EmbedAsk([[15]], openai_sender=True))


async def test_text_too_long_without_truncation(engine_for, tiny_embedder: Path) -> None:
    engine = await engine_for(tiny_embedder)
    (length,) = token_count(tiny_embedder, [LONG_TEXT])
    assert length > 128
    with pytest.raises(InputTooLongError) as err:
        await engine.embeddings(EmbedAsk(["short one", LONG_TEXT], truncate=False))
    message = str(err.value)
    # A text far past the limit is counted only until it is surely too long.
    counted = int(re.search(r"input 1 has over (\d+) tokens", message).group(1))
    assert 128 < counted <= length and "limit of 128" in message
    assert err.value.param == "input"


async def test_token_ids_too_long_without_truncation(engine_for, tiny_embedder: Path) -> None:
    engine = await engine_for(tiny_embedder, token_ids="model")
    with pytest.raises(InputTooLongError, match=r"input 0 has 202 tokens.*limit of 128"):
        await engine.embeddings(EmbedAsk([[10] * 200], truncate=False))  # 200 ids + [CLS] and [SEP]
    ok = await engine.embeddings(EmbedAsk([[10] * 126], truncate=False))  # exactly at the limit
    assert ok.prompt_tokens == 128


async def test_text_at_limit_without_truncation(engine_for, tiny_embedder: Path) -> None:
    engine = await engine_for(tiny_embedder)
    text = " ".join(["hello"] * 126)
    assert token_count(tiny_embedder, [text]) == [128]
    result = await engine.embeddings(EmbedAsk([text], truncate=False))
    assert result.prompt_tokens == 128
    assert_embeddings_match(result.embeddings, reference_embeddings(tiny_embedder, [text]), normalized=True)


async def test_rerank_too_long_without_truncation(engine_for, tiny_reranker: Path) -> None:
    engine = await engine_for(tiny_reranker)
    with pytest.raises(InputTooLongError, match="input 1 "):
        await engine.rerank(RerankAsk(QUERY, ["short", LONG_TEXT], truncate=False))


# -- Matryoshka dimensions -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["mean-normalized", "mean-raw", "dense-tanh", "dense-tanh-normalized"])
@pytest.mark.parametrize("dimensions", [1, 8, 15])
async def test_dimensions(engine_for, embedder, name: str, dimensions: int) -> None:
    path = embedder(name)
    engine = await engine_for(path)
    full = (await engine.embeddings(EmbedAsk(TEXTS[:6]))).embeddings
    cut = (await engine.embeddings(EmbedAsk(TEXTS[:6], dimensions=dimensions))).embeddings
    assert cut.shape == (6, dimensions) and cut.dtype == np.float32
    if name in NORMALIZED:
        expected = full[:, :dimensions] / np.linalg.norm(full[:, :dimensions], axis=1, keepdims=True)
        np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, rtol=1e-5)
    else:
        expected = full[:, :dimensions]
    np.testing.assert_allclose(cut, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "width"), [("mean-normalized", 32), ("dense-tanh", 16)])
async def test_dimensions_bounds(engine_for, embedder, name: str, width: int) -> None:
    engine = await engine_for(embedder(name))
    full = (await engine.embeddings(EmbedAsk(TEXTS[:3]))).embeddings
    assert full.shape == (3, width)
    for same in (None, 0, width):
        result = await engine.embeddings(EmbedAsk(TEXTS[:3], dimensions=same))
        np.testing.assert_allclose(result.embeddings, full, atol=1e-6)
    for bad in (width + 1, -1):
        with pytest.raises(InvalidInputError) as err:
            await engine.embeddings(EmbedAsk(TEXTS[:3], dimensions=bad))
        assert err.value.param == "dimensions"


# -- order ---------------------------------------------------------------------------------


async def test_results_in_input_order_across_batches(engine_for, tiny_embedder: Path) -> None:
    """Mixed lengths with batches of two: the batcher reorders, the results must not."""
    engine = await engine_for(tiny_embedder, max_batch_size=2, batch_tokens=256)
    texts = [LONG_TEXT, "x", TEXTS[5], "hello world", LONG_TEXT[:300], "the", TEXTS[6], TEXTS[13], "a b"]
    ref = reference_embeddings(tiny_embedder, texts)
    result = await engine.embeddings(EmbedAsk(texts))
    assert_embeddings_match(result.embeddings, ref, normalized=True)
    # Each row is closest to its own reference row, so no two rows were swapped.
    assert (np.argmax(result.embeddings @ ref.T, axis=1) == np.arange(len(texts))).all()


async def test_concurrent_requests_get_their_own_results(engine_for, tiny_embedder: Path) -> None:
    engine = await engine_for(tiny_embedder, max_batch_size=2, batch_tokens=256)
    requests = [TEXTS[i : i + 3] for i in range(0, 15, 3)]
    results = await asyncio.gather(*(engine.embeddings(EmbedAsk(texts)) for texts in requests))
    for texts, result in zip(requests, results, strict=True):
        ref = reference_embeddings(tiny_embedder, texts)
        assert_embeddings_match(result.embeddings, ref, normalized=True)
