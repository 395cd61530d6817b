"""Each capability's task, one instance each (tasks hold no state)."""

from __future__ import annotations

from typing import Any

from infinity_cloud.core.capability import Capability
from infinity_cloud.tasks.base import Task
from infinity_cloud.tasks.classify import ClassifyTask
from infinity_cloud.tasks.embed import EmbedTask
from infinity_cloud.tasks.multi_vector import MultiVectorTask
from infinity_cloud.tasks.rerank import RerankTask
from infinity_cloud.tasks.sparse import SparseEmbedTask

TASKS: dict[Capability, Task[Any, Any]] = {
    task.capability: task
    for task in (EmbedTask(), RerankTask(), ClassifyTask(), SparseEmbedTask(), MultiVectorTask())
}


def task_for(capability: Capability) -> Task[Any, Any]:
    return TASKS[capability]
