"""SPLADE: a masked-LM's vocabulary logits as log(1 + relu) term weights, pooled over the
sequence inside the graph (the (batch, length, vocabulary) logits are 120 KB a token and must
not cross into the engine). A sentence-transformers SpladePooling folder, or a bare masked-LM
folder served with `--pooling splade` (as TEI's)."""

from __future__ import annotations

from typing import Any

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import ModelLoadError
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.families import sentence_transformers
from infinity_cloud.families.base import Family, TextFacts, graphs_of, text_graph
from infinity_cloud.families.folder import ModelFolder


def _term_weights(kind: str) -> Any:
    """log(1 + relu(logit)) per vocabulary term, masked, pooled over the sequence
    (sentence-transformers' SpladePooling); `_log1p`: a second log1p (OpenSearch's `log1p_relu`)."""

    def forward(model: Any, feed: dict[str, Any]) -> Any:
        import torch

        logits, mask = model(**feed).logits, feed["attention_mask"]
        weights = torch.log1p(torch.relu(logits * mask.unsqueeze(-1).to(logits.dtype)))
        if kind.endswith("_log1p"):
            weights = torch.log1p(weights)
        return weights.amax(dim=1) if kind.startswith("splade_max") else weights.sum(dim=1)

    return forward


def _logit_bytes(info: ModelInfo) -> int:
    return 4 * int(info.vocab_size or 30_522)  # a float32 logit per vocabulary term


_GRAPHS = [
    text_graph(name, "terms", _term_weights(name), auto_class="AutoModelForMaskedLM",
               token_bytes=_logit_bytes)
    for name in ("splade_max", "splade_sum", "splade_max_log1p", "splade_sum_log1p")
]


class Splade(Family):
    name = "splade"
    graphs = graphs_of(*_GRAPHS)

    def recognises(self, folder: ModelFolder) -> bool:
        if folder.reads_media:
            return False
        return folder.pooling == "splade" or sentence_transformers.head(folder).splade is not None

    def read(self, folder: ModelFolder) -> ModelInfo:
        head = sentence_transformers.head(folder)
        graph = head.splade
        if graph is None:  # a bare masked-LM folder, told to be SPLADE
            if not folder.has_architecture("ForMaskedLM"):
                raise ModelLoadError(
                    f"--pooling splade needs a masked-language model (a *ForMaskedLM architecture); "
                    f"{folder.path.name} is "
                    f"{', '.join(folder.architectures) or folder.model_type or 'another kind'}"
                )
            graph = "splade_max"  # sentence-transformers' default for such a folder
        return TextFacts.of(folder).info(
            folder, self, capability=Capability.SPARSE, towers={"text": graph}, pooling="splade",
            prompts=head.prompts,
        )
