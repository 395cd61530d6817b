"""Multi-vector embedding (ColPali): a query's tokens, or a page image's, each to a vector,
for late-interaction scoring (`scores.maxsim`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from infinity_cloud.capability import Capability
from infinity_cloud.config import LimitsSpec
from infinity_cloud.errors import UnsupportedError
from infinity_cloud.model_files import GraphOutput, ModelInfo, Tower
from infinity_cloud.results import MultiVectorResult
from infinity_cloud.tasks.base import Task, prompt_tokens
from infinity_cloud.tasks.heads import Head, passthrough_head
from infinity_cloud.validation import check_media, check_texts

if TYPE_CHECKING:
    from infinity_cloud.served_model import ServedModel


@dataclass(frozen=True)
class MultiVectorCall:
    inputs: Sequence[str]  # texts (queries), or image URLs / data URIs (pages)
    modality: Tower = "text"
    truncate: bool = True


def templated(info: ModelInfo, name: str, texts: Sequence[str]) -> list[str]:
    """Each text inside the model's template `name` ("{}" marks the text); as is without one."""
    template = info.templates.get(name)
    return list(texts) if template is None else [template.replace("{}", text) for text in texts]


class MultiVectorTask(Task[MultiVectorCall, MultiVectorResult]):
    capability = Capability.MULTI_VECTOR

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        return passthrough_head  # the graph normalises each token and zeroes the padding

    def rows(self, batch: np.ndarray, mask: np.ndarray | None) -> list[np.ndarray]:
        """Each input's real tokens' vectors (padding dropped)."""
        lengths = mask.sum(axis=1) if mask is not None else [batch.shape[1]] * len(batch)
        return [np.ascontiguousarray(row[: int(n)]) for row, n in zip(batch, lengths, strict=True)]

    def check(self, call: MultiVectorCall, served: ServedModel, limits: LimitsSpec) -> None:
        towers = served.require(self.capability).towers
        if call.modality not in towers:
            raise UnsupportedError(
                f"model {served.name!r} reads {' and '.join(towers)}; modality {call.modality!r} is not "
                "supported by it",
                param="modality",
            )
        if call.modality == "text":
            check_texts(call.inputs, limits)
        else:
            check_media(call.inputs, limits)

    def media(self, call: MultiVectorCall) -> Sequence[str]:
        return () if call.modality == "text" else call.inputs

    def tower(self, call: MultiVectorCall) -> Tower:
        return call.modality

    def encode(
        self, call: MultiVectorCall, served: ServedModel, limits: LimitsSpec, media: Sequence[bytes]
    ) -> list[Any]:
        loaded = served.loaded
        if call.modality != "text":
            preprocessor = loaded.media[call.modality]  # checked: the model has that tower
            return [preprocessor.prepare(data, index) for index, data in enumerate(media)]
        texts = templated(loaded.info, "query", call.inputs)
        own_specials = "query" not in loaded.info.templates  # a template writes them itself
        return loaded.tokenizer.encode(texts, call.truncate, special_tokens=own_specials)

    def finish(
        self, rows: list[np.ndarray], call: MultiVectorCall, served: ServedModel, encodings: list[Any]
    ) -> MultiVectorResult:
        return MultiVectorResult(served.name, rows, prompt_tokens(encodings))
