"""A text encoder (BERT, MiniLM, bge, e5, a decoder read to one vector): token states pooled
into one vector, through the folder's Dense layers, normalised if it says so. The family of
any text folder no other family claims, unless the folder says it is something else: a bare
folder (no sentence-transformers pooling, no `--pooling`) whose architecture is a head of
another task (a causal LM, a seq2seq LM, token classification...) or no architecture known
here is not read as an embedder, with no warning; `read_model_info` refuses it, naming why."""

from __future__ import annotations

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families import sentence_transformers
from infinity_cloud.families.base import TOKEN_STATES, Family, TextFacts, graphs_of
from infinity_cloud.families.folder import ModelFolder

# What a bare folder's architecture may end with to be served as an embedder: a base model,
# or a masked LM's or pre-training head over one (the states pooled are the base model's).
_EMBEDDER_ARCHITECTURES = ("Model", "ForMaskedLM", "ForPreTraining")


def unserved_reason(folder: ModelFolder) -> str:
    """Why a text folder is not read as an embedder: a head of another task, or an
    architecture not known here ("" where it is read as one)."""
    if folder.modules is not None or folder.pooling is not None or "auto_map" in folder.config:
        return ""  # pooled as its sentence-transformers modules, or the caller, say; or its own code's
    others = [a for a in folder.architectures if not a.endswith(_EMBEDDER_ARCHITECTURES)]
    if not others:
        return ""
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in others):
        return ("a causal LM is served as a reranker only with sentence-transformers' LogitScore module or a "
                "chat template that renders a 'query' and a 'document' message, and as an embedder only with "
                "sentence-transformers' pooling or --pooling")
    return ("a head of another task, or an architecture not known here; an embedder's folder names a base "
            "model (*Model), or has sentence-transformers' pooling, or is served with --pooling")


class TextEncoder(Family):
    name = "text-encoder"
    graphs = graphs_of(TOKEN_STATES)

    def recognises(self, folder: ModelFolder) -> bool:
        return not folder.reads_media and not unserved_reason(folder)

    def read(self, folder: ModelFolder) -> ModelInfo:
        head = sentence_transformers.head(folder)
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.EMBED, pooling=head.pooling or "mean",
            normalize=head.normalize, dense=head.dense, prompts=head.prompts,
        )
