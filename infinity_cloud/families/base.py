"""What a model family declares, once, for everything else to ask (`family.ModelFamily`):
how to recognise its folder, the facts it reads from it (`ModelInfo`, and its own facts in
`ModelInfo.own_facts`), its graphs (what each takes, computes and is exported with:
`family.Graph`) and, per tower, how its inputs are encoded (`encoders`).

Importing a family imports no ML framework: a graph's `forward` and `example` are called only
by what already runs torch (`backends/graphs.py`, `backends/onnx_export.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from infinity_cloud.core.family import Example, Graph, ModelFamily, ModelInfo, Returns, Tower
from infinity_cloud.core.input_kind import InputKind
from infinity_cloud.families.folder import ModelFolder

if TYPE_CHECKING:
    from infinity_cloud.numerics.inputs import InputEncoder
    from infinity_cloud.text.input_encoder import TextInputEncoder
    from infinity_cloud.text.tokenization import TextTokenizer

# Each tower's input encoder, by tower (`Family.encoders`).
TowerEncoders: TypeAlias = "dict[Tower, TextInputEncoder | InputEncoder]"

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
IMAGE_INPUTS = ("pixel_values",)
AUDIO_INPUTS = ("input_features",)


def takes_token_types(model: Any) -> bool:
    """Whether the transformers model reads token type ids (BERT does, RoBERTa does not)."""
    params = inspect.signature(model.forward).parameters
    return "token_type_ids" in params and bool(getattr(model.config, "type_vocab_size", 0))


def text_inputs(model: Any) -> tuple[str, ...]:
    return TEXT_INPUTS if takes_token_types(model) else TEXT_INPUTS[:2]


def padded_text_example(info: ModelInfo, names: tuple[str, ...]) -> Example:
    """Two token rows of different lengths, so that no mask branch is traced as "no padding"."""
    import torch

    ids = torch.full((2, 8), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    tensors = (ids, mask, torch.zeros_like(ids))[: len(names)]
    return tensors, {name: {0: "batch", 1: "sequence"} for name in names}


def pooled(out: Any) -> Any:
    """transformers 5 returns a tower's output object (projected `pooler_output`); older
    versions the tensor itself."""
    return getattr(out, "pooler_output", out)


def text_graph(
    name: str, returns: Returns, forward: Callable[[Any, dict[str, Any]], Any], **options: Any
) -> Graph:
    """A graph that reads tokens: ids, mask, and token types where the model reads them."""
    return Graph(name, returns, forward, **{"inputs": text_inputs, "example": padded_text_example, **options})


TOKEN_STATES = text_graph("token_states", "token_states", lambda model, feed: model(**feed).last_hidden_state,
                          own_onnx=True)
LOGITS = text_graph("logits", "scores", lambda model, feed: model(**feed).logits,
                    auto_class="AutoModelForSequenceClassification", own_onnx=True)


class Family(ModelFamily):
    """A kind of model folder. Subclasses set `name` and `graphs` and implement `recognises`
    and `read`; families whose towers read anything but plain text implement `encoders`."""

    name: ClassVar[str]
    graphs: ClassVar[Mapping[str, Graph]]
    # The kinds of input it reads besides text, each declared once by the family module that
    # introduces it (`input_kind.InputKind`): the wire, the command line, the bulk job,
    # preflight and the images read them from the registry (`families.input_kinds`).
    kinds: ClassVar[tuple[InputKind, ...]] = ()
    # Whether its models rank documents of its kinds (rerank's `modality`), as ColPali's pages.
    ranks: ClassVar[bool] = False

    def recognises(self, folder: ModelFolder) -> bool:
        raise NotImplementedError

    def read(self, folder: ModelFolder) -> ModelInfo:
        raise NotImplementedError

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        """How each tower's inputs become model inputs: here, the text tower's texts through
        the tokenizer, as they are."""
        from infinity_cloud.text.input_encoder import TextInputEncoder

        return {"text": TextInputEncoder(tokenizer)}

    def graph(self, name: str) -> Graph:
        return self.graphs[name]

    def __repr__(self) -> str:
        return f"<family {self.name}>"


def graphs_of(*graphs: Graph) -> dict[str, Graph]:
    return {graph.name: graph for graph in graphs}


def max_length(folder: ModelFolder, config: Mapping[str, Any]) -> int:
    """The longest input: the position table (less RoBERTa's padding offset), and
    sentence-transformers' max_seq_length or else the tokenizer's limit."""
    positions = int(config.get("max_position_embeddings") or 0)
    if config.get("model_type") in {"roberta", "xlm-roberta", "camembert", "longformer"}:
        positions -= 2  # these offset positions by the padding index
    candidates = [positions] if positions > 0 else []
    st_limit = folder.sentence_bert_config.get("max_seq_length")
    limit = folder.tokenizer_config.get("model_max_length")
    if st_limit:
        candidates.append(int(st_limit))
    elif isinstance(limit, int | float) and limit < 1e6:
        candidates.append(int(limit))  # transformers writes a huge sentinel for "no limit"
    return min(candidates) if candidates else 512


@dataclass(frozen=True)
class TextFacts:
    """What every text model's ModelInfo starts from (its config, or its text config)."""

    max_length: int
    hidden_size: int
    vocab_size: int | None
    pad_token: str | None

    @classmethod
    def of(cls, folder: ModelFolder) -> TextFacts:
        config = folder.config
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        return cls(
            max_length=max_length(folder, config),
            hidden_size=int(text.get("hidden_size") or text.get("d_model") or text.get("dim") or 0),
            vocab_size=text.get("vocab_size"),
            pad_token=folder.pad_token,
        )

    def info(self, folder: ModelFolder, family: Family, **facts: Any) -> ModelInfo:
        return ModelInfo(
            path=folder.path, family=family, model_type=folder.model_type,
            architectures=folder.architectures, max_length=self.max_length, hidden_size=self.hidden_size,
            vocab_size=self.vocab_size, pad_token=self.pad_token, raw=folder.config, **facts,
        )
