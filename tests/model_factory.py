"""Tiny random-weight models for the test suite.

The serving engine has to be exercised against real on-disk model folders (Hugging Face
``save_pretrained`` layouts and sentence-transformers folders), but the hub cannot be
reached from CI and real checkpoints are far too slow. Every builder here writes a
complete, loadable folder with a few thousand random weights in well under two seconds,
so session-scoped pytest fixtures can call them into ``tmp_path_factory`` directories.

Each builder takes the target directory, seeds torch inside a forked RNG (so the result is
deterministic for a given torch/transformers version and the caller's global RNG is left
alone) and returns the directory.

Run ``HF_HUB_OFFLINE=1 python tests/model_factory.py`` for a self-check that builds every
model and loads it back through its reference library.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import BertConfig

SEED = 1234
MAX_LENGTH = 128
HIDDEN = 32
# Scoring models are drawn wider than BERT's 0.02: at 0.02 a tiny reranker gives every pair
# the same score (to 1e-5), so a test could not tell a reversed ranking or a broken mask.
WIDE_INIT = 0.5

PoolingMode = Literal["mean", "cls", "lasttoken", "max"]

# Common English words: enough that ordinary test sentences mostly map to whole-word ids,
# the letter / "##letter" pieces below cover everything else without [UNK].
_WORDS_TEXT = """
the of and to a in is it you that he was for on are with as i his they be at one have this
from or had by not word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter until mile
river car feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl usual young
ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice
voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest able pound done beauty drive stood contain front teach week final gave
green quick develop ocean warm free minute strong special mind behind clear tail produce fact
street inch multiply nothing course stay wheel full force blue object decide surface deep
moon island foot system busy test record boat common gold possible plane stead dry wonder
laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes
distant fill east paint language among query document search embedding model vector rank
hello capital france paris london weather today sunny cat cats dogs fox quick brown lazy jumps
"""
_WORDS = _WORDS_TEXT.split()

_PUNCTUATION = list(".,!?;:'\"()-[]/&%$#@*+=<>_")

# A little English for training the byte-level BPE vocabularies.
_BPE_CORPUS = [" ".join(_WORDS[i : i + 12]) + "." for i in range(0, len(_WORDS), 12)] + [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital of France.",
    "Embedding models turn sentences into vectors; rerankers score query-document pairs.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 2024 appear in text too!",
]


@contextmanager
def _seeded(seed: int = SEED) -> Iterator[None]:
    """Seed torch without disturbing the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _save_seeded(path: Path, make: Callable[[], Any], processor: Any) -> Path:
    """A model drawn under the fixed seed, saved with its processor."""
    with _seeded():
        model = make().eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    processor.save_pretrained(str(path))
    return path


def _wordpiece_vocab() -> list[str]:
    """Special tokens first ([PAD]=0), then words, characters and ``##`` continuations."""
    chars = list(string.ascii_lowercase) + list(string.digits)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_PUNCTUATION, *chars]
    vocab += ["##" + c for c in chars]
    vocab += _WORDS
    return list(dict.fromkeys(vocab))  # de-duplicate, keep order


def build_wordpiece_tokenizer(path: Path, max_length: int = MAX_LENGTH) -> Path:
    """Write ``vocab.txt`` and a BERT fast tokenizer (``tokenizer.json``) into ``path``.

    Loading through ``from_pretrained`` on a bare ``vocab.txt`` is the one construction
    path that behaves the same on transformers 4 and 5.
    """
    from transformers import BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(_wordpiece_vocab()) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast.from_pretrained(
        str(path), do_lower_case=True, model_max_length=max_length
    )
    tokenizer.save_pretrained(str(path))
    return path


def _tiny_bert_config(vocab_size: int, **kwargs: object) -> BertConfig:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_LENGTH,
        pad_token_id=0,
        **kwargs,
    )


