"""An LLM reranker (Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2): a causal LM that
reads an instruction, a query and a document through its chat template and scores relevance
by its answer tokens' logits at the last position: "yes" less "no" (log-odds), or "Yes"
alone. As sentence-transformers' CrossEncoder scores such a folder (Transformer in
text-generation, then LogitScore), and sigmoid-ed as it does.

Recognised by sentence-transformers' own LogitScore module, or, in a bare folder, by a causal
LM whose chat template renders a "query" and a "document" message (what CrossEncoder then
scores with the "yes"/"no" tokens). The instruction is the template's "system" message: the
folder's default prompt, the model spec's `instruction`, or the request's.

Batches are padded on the right: a causal LM's real tokens never attend to the padding after
them, and the graph reads the logits at each row's last real token, so each row's score is
the one it has alone (left padding, as sentence-transformers pads, shifts positions instead).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.errors import ModelLoadError
from infinity_cloud.core.family import Graph, ModelInfo
from infinity_cloud.families.base import Family, TextFacts, text_graph
from infinity_cloud.families.folder import ModelFolder, read_json
from infinity_cloud.text.input_encoder import TextInputEncoder

if TYPE_CHECKING:
    from infinity_cloud.families.base import TowerEncoders
    from infinity_cloud.numerics.inputs import Encoded
    from infinity_cloud.text.tokenization import TextTokenizer

GRAPH = "answer_logits"
_LOGIT_SCORE = "LogitScore"
# The answer tokens CrossEncoder scores a bare causal-LM folder with.
_DEFAULT_ANSWERS = ("yes", "no")
# What a chat template reads content parts with when its messages are structured (a list of
# typed parts) rather than flat (a string): sentence-transformers' own test of a template.
_STRUCTURED = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
# Fillers of the two renders whose common token tail is the template's suffix.
_FILLERS = ("0", "1 2 3 4")
# Template tails kept per encoder, one per instruction (requests may each send their own).
_SUFFIXES_KEPT = 64
_SIGMOID = "torch.nn.modules.activation.Sigmoid"
_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


def is_causal_lm(folder: ModelFolder) -> bool:
    """Whether the folder's model is a causal LM with its head (`*ForCausalLM`, GPT-2's
    `*LMHeadModel`)."""
    return not folder.reads_media and (
        folder.has_architecture("ForCausalLM") or folder.has_architecture("LMHeadModel"))


def chat_template(folder: ModelFolder) -> str | None:
    """The folder's chat template: chat_template.jinja, else the tokenizer config's."""
    path = folder.path / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = folder.tokenizer_config.get("chat_template")
    return template if isinstance(template, str) else None


def renders_pairs(template: str | None) -> bool:
    """Whether a chat template reads a "query" and a "document" message (a reranker's)."""
    return bool(template) and all(re.search(rf"""['"]{role}['"]""", template or "") for role in
                                  ("query", "document"))


def _logit_score(folder: ModelFolder) -> dict[str, Any] | None:
    """The config of the folder's sentence-transformers LogitScore module, if it has one."""
    for module in folder.modules or ():
        if str(module.get("type", "")).rsplit(".", 1)[-1] == _LOGIT_SCORE:
            config = read_json(folder.path / str(module.get("path", "")) / "config.json")
            return config if isinstance(config, dict) else {}
    return None


@dataclass(frozen=True)
class Answers:
    """The answer tokens a score reads: `true_id`'s logit, less `false_id`'s where there is one."""

    true_id: int
    false_id: int | None


@dataclass(frozen=True)
class ChatPairFacts:
    """How an LLM reranker reads a pair: its chat template, its messages' format, the special
    tokens the template names, and its default instruction (None: the template's own)."""

    template: str
    structured: bool
    special_tokens: dict[str, str] = field(default_factory=dict)
    instruction: str | None = None


def _answer_logits(model: Any, feed: dict[str, Any], answers: Answers) -> Any:
    """The answer tokens' logits at each row's last real token (padding is on the right): the
    base model's states there, through the rows of the LM head for the answer tokens only
    (and the head's soft cap, Gemma 2's), as (batch, 1) scores."""
    import torch

    states = model.base_model(input_ids=feed["input_ids"], attention_mask=feed["attention_mask"])
    hidden = states.last_hidden_state
    last = (feed["attention_mask"].sum(dim=1) - 1).clamp(min=0)
    index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
    final = torch.gather(hidden, 1, index).squeeze(1)
    head = model.get_output_embeddings()
    ids = [answers.true_id] + ([] if answers.false_id is None else [answers.false_id])
    logits = final @ head.weight[ids].T
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias[ids]
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    score = logits[:, :1] if answers.false_id is None else logits[:, :1] - logits[:, 1:2]
    return score.float()


def _inputs(model: Any) -> tuple[str, ...]:
    return ("input_ids", "attention_mask")


def answer_graph(answers: Answers) -> Graph:
    return text_graph(GRAPH, "scores", functools.partial(_answer_logits, answers=answers), inputs=_inputs,
                      auto_class="AutoModelForCausalLM")


class LlmReranker(Family):
    """The registry's instance recognises folders; each folder's reading is an instance whose
    graph scores that folder's answer tokens."""

    name = "llm-reranker"

    def __init__(self, answers: Answers | None = None) -> None:
        self.answers = answers
        self.graphs = {GRAPH: answer_graph(answers)} if answers else {}

    def recognises(self, folder: ModelFolder) -> bool:
        if not is_causal_lm(folder):
            return False
        if _logit_score(folder) is not None:
            return True
        return folder.modules is None and folder.pooling is None and renders_pairs(chat_template(folder))

    def read(self, folder: ModelFolder) -> ModelInfo:
        template = chat_template(folder)
        if not renders_pairs(template):
            raise ModelLoadError(
                f"{folder.path.name} ({', '.join(folder.architectures)}) has sentence-transformers' "
                "LogitScore, but no chat template that renders a 'query' and a 'document' message: it cannot "
                "be served as a reranker"
            )
        facts = TextFacts.of(folder)
        info = facts.info(folder, self, capability=Capability.RERANK, towers={"text": GRAPH})
        activation = folder.sentence_transformers_config.get("activation_fn")
        if activation not in (None, _SIGMOID):
            raise ModelLoadError(f"{folder.path.name}: the activation {activation} is not served; rerank "
                                 "answers sigmoid(score), or the score itself with raw_scores")
        own = ChatPairFacts(
            template=str(template), structured=_structured(folder, str(template)),
            special_tokens={name: folder.token(name, "") for name in _SPECIAL_TOKENS
                            if folder.tokenizer_config.get(name)},
            instruction=folder.instruction if folder.instruction is not None else _default_prompt(folder),
        )
        return _replace_family(info, LlmReranker(_answers(folder)), own)

    def encoders(self, info: ModelInfo, tokenizer: TextTokenizer) -> TowerEncoders:
        return {"text": ChatPairEncoder(tokenizer, info.facts(ChatPairFacts))}


def _replace_family(info: ModelInfo, family: LlmReranker, own: ChatPairFacts) -> ModelInfo:
    from dataclasses import replace

    return replace(info, family=family, own_facts=own)


def _answers(folder: ModelFolder) -> Answers:
    config = _logit_score(folder)
    if config is not None and "true_token_id" in config:
        false_id = config.get("false_token_id")
        return Answers(int(config["true_token_id"]), None if false_id is None else int(false_id))
    from tokenizers import Tokenizer  # a bare folder: CrossEncoder's "yes" and "no" tokens

    tokenizer = Tokenizer.from_file(str(folder.path / "tokenizer.json"))
    ids = [tokenizer.token_to_id(token) for token in _DEFAULT_ANSWERS]
    if None in ids:
        raise ModelLoadError(f"{folder.path.name}: its tokenizer has no 'yes' and 'no' tokens to score with, "
                             "and the folder has no LogitScore module that names others")
    return Answers(int(ids[0]), int(ids[1]))  # type: ignore[arg-type]


def _structured(folder: ModelFolder, template: str) -> bool:
    modality = folder.sentence_bert_config.get("modality_config")
    message = modality.get("message") if isinstance(modality, dict) else None
    declared = message.get("format") if isinstance(message, dict) else None
    if declared in ("flat", "structured"):
        return declared == "structured"
    return any(pattern in template for pattern in _STRUCTURED)


def _default_prompt(folder: ModelFolder) -> str | None:
    config = folder.sentence_transformers_config
    prompts, name = config.get("prompts"), config.get("default_prompt_name")
    return str(prompts[name]) if isinstance(prompts, dict) and name in prompts else None


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """The template in a sandbox, with the settings transformers renders chat templates with."""
    import json

    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


class ChatPairEncoder(TextInputEncoder):
    """A pair as the reranker reads it: the instruction, query and document rendered by its
    chat template, tokenized as they are (the template holds the special tokens). A text cut
    at the model's length gets the template's tail back over its last tokens, as
    sentence-transformers restores it: the answer is read after that tail."""

    def __init__(self, tokenizer: TextTokenizer, facts: ChatPairFacts) -> None:
        super().__init__(tokenizer)
        self.facts = facts
        self._template = _compiled(facts.template)
        self._suffixes: dict[str | None, list[int]] = {}

    def _content(self, text: str) -> Any:
        return [{"type": "text", "text": text}] if self.facts.structured else text

    def render(self, query: str, document: str, instruction: str | None) -> str:
        messages = [{"role": "query", "content": self._content(query)},
                    {"role": "document", "content": self._content(document)}]
        if instruction is not None:
            messages.insert(0, {"role": "system", "content": self._content(instruction)})
        return str(self._template.render(messages=messages, add_generation_prompt=False,
                                         **self.facts.special_tokens))

    def _suffix(self, instruction: str | None) -> list[int]:
        """The template's token tail after the content: the common tail of two renders with
        different fillers."""
        if instruction not in self._suffixes:
            if len(self._suffixes) >= _SUFFIXES_KEPT:
                self._suffixes.clear()
            first, second = (self.tokenizer.encode([self.render(f, f, instruction)], False, False)[0].ids
                             for f in _FILLERS)
            count = 0
            for left, right in zip(reversed(first), reversed(second), strict=False):
                if left != right:
                    break
                count += 1
            self._suffixes[instruction] = first[len(first) - count:] if 0 < count < min(
                len(first), len(second)) else []
        return self._suffixes[instruction]

    def encode_pairs(
        self, query: str, documents: Sequence[str], truncate: bool = True, instruction: str | None = None
    ) -> list[Encoded]:
        instruction = self.facts.instruction if instruction is None else instruction
        texts = [self.render(query, document, instruction) for document in documents]
        encoded = self.tokenizer.encode(texts, truncate, special_tokens=False)
        limit = self.tokenizer.max_length
        if any(len(e.ids) >= limit for e in encoded):
            suffix = self._suffix(instruction)[-limit:]
            for e in encoded:
                if len(e.ids) >= limit and suffix:
                    e.ids[-len(suffix):] = suffix
        return encoded
