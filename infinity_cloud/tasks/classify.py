"""Classification: texts to their labels' scores, best first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from infinity_cloud.admission.validation import check_texts
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.results import ClassifyResult
from infinity_cloud.numerics.heads import FINAL, Head
from infinity_cloud.numerics.inputs import Encoded
from infinity_cloud.tasks.base import Cost, Task, prompt_tokens, text_cost
from infinity_cloud.tasks.scores import label_scores, softmax

if TYPE_CHECKING:
    from infinity_cloud.tasks.base import Served


@dataclass(frozen=True)
class ClassifyCall:
    inputs: Sequence[str]
    raw_scores: bool = False
    truncate: bool = True


class ClassifyTask(Task[ClassifyCall, ClassifyResult]):
    capability = Capability.CLASSIFY
    fidelity = "scores"  # an order and its scores

    def head(self, info: ModelInfo, graph: GraphOutput, pooling: str, normalize: bool) -> Head:
        return FINAL

    def check(self, call: ClassifyCall, served: Served, limits: LimitsSpec) -> None:
        super().check(call, served, limits)
        check_texts(call.inputs, limits)

    def cost(self, call: ClassifyCall, served: Served) -> Cost:
        labels = len(served.loaded.info.labels)
        return text_cost(call.inputs, served.loaded.tokenizer.max_length).answering(
            len(call.inputs) * labels, items=len(call.inputs) * labels)

    def encode(
        self, call: ClassifyCall, served: Served, limits: LimitsSpec
    ) -> list[Encoded]:
        return served.loaded.tokenizer.encode(list(call.inputs), call.truncate)

    def finish(
        self, rows: list[np.ndarray], call: ClassifyCall, served: Served, encodings: list[Encoded]
    ) -> ClassifyResult:
        logits = np.stack(rows)
        scores = logits if call.raw_scores else softmax(logits)
        labels = [label_scores(row, served.loaded.info.labels) for row in scores]
        return ClassifyResult(served.name, labels, prompt_tokens(encodings))