def _build_bert_base(path: Path) -> Path:
    """Plain ``BertModel`` + tokenizer, the input for a sentence-transformers folder."""
    from transformers import AutoTokenizer, BertModel

    build_wordpiece_tokenizer(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    with _seeded():
        # Keep the pooler: sentence-transformers loads via AutoModel (pooler included) and
        # would otherwise fill it with unseeded random weights before re-saving.
        model = BertModel(_tiny_bert_config(len(tokenizer)))
    model.save_pretrained(str(path))
    return path


def _save_sentence_transformer(
    hf_dir: Path,
    path: Path,
    pooling: PoolingMode,
    normalize: bool,
    dense_out: int | None = None,
    dense_activation: str | None = None,
    dense_bias: bool = True,
    max_length: int = MAX_LENGTH,
) -> Path:
    """Wrap a saved HF model as a sentence-transformers folder using the library's own writer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )
    from sentence_transformers.util import import_from_string

    with _seeded(SEED + 1):  # covers the Dense init and anything the loader initialises
        transformer = Transformer(str(hf_dir), max_seq_length=max_length)
        dim = transformer.get_embedding_dimension()
        modules: list[torch.nn.Module] = [transformer, Pooling(dim, pooling_mode=pooling)]
        if dense_out is not None:
            activation = (
                torch.nn.Identity()
                if dense_activation is None
                else import_from_string(dense_activation)()
            )
            modules.append(Dense(dim, dense_out, bias=dense_bias, activation_function=activation))
        if normalize:
            modules.append(Normalize())
        model = SentenceTransformer(modules=modules, device="cpu")
    model.max_seq_length = max_length
    path.mkdir(parents=True, exist_ok=True)
    model.save(str(path))
    return path


def build_bert_embedder(
    path: Path,
    pooling: PoolingMode = "mean",
    normalize: bool = True,
    dense_out: int | None = None,
    dense_activation: str | None = "torch.nn.modules.activation.Tanh",
) -> Path:
    """Tiny BERT sentence-transformers folder (Transformer, Pooling, [Dense], [Normalize]).

    ``dense_activation`` is a dotted class path (``None`` means identity), the same form
    sentence-transformers stores in ``2_Dense/config.json``.
    """
    with tempfile.TemporaryDirectory(prefix="tiny-bert-") as tmp:
        hf_dir = _build_bert_base(Path(tmp))
        return _save_sentence_transformer(
            hf_dir, path, pooling, normalize, dense_out, dense_activation
        )


# A long-context encoder's window (ModernBERT, bge-m3, nomic, gte: 8,192 tokens).
LONG_LENGTH = 8192


def build_modernbert_embedder(path: Path) -> Path:
    """Tiny ModernBERT sentence-transformers folder (mean pooling, Normalize) with an 8,192-token
    window: global attention in every layer, so attention's cost is the whole square."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

    with tempfile.TemporaryDirectory(prefix="tiny-modernbert-") as tmp:
        hf_dir = build_wordpiece_tokenizer(Path(tmp), LONG_LENGTH)
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
        ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in
               (("pad", "[PAD]"), ("cls", "[CLS]"), ("sep", "[SEP]"))}
        config = ModernBertConfig(
            vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=LONG_LENGTH, global_attn_every_n_layers=1,
            pad_token_id=ids["pad"], bos_token_id=ids["cls"], eos_token_id=ids["sep"],
            cls_token_id=ids["cls"], sep_token_id=ids["sep"],
        )
        with _seeded():
            model = ModernBertModel(config)
        model.save_pretrained(str(hf_dir))
        return _save_sentence_transformer(hf_dir, path, "mean", True, max_length=LONG_LENGTH)


def build_bert_reranker(path: Path) -> Path:
    """Tiny cross-encoder: ``BertForSequenceClassification`` with one logit.

    How sentence-transformers 6 ``CrossEncoder.predict`` scores it: ``predict(...,
    activation_fn=None)`` (the default) falls back to ``model.activation_fn``, resolved at
    load time as: the constructor's ``activation_fn`` argument, else ``"activation_fn"`` in
    ``config_sentence_transformers.json`` (what ``CrossEncoder.save`` writes), else
    ``config.json["sentence_transformers"]["activation_fn"]`` (or the legacy
    ``sbert_ce_default_activation_function``), else ``torch.nn.Sigmoid()`` when
    ``num_labels == 1`` and ``Identity()`` otherwise. Paths not starting with ``torch.``
    need ``trust_remote_code=True``. This plain ``save_pretrained`` folder has none of those
    keys, so ``predict`` returns sigmoid(logit). Raw logits:
    ``predict(pairs, activation_fn=torch.nn.Identity())``; explicit sigmoid:
    ``activation_fn=torch.nn.Sigmoid()``. Output ``[batch, 1]`` is squeezed to ``[batch]``.
    """
    from transformers import AutoTokenizer, BertForSequenceClassification

    build_wordpiece_tokenizer(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    with _seeded():
        config = _tiny_bert_config(len(tokenizer), num_labels=1, initializer_range=WIDE_INIT)
        model = BertForSequenceClassification(config)
    model.save_pretrained(str(path))
    return path


def build_bert_classifier(
    path: Path, labels: Sequence[str] = ("negative", "neutral", "positive")
) -> Path:
    """Tiny ``BertForSequenceClassification`` with named labels (``id2label``/``label2id``)."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    build_wordpiece_tokenizer(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    id2label = dict(enumerate(labels))
    config = _tiny_bert_config(
        len(tokenizer),
        initializer_range=WIDE_INIT,
        num_labels=len(labels),
        id2label=id2label,
        label2id={label: i for i, label in id2label.items()},
    )
    with _seeded():
        model = BertForSequenceClassification(config)
    model.save_pretrained(str(path))
    return path


def _train_byte_level_bpe(special_tokens: list[str], vocab_size: int) -> Tokenizer:
    """Train a small byte-level BPE on the in-file corpus (deterministic, no network)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_BPE_CORPUS, trainer=trainer)
    return tokenizer


