"""Model families: each module says how to recognise one kind of model folder, what it reads
from it (the facts every model has, and its own, `ModelInfo.own_facts`), its graphs, and how
each tower's inputs are encoded (`base.Family`). `FAMILIES` is the registry, asked in order:
the first family that recognises a folder reads it. Nothing else branches on a family or a
graph's name, nor reads a family's own facts; it asks `ModelInfo.family`.

Adding a family, even one whose inputs are of a new kind: a module here, and its line in
`FAMILIES` (before any family that would claim its folders too). A new kind of input is an
`input_kind.InputKind` in the family's `kinds`: `input_kinds()` reads every family's, and the
wire, the command line, the bulk job, preflight and the images read the kinds from it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from infinity_cloud.core.errors import UnsupportedError
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.core.input_kind import InputKinds
from infinity_cloud.families.base import Family
from infinity_cloud.families.bge_m3 import BgeM3
from infinity_cloud.families.bidirectional_decoder import BidirectionalDecoder
from infinity_cloud.families.clap import Clap
from infinity_cloud.families.classifier import Classifier
from infinity_cloud.families.clip import Clip
from infinity_cloud.families.colbert import ColBert
from infinity_cloud.families.colpali import ColPali
from infinity_cloud.families.colqwen2 import ColQwen2
from infinity_cloud.families.cross_encoder import CrossEncoder
from infinity_cloud.families.folder import ModelFolder
from infinity_cloud.families.llm_reranker import LlmReranker
from infinity_cloud.families.siglip import Siglip
from infinity_cloud.families.splade import Splade
from infinity_cloud.families.text_encoder import TextEncoder, unserved_reason

FAMILIES: list[Family] = [
    ColPali(), ColQwen2(), Clap(), Clip(), Siglip(),  # recognised by their model type
    CrossEncoder(), Classifier(),  # *ForSequenceClassification
    LlmReranker(),  # *ForCausalLM with sentence-transformers' LogitScore, or a query/document template
    BgeM3(),  # FlagEmbedding's heads beside the encoder
    Splade(), ColBert(),  # sentence-transformers heads
    BidirectionalDecoder(),  # a decoder read both ways (EmbeddingGemma)
    TextEncoder(),  # any other text folder
]


def read_model_info(path: Path, pooling: str | None = None, instruction: str | None = None) -> ModelInfo:
    """What the model in `path` is: the first family that recognises its folder reads it.
    `pooling` is the caller's override; "splade" serves a bare masked-LM folder as SPLADE,
    as TEI's `--pooling splade` does. `instruction`: the caller's default for a model that
    reads one (an LLM reranker)."""
    folder = ModelFolder(path, pooling, instruction)
    family = next((f for f in FAMILIES if f.recognises(folder)), None)
    if family is None and not folder.reads_media:
        # A text folder no family serves as what it is (a causal LM without a reranker's
        # template, a head of another task): refused, not read as an embedder.
        raise UnsupportedError(
            f"{path.name}: architecture {', '.join(folder.architectures)} is not served as any family here "
            f"({unserved_reason(folder)}); the families served are {', '.join(f.name for f in FAMILIES)}"
        )
    if family is None:
        served = sorted(f.name for f in FAMILIES if f.kinds)
        kinds = " and ".join(name for name in input_kinds().names if name != "text")
        raise UnsupportedError(
            f"{path.name} is a {folder.model_type or 'multimodal'} model; {kinds} models served "
            f"are {', '.join(served)}"
        )
    return family.read(folder)


def input_kinds(families: Sequence[Family] | None = None, *, ranked: bool = False) -> InputKinds:
    """The kinds of input served: text, and each kind a family of `families` (the registry,
    `FAMILIES`, as it is now) declares; `ranked`: those a family that ranks documents reads."""
    return _kinds_of(tuple(FAMILIES if families is None else families), ranked)


@functools.lru_cache(maxsize=16)
def _kinds_of(families: tuple[Family, ...], ranked: bool) -> InputKinds:
    """Made once per registry (every request's kind is checked against it)."""
    return InputKinds(kind for family in families if family.ranks or not ranked for kind in family.kinds)


__all__ = ["FAMILIES", "Family", "ModelFolder", "input_kinds", "read_model_info"]