def build_decoder_embedder(path: Path) -> Path:
    """Tiny decoder-only (Qwen2) embedder with last-token pooling + Normalize.

    Last-token pooling needs the final position to be EOS, so the tokenizer's post-processor
    appends ``<|endoftext|>`` to every text; padding is on the right (the pooling module
    uses the attention mask to find the last real token).
    """
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2Model

    eos, pad = "<|endoftext|>", "<|pad|>"
    backend = _train_byte_level_bpe([eos, pad], vocab_size=400)
    eos_id, pad_id = backend.token_to_id(eos), backend.token_to_id(pad)
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {eos}:0",
        pair=f"$A:0 {eos}:0 $B:1 {eos}:1",
        special_tokens=[(eos, eos_id)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=eos,
        pad_token=pad,
        padding_side="right",
        model_max_length=MAX_LENGTH,
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_LENGTH,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
    )
    with tempfile.TemporaryDirectory(prefix="tiny-qwen2-") as tmp:
        tokenizer.save_pretrained(tmp)
        with _seeded():
            Qwen2Model(config).save_pretrained(tmp)
        return _save_sentence_transformer(Path(tmp), path, "lasttoken", normalize=True)


def build_roberta_embedder(path: Path) -> Path:
    """Tiny RoBERTa mean-pooling embedder with a byte-level BPE tokenizer.

    The tokenizer is built the classic way (``vocab.json`` + ``merges.txt``), but the
    sentence-transformers re-save keeps only ``tokenizer.json`` + ``tokenizer_config.json``.

    RoBERTa position ids start at ``pad_token_id + 1``, hence ``max_position_embeddings``
    of 128 + 2: a model that gets this wrong crashes on inputs at the truncation limit.
    """
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, pad=1 as in RoBERTa
    backend = _train_byte_level_bpe(specials, vocab_size=400)
    with tempfile.TemporaryDirectory(prefix="tiny-roberta-") as tmp:
        backend.model.save(tmp)  # vocab.json + merges.txt
        tokenizer = RobertaTokenizerFast.from_pretrained(tmp, model_max_length=MAX_LENGTH)
        assert tokenizer.pad_token_id == 1, tokenizer.pad_token_id
        config = RobertaConfig(
            vocab_size=len(tokenizer),
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=MAX_LENGTH + 2,
            type_vocab_size=1,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
        tokenizer.save_pretrained(tmp)
        with _seeded():
            RobertaModel(config).save_pretrained(tmp)  # pooler kept, see _build_bert_base
        return _save_sentence_transformer(Path(tmp), path, "mean", normalize=True)


def build_t5_encoder(path: Path, encoder_only: bool = True) -> Path:
    """Tiny sentence-t5 / gtr-t5: ``T5EncoderModel`` (``architectures: ["T5EncoderModel"]``,
    the encoder alone) with a unigram (SentencePiece-style) tokenizer, mean pooling, a Dense
    without bias or activation, and Normalize, as the sentence-t5 folders are laid out.
    ``encoder_only=False``: the weights saved as ``T5ForConditionalGeneration`` (decoder
    included), which sentence-transformers still reads with the encoder alone."""
    from transformers import T5Config, T5EncoderModel, T5ForConditionalGeneration, T5Tokenizer

    pieces = ["\u2581" + w for w in _WORDS] + list(string.ascii_letters + string.digits) + _PUNCTUATION
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(piece, -1.0 - len(piece) / 10) for piece in dict.fromkeys(pieces)]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=MAX_LENGTH)
    config = T5Config(
        vocab_size=len(tokenizer), d_model=HIDDEN, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32, feed_forward_proj="relu",
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    with tempfile.TemporaryDirectory(prefix="tiny-t5-") as tmp:
        tokenizer.save_pretrained(tmp)
        with _seeded():
            (T5EncoderModel if encoder_only else T5ForConditionalGeneration)(config).save_pretrained(tmp)
        return _save_sentence_transformer(
            Path(tmp), path, "mean", normalize=True, dense_out=HIDDEN, dense_activation=None, dense_bias=False
        )


def build_gemma3_embedder(path: Path, bidirectional: bool = True) -> Path:
    """Tiny EmbeddingGemma: ``Gemma3TextModel`` with ``use_bidirectional_attention`` (False:
    the causal variant), a Gemma BPE with byte fallback, mean pooling, two Dense layers without
    bias or activation (wider, then back), and Normalize, as embeddinggemma's folder is laid out.
    Sliding window 4 on layer one, so that the windowed mask is exercised by ordinary texts."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Gemma3TextConfig, Gemma3TextModel, GemmaTokenizer

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{i:02X}>" for i in range(256)]
    bpe = Tokenizer(models.BPE(byte_fallback=True))
    bpe.normalizer = normalizers.Replace(" ", "\u2581")
    bpe.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    bpe.train_from_iterator(_BPE_CORPUS, trainers.BpeTrainer(vocab_size=600, special_tokens=special,
                                                             show_progress=False))
    trained = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tokenizer = GemmaTokenizer(vocab=trained["vocab"], merges=merges, padding_side="right",
                               model_max_length=MAX_LENGTH)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=MAX_LENGTH,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=bidirectional, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    with tempfile.TemporaryDirectory(prefix="tiny-gemma3-") as tmp:
        tokenizer.save_pretrained(tmp)
        with _seeded():
            Gemma3TextModel(config).save_pretrained(tmp)
        st = _save_sentence_transformer(
            Path(tmp), Path(tmp) / "st", "mean", normalize=False, dense_out=4 * HIDDEN, dense_activation=None,
            dense_bias=False,
        )
        return _append_dense(st, path, HIDDEN)


def _append_dense(st_dir: Path, path: Path, out: int) -> Path:
    """The sentence-transformers folder at ``st_dir`` with one more Dense (no bias, identity)
    and Normalize after its last module, saved to ``path`` by the library's writer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    with _seeded(SEED + 2):
        model = SentenceTransformer(str(st_dir), device="cpu")
        width = model.get_embedding_dimension()
        model.append(Dense(width, out, bias=False, activation_function=torch.nn.Identity()))
        model.append(Normalize())
    path.mkdir(parents=True, exist_ok=True)
    model.save(str(path))
    return path


def build_bge_m3(path: Path) -> Path:
    """Tiny bge-m3: an XLM-R encoder (byte-level BPE vocabulary) saved as sentence-transformers
    writes bge-m3 (CLS pooling, Normalize), with FlagEmbedding's two heads beside it, drawn
    here: ``sparse_linear.pt`` (Linear(hidden, 1)) and ``colbert_linear.pt`` (Linear(hidden,
    hidden)), as FlagEmbedding saves them (each Linear's state dict)."""
    from transformers import RobertaTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # XLM-R's ids 0..3: <s>, <pad>, </s>, <unk>
    backend = _train_byte_level_bpe(specials, vocab_size=400)
    with tempfile.TemporaryDirectory(prefix="tiny-xlmr-") as tmp:
        backend.model.save(tmp)
        tokenizer = RobertaTokenizerFast.from_pretrained(tmp, model_max_length=MAX_LENGTH)
        config = XLMRobertaConfig(
            vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=MAX_LENGTH + 2, type_vocab_size=1,
            pad_token_id=1, bos_token_id=0, eos_token_id=2,
        )
        tokenizer.save_pretrained(tmp)
        with _seeded():
            XLMRobertaModel(config).save_pretrained(tmp)
        _save_sentence_transformer(Path(tmp), path, "cls", normalize=True)
    with _seeded(SEED + 2):
        sparse, colbert = torch.nn.Linear(HIDDEN, 1), torch.nn.Linear(HIDDEN, HIDDEN)
        # Half the tokens' sparse weights above zero, the rest cut by relu: both paths tested.
        torch.nn.init.normal_(sparse.weight, std=0.5)
        torch.nn.init.constant_(sparse.bias, 1.5)
    torch.save(sparse.state_dict(), path / "sparse_linear.pt")
    torch.save(colbert.state_dict(), path / "colbert_linear.pt")
    return path


def build_splade(path: Path, sentence_transformers: bool = True) -> Path:
    """Tiny SPLADE: ``BertForMaskedLM``; with ``sentence_transformers`` saved as a
    SparseEncoder folder (MLMTransformer + SpladePooling, the library's own writer), else the
    bare transformers folder (served with ``--pooling splade``)."""
    from transformers import AutoTokenizer, BertForMaskedLM

    with tempfile.TemporaryDirectory(prefix="tiny-splade-") as tmp:
        hf_dir = path if not sentence_transformers else Path(tmp)
        build_wordpiece_tokenizer(hf_dir)
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
        with _seeded():
            model = BertForMaskedLM(_tiny_bert_config(len(tokenizer)))
            # Wider output weights: random logits then reach well past 0, so a term weight
            # that a wrong mask or pooling would change is not lost in rounding.
            model.cls.predictions.decoder.weight.data.mul_(8)
        model.save_pretrained(str(hf_dir))
        if not sentence_transformers:
            return path
        from sentence_transformers import SparseEncoder

        encoder = SparseEncoder(str(hf_dir), device="cpu")
        path.mkdir(parents=True, exist_ok=True)
        encoder.save(str(path))
    return path


CLIP_IMAGE = 32  # pixels a side
CLIP_PATCH = 8


def build_clip(path: Path, model_type: str = "clip") -> Path:
    """Tiny CLIP (or SigLIP): byte-level BPE text tower, 32-pixel ViT image tower, both
    projected into one space; ``preprocessor_config.json`` from transformers' own image
    processor (PIL flavour: no torchvision here)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    bos, eos = "<|startoftext|>", "<|endoftext|>"
    backend = _train_byte_level_bpe([bos, eos], vocab_size=400)
    bos_id, eos_id = backend.token_to_id(bos), backend.token_to_id(eos)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0", special_tokens=[(bos, bos_id), (eos, eos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=eos, unk_token=eos,
        model_max_length=77,
    )
    text = {
        "vocab_size": len(tokenizer), "hidden_size": HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 77,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id,
    }
    vision = {
        "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": CLIP_IMAGE, "patch_size": CLIP_PATCH,
    }
    if model_type == "clip":
        from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

        config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)
        model_class = CLIPModel
        processor = CLIPImageProcessorPil(
            size={"shortest_edge": CLIP_IMAGE}, crop_size={"height": CLIP_IMAGE, "width": CLIP_IMAGE}
        )
    else:
        from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel

        text["max_position_embeddings"] = 64
        tokenizer.model_max_length = 64
        config = SiglipConfig(text_config=text, vision_config=vision)
        model_class = SiglipModel
        processor = SiglipImageProcessorPil(size={"height": CLIP_IMAGE, "width": CLIP_IMAGE})
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))
    processor.save_pretrained(str(path))
    with _seeded():
        model_class(config).save_pretrained(str(path))
    return path


def build_colpali(path: Path) -> Path:
    """Tiny ColPali: a Gemma-style BPE (byte fallback, the special tokens ColPaliProcessor
    adds), a 32-pixel SigLIP vision tower with patch 8 (16 image tokens), a two-layer Gemma,
    16-wide token vectors; saved with transformers' own ColPaliProcessor (PIL image processor)."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import (
        ColPaliConfig,
        ColPaliForRetrieval,
        ColPaliProcessor,
        GemmaTokenizer,
        SiglipImageProcessorPil,
    )

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{i:02X}>" for i in range(256)]
    bpe = Tokenizer(models.BPE(byte_fallback=True))
    bpe.normalizer = normalizers.Replace(" ", "\u2581")
    bpe.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    bpe.train_from_iterator(
        [*_BPE_CORPUS, "Describe the image.", "Question: what is the revenue?"],
        trainers.BpeTrainer(vocab_size=600, special_tokens=special, show_progress=False),
    )
    trained = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tokenizer = GemmaTokenizer(vocab=trained["vocab"], merges=merges, padding_side="right")
    image = {"height": CLIP_IMAGE, "width": CLIP_IMAGE}
    processor = ColPaliProcessor(
        image_processor=SiglipImageProcessorPil(size=image, image_seq_length=(CLIP_IMAGE // CLIP_PATCH) ** 2),
        tokenizer=tokenizer,
    )
    vocab = len(processor.tokenizer)  # with the <image>, <loc...> and <seg...> tokens it added
    text = {
        "model_type": "gemma", "vocab_size": vocab, "hidden_size": HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
        "max_position_embeddings": 512, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    }
    vision = {
        "model_type": "siglip_vision_model", "hidden_size": HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": CLIP_IMAGE, "patch_size": CLIP_PATCH,
        "vision_use_head": False,
    }
    config = ColPaliConfig(embedding_dim=16, vlm_config={
        "model_type": "paligemma", "image_token_index": processor.image_token_id, "vocab_size": vocab,
        "projection_dim": HIDDEN, "hidden_size": HIDDEN, "text_config": text, "vision_config": vision,
    })
    return _save_seeded(path, lambda: ColPaliForRetrieval(config), processor)


def build_colbert(path: Path, strategy: str = "fixed", attend: bool = False) -> Path:
    """Tiny ColBERT as sentence-transformers 6 writes one (MultiVectorEncoder): BERT with added
    "[Q] "/"[D] " prompt tokens, queries expanded with [MASK] to 16 tokens (``strategy``, the
    encoder attending to them or not), documents cut at 64 tokens, a bias-free 16-wide Dense
    and Normalize on token vectors, punctuation skipped in documents."""
    import string

    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import AutoTokenizer, BertModel

    with tempfile.TemporaryDirectory(prefix="tiny-colbert-") as tmp:
        _build_bert_base(Path(tmp))
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        tokenizer.add_tokens(["[Q] ", "[D] "])
        tokenizer.save_pretrained(tmp)
        model = BertModel.from_pretrained(tmp)
        with _seeded():
            model.resize_token_embeddings(len(tokenizer))
        model.save_pretrained(tmp)
        with _seeded(SEED + 1):
            transformer = Transformer(
                tmp, max_seq_length=MAX_LENGTH, query_length=32, document_length=64,
                query_expansion={"strategy": strategy, "attend": attend, "length": 16},
            )
            token_level = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}
            modules = [
                transformer,
                Dense(HIDDEN, 16, bias=False, activation_function=torch.nn.Identity(), **token_level),
                Normalize(**token_level),
                MultiVectorMask(skiplist_words=list(string.punctuation)),
            ]
            prompts = {"query": "[Q] ", "document": "[D] "}
            encoder = MultiVectorEncoder(modules=modules, prompts=prompts, device="cpu")
        path.mkdir(parents=True, exist_ok=True)
        encoder.save(str(path))
    return path


def build_colqwen2(path: Path) -> Path:
    """Tiny ColQwen2: a byte-level BPE with Qwen's special tokens, a two-layer Qwen2-VL (M-RoPE
    sections 2/1/1), a vision tower of patch 8 merged 2x2, pages of 32x32 to 64x64 pixels,
    16-wide token vectors; saved with transformers' own ColQwen2Processor (PIL flavour)."""
    from tokenizers import Regex, pre_tokenizers
    from transformers import (
        ColQwen2Config,
        ColQwen2ForRetrieval,
        ColQwen2Processor,
        Qwen2Tokenizer,
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    backend = _train_byte_level_bpe([], vocab_size=400)
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    import json

    trained = json.loads(backend.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=trained["vocab"], merges=merges)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
    pixels = {"shortest_edge": 32 * 32, "longest_edge": 64 * 64}
    images = Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2, size=pixels)
    processor = ColQwen2Processor(image_processor=images, tokenizer=tokenizer)
    text = {
        "model_type": "qwen2_vl_text", "vocab_size": len(processor.tokenizer), "hidden_size": HIDDEN,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    vision = {
        "model_type": "qwen2_vl_vision", "depth": 2, "embed_dim": HIDDEN, "hidden_size": HIDDEN,
        "num_heads": 4, "mlp_ratio": 2, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "in_channels": 3,
    }
    config = ColQwen2Config(embedding_dim=16, vlm_config={
        "model_type": "qwen2_vl", "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "text_config": text, "vision_config": vision,
    })
    return _save_seeded(path, lambda: ColQwen2ForRetrieval(config), processor)


def build_clap(path: Path) -> Path:
    """Tiny CLAP: RoBERTa-style text tower (byte-level BPE, pad 1, positions = length + 2), the
    smallest HTSAT audio tower that takes CLAP's (1, 1001, 64) log-mel input (spec 256, patch
    16, two stages), unfused; the feature extractor of the real laion checkpoints (48 kHz,
    10 s, 64 mel bins from 50 Hz)."""
    from transformers import (
        ClapAudioConfig,
        ClapConfig,
        ClapFeatureExtractor,
        ClapModel,
        ClapTextConfig,
        RobertaTokenizerFast,
    )

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, pad=1 as in RoBERTa
    backend = _train_byte_level_bpe(specials, vocab_size=400)
    with tempfile.TemporaryDirectory(prefix="tiny-clap-") as tmp:
        backend.model.save(tmp)
        files = {"vocab": f"{tmp}/vocab.json", "merges": f"{tmp}/merges.txt"}  # v4's *_file names are ignored
        tokenizer = RobertaTokenizerFast(**files, model_max_length=64)
    assert tokenizer.pad_token_id == 1, tokenizer.pad_token_id
    text = ClapTextConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64 + 2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        type_vocab_size=1,
    )
    audio = ClapAudioConfig(
        spec_size=256, num_mel_bins=64, patch_size=16, patch_stride=[16, 16], patch_embeds_hidden_size=16,
        depths=[1, 1], num_attention_heads=[2, 4], window_size=4, hidden_size=HIDDEN, enable_fusion=False,
        mlp_ratio=2.0,
    )
    config = ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=24)
    extractor = ClapFeatureExtractor(
        feature_size=64, sampling_rate=48_000, hop_length=480, max_length_s=10, fft_window_size=1024,
        frequency_min=50, frequency_max=14_000, truncation="rand_trunc", padding="repeatpad",
    )
    path.mkdir(parents=True, exist_ok=True)
    with _seeded():
        ClapModel(config).eval().save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    extractor.save_pretrained(str(path))
    return path


# LLM rerankers' templates are long in a tiny vocabulary: room for them and a document.
LLM_MAX_LENGTH = 512
# Qwen3-Reranker's prompt, as its model card gives it: the instruction is the system message
# (sentence-transformers' prompt), the default one when none is given.
QWEN3_RERANKER_TEMPLATE = (
    "{%- set instruction = messages | selectattr('role', 'eq', 'system') | map(attribute='content') | first "
    "| default('Given a web search query, retrieve relevant passages that answer the query') -%}\n"
    "{%- set query = messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first -%}\n"
    "{%- set document = messages | selectattr('role', 'eq', 'document') | map(attribute='content') "
    "| first -%}\n"
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {{ instruction }}\n<Query>: {{ query }}\n<Document>: {{ document }}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
# bge-reranker-v2-gemma's prompt (structured messages: content is a list of typed parts); it
# scores the logit of "Yes" alone.
GEMMA_RERANKER_TEMPLATE = (
    "{%- set ns = namespace(instruction=\"Given a query A and a passage B, determine whether the passage "
    "contains an answer to the query by providing a prediction of either 'Yes' or 'No'.\", query='', "
    "document='') -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message.role == 'system' -%}{%- set ns.instruction = message.content[0].text -%}\n"
    "{%- elif message.role == 'query' -%}{%- set ns.query = message.content[0].text -%}\n"
    "{%- elif message.role == 'document' -%}{%- set ns.document = message.content[0].text -%}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{{ bos_token }}A: {{ ns.query }}\nB: {{ ns.document }}\n{{ ns.instruction }}\n"
)


def _causal_reranker_tokenizer(special: list[str], answers: list[str], **tokens: str) -> Any:
    """A byte-level BPE that knows the answer words ("yes", "no") as whole tokens."""
    from transformers import PreTrainedTokenizerFast

    backend = _train_byte_level_bpe(special, vocab_size=500)
    backend.add_tokens(answers)
    return PreTrainedTokenizerFast(tokenizer_object=backend, padding_side="left",
                                   model_max_length=LLM_MAX_LENGTH, **tokens)


def _save_llm_reranker(hf_dir: Path, path: Path, true_token: str, false_token: str | None,
                       prompts: dict[str, str] | None = None, default_prompt: str | None = None) -> Path:
    """A causal-LM reranker folder as sentence-transformers 6 writes one: Transformer
    (text-generation) and LogitScore."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore

    transformer = Transformer(str(hf_dir), transformer_task="text-generation", max_seq_length=LLM_MAX_LENGTH)
    tokenizer = transformer.tokenizer
    score = LogitScore(tokenizer.convert_tokens_to_ids(true_token),
                       None if false_token is None else tokenizer.convert_tokens_to_ids(false_token))
    model = CrossEncoder(modules=[transformer, score], device="cpu", prompts=prompts,
                         default_prompt_name=default_prompt)
    path.mkdir(parents=True, exist_ok=True)
    model.save(str(path))
    return path


def build_qwen3_reranker(
    path: Path, prompts: dict[str, str] | None = None, default_prompt: str | None = None
) -> Path:
    """Tiny Qwen3-Reranker: a two-layer ``Qwen3ForCausalLM`` scored as log-odds of "yes" over
    "no" at the last position, after its chat template (instruction, query, document);
    ``prompts``/``default_prompt``: sentence-transformers' named instructions and the default."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = _causal_reranker_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["yes", "no"], eos_token="<|im_end|>",
        pad_token="<|endoftext|>")
    tokenizer.chat_template = QWEN3_RERANKER_TEMPLATE
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=LLM_MAX_LENGTH,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
        initializer_range=WIDE_INIT,
    )
    with tempfile.TemporaryDirectory(prefix="tiny-qwen3-rr-") as tmp:
        tokenizer.save_pretrained(tmp)
        with _seeded():
            Qwen3ForCausalLM(config).save_pretrained(tmp)
        return _save_llm_reranker(Path(tmp), path, "yes", "no", prompts, default_prompt)


def build_gemma_reranker(path: Path) -> Path:
    """Tiny bge-reranker-v2-gemma: a two-layer ``Gemma2ForCausalLM`` (logit soft-capping, a
    <bos> in its template) scored by the logit of "Yes" alone."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tokenizer = _causal_reranker_tokenizer(["<pad>", "<eos>", "<bos>"], ["Yes", "No"], bos_token="<bos>",
                                           eos_token="<eos>", pad_token="<pad>")
    tokenizer.chat_template = GEMMA_RERANKER_TEMPLATE
    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=LLM_MAX_LENGTH,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, sliding_window=16, final_logit_softcapping=5.0,
        initializer_range=WIDE_INIT,
    )
    with tempfile.TemporaryDirectory(prefix="tiny-gemma-rr-") as tmp:
        tokenizer.save_pretrained(tmp)
        with _seeded():
            Gemma2ForCausalLM(config).save_pretrained(tmp)
        return _save_llm_reranker(Path(tmp), path, "Yes", None)


def _same_files(a: Path, b: Path) -> bool:
    """Byte-compare two built folders (the determinism check)."""
    files = sorted(f.relative_to(a) for f in a.rglob("*") if f.is_file())
    return files == sorted(f.relative_to(b) for f in b.rglob("*") if f.is_file()) and all(
        (a / f).read_bytes() == (b / f).read_bytes() for f in files
    )


def _self_check(root: Path) -> None:
    """Build every model into ``root`` and load each back in its reference library."""
    import json
    import time

    import numpy as np
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from transformers import AutoTokenizer, pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    texts = ["What is the capital of France?", "Paris is a big city in the north.", "xyzzy"]
    long_text = " ".join(_WORDS[i % len(_WORDS)] for i in range(200))

    def timed(name: str, fn: Callable[..., Path], *args: object, **kwargs: object) -> Path:
        start = time.perf_counter()
        out = fn(root / name, *args, **kwargs)
        elapsed = time.perf_counter() - start
        print(f"built {name:<16} in {elapsed:.2f}s")
        assert elapsed < 2.0, f"{name} took {elapsed:.2f}s"
        again = fn(root / f"{name}.again", *args, **kwargs)
        assert _same_files(out, again), f"{name}: two builds differ"
        return out

    def show(path: Path, rel: str) -> None:
        print(f"--- {rel}\n{(path / rel).read_text().strip()}")

    def unit_norm(emb: np.ndarray) -> bool:
        return bool(np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5))

    p = timed("wordpiece", build_wordpiece_tokenizer)
    tok = AutoTokenizer.from_pretrained(str(p))
    assert (p / "tokenizer.json").exists() and tok.pad_token_id == 0
    assert tok.model_max_length == MAX_LENGTH
    ids = tok(texts[0])["input_ids"]
    print("wordpiece:", tok.convert_ids_to_tokens(ids))
    assert tok.unk_token_id not in ids

    for pooling in ("mean", "cls", "lasttoken", "max"):
        p = timed(f"bert-{pooling}", build_bert_embedder, pooling=pooling)
        emb = SentenceTransformer(str(p), device="cpu").encode([*texts, long_text])
        assert emb.shape == (4, HIDDEN) and unit_norm(emb), emb.shape

    p = timed("bert-dense", build_bert_embedder, pooling="cls", normalize=False, dense_out=16)
    for rel in ("modules.json", "1_Pooling/config.json", "2_Dense/config.json"):
        show(p, rel)
    show(p, "sentence_bert_config.json")
    show(p, "config_sentence_transformers.json")
    print("2_Dense files:", sorted(f.name for f in (p / "2_Dense").iterdir()))
    emb = SentenceTransformer(str(p), device="cpu").encode(texts)
    assert emb.shape == (3, 16) and np.abs(emb).max() <= 1.0 and not unit_norm(emb)

    p = timed("bert-dense-id", build_bert_embedder, dense_out=8, dense_activation=None)
    dense_cfg = json.loads((p / "2_Dense/config.json").read_text())
    assert dense_cfg["activation_function"] == "torch.nn.modules.linear.Identity", dense_cfg
    emb = SentenceTransformer(str(p), device="cpu").encode(texts)
    assert emb.shape == (3, 8) and unit_norm(emb)

    p = timed("reranker", build_bert_reranker)
    ce = CrossEncoder(str(p), device="cpu")
    pair = (texts[0], texts[1])
    prob = ce.predict([pair])
    logit = ce.predict([pair], activation_fn=torch.nn.Identity())
    print(f"reranker: activation_fn={ce.activation_fn!r} predict={prob} raw={logit}")
    assert isinstance(ce.activation_fn, torch.nn.Sigmoid)
    assert prob.shape == (1,) and np.allclose(prob, 1 / (1 + np.exp(-logit)), atol=1e-6)
    assert ce.predict([(long_text, long_text)]).shape == (1,)

    p = timed("classifier", build_bert_classifier)
    clf = pipeline("text-classification", model=str(p), top_k=None, device="cpu")
    out = clf([texts[0], long_text], truncation=True)  # the pipeline does not truncate
    print("classifier:", out[0])
    assert {d["label"] for d in out[0]} == {"negative", "neutral", "positive"}

    p = timed("decoder", build_decoder_embedder)
    show(p, "1_Pooling/config.json")
    st = SentenceTransformer(str(p), device="cpu")
    enc = st.preprocess(texts)
    last = enc["attention_mask"].sum(dim=1) - 1
    assert (enc["input_ids"][torch.arange(3), last] == st.tokenizer.eos_token_id).all()
    assert st.tokenizer.padding_side == "right"
    emb = st.encode([*texts, long_text])
    assert emb.shape == (4, HIDDEN) and unit_norm(emb)

    p = timed("roberta", build_roberta_embedder)
    st = SentenceTransformer(str(p), device="cpu")
    assert st.max_seq_length == MAX_LENGTH
    assert len(st.preprocess([long_text])["input_ids"][0]) == MAX_LENGTH
    emb = st.encode([*texts, long_text, long_text + " " + long_text])
    assert emb.shape == (5, HIDDEN) and unit_norm(emb)
    print("self-check OK")


if __name__ == "__main__":
    scratch = Path(tempfile.mkdtemp(prefix="model-factory-"))
    try:
        _self_check(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
